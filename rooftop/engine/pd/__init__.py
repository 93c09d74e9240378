"""Prefill/decode disaggregation of the embedded engine: KV transfer over TCP, the two roles, the router."""
