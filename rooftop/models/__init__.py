"""Model directories without downloads: config.json of a real architecture at a small size, and a
printable-ASCII tokenizer, for engines that load random weights (`vllm serve DIR --load-format dummy`)."""

from rooftop.models.modeldir import ARCHS, PRESETS, init_model_dir, model_config

__all__ = ["ARCHS", "PRESETS", "init_model_dir", "model_config"]
