"""The model: config and presets, the paged forward (`DSAModel`), weights, and a plain reference."""
