"""The embedded engine: a compact DeepSeek-V3.2-style model served over an OpenAI-compatible API.

Stands alone: nothing here imports the rest of rooftop.
"""
