"""Build a model with random weights from a seed, and save/load it as config.json + model.safetensors."""

from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from rooftop.engine.model.config import ModelConfig
from rooftop.engine.model.model import DSAModel


def default_dtype(device: str | torch.device) -> torch.dtype:
    """float32 on CPU, bfloat16 on CUDA."""
    return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32


def _empty_model(config: ModelConfig, device: str | torch.device, dtype: torch.dtype) -> DSAModel:
    # Built on the device itself (not meta): meta needs a slow first-time import, and the default
    # init it skips is cheap next to the weights we draw or load over it.
    with torch.device(device):
        model = DSAModel(config)
    return model.to(dtype).eval()


def random_model(
    config: ModelConfig, seed: int = 0, device: str | torch.device = "cpu", dtype: torch.dtype | None = None
) -> DSAModel:
    """A model whose weights are drawn from `seed`.

    On the CPU the draw is the same everywhere. On a GPU the weights are drawn there, by its own
    generator: drawing the 2B `small` preset on the CPU takes 13.4 s on a 2-core machine, before
    the copy. The GPU draw gives the same values for the same seed on the same kind of GPU, as the
    workers of one PD deployment have, but not the CPU's values.
    """
    model = _empty_model(config, device, dtype or default_dtype(device))
    on_gpu = torch.device(device).type == "cuda"
    gen = torch.Generator(device=device if on_gpu else "cpu").manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:  # norm weights
                p.fill_(1.0)
                continue
            # Unit-variance embeddings; 1/sqrt(fan_in) elsewhere keeps activations O(1) at any width.
            std = 1.0 if name == "embedding.weight" else p.shape[-1] ** -0.5
            if on_gpu:
                p.normal_(0.0, std, generator=gen)
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * std)
    return model


def save_model(model: DSAModel, path: str | Path) -> None:
    """Write `config.json` and `model.safetensors` into directory `path` (created if missing)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.config.to_json(path / "config.json")
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight")
    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})


def load_model(path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype | None = None) -> DSAModel:
    """Read a model saved by `save_model` (or any dir with a matching config.json + model.safetensors)."""
    path = Path(path)
    for name in ("config.json", "model.safetensors"):
        if not (path / name).is_file():
            raise FileNotFoundError(f"{path / name} not found: --model needs a dir with config.json and model.safetensors")
    config = ModelConfig.from_json(path / "config.json")
    model = _empty_model(config, device, dtype or default_dtype(device))
    state = load_file(str(path / "model.safetensors"), device="cpu")
    if config.tie_word_embeddings:
        state["lm_head.weight"] = state["embedding.weight"]
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(f"{path}: weights do not match config.json (missing {missing}, unexpected {unexpected})")
    return model
