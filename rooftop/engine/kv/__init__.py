"""Paged KV cache: per-layer latent rows and indexer keys, addressed by block tables."""
