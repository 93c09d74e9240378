"""The paged KV cache: per layer, latent rows (for sparse MLA) and index keys (for the indexer)."""

import torch

from rooftop.engine.model.config import ModelConfig


class KVCache:
    """Per-layer `latent[l]: [num_blocks, block_size, kv_lora_rank + qk_rope_head_dim]` and
    `index_k[l]: [num_blocks, block_size, index_head_dim]`, in the model's dtype. `num_layers` (default: the
    model's) may be more: speculation with MTP gives each MTP module the layer after the model's."""

    def __init__(
        self,
        config: ModelConfig,
        num_blocks: int,
        block_size: int = 64,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
        num_layers: int | None = None,
    ):
        num_layers = config.num_hidden_layers if num_layers is None else num_layers
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.dtype = dtype
        self.device = torch.device(device)
        # Zeros, not empty: invalid block ids are clamped to block 0 and read before masking.
        self.latent = [
            torch.zeros(num_blocks, block_size, config.kv_cache_dim, dtype=dtype, device=device)
            for _ in range(num_layers)
        ]
        self.index_k = [
            torch.zeros(num_blocks, block_size, config.index_head_dim, dtype=dtype, device=device)
            for _ in range(num_layers)
        ]

    @property
    def num_tokens(self) -> int:
        """Token slots in the cache."""
        return self.num_blocks * self.block_size

    @staticmethod
    def bytes_per_token(config: ModelConfig, dtype: torch.dtype, num_layers: int | None = None) -> int:
        """Bytes one cached token takes over all layers (latent + rope + index key)."""
        per_layer = config.kv_cache_dim + config.index_head_dim
        num_layers = config.num_hidden_layers if num_layers is None else num_layers
        return per_layer * num_layers * torch.empty(0, dtype=dtype).element_size()

    @staticmethod
    def blocks_for_bytes(config: ModelConfig, block_size: int, dtype: torch.dtype, budget_bytes: int,
                         num_layers: int | None = None) -> int:
        """How many blocks fit in `budget_bytes`."""
        return budget_bytes // (KVCache.bytes_per_token(config, dtype, num_layers) * block_size)

    @property
    def nbytes(self) -> int:
        """Bytes held by all cache tensors."""
        return sum(t.numel() * t.element_size() for t in self.latent + self.index_k)
