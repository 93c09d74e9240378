"""Hardware: accelerator spec table, topology discovery, CPU pinning."""

from rooftop.hardware.specs import GPUSpec, gpu_spec, known_names

__all__ = ["GPUSpec", "gpu_spec", "known_names"]
