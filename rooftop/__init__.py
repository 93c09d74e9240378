"""rooftop: find and document the ceiling of an LLM serving deployment."""

__version__ = "0.1.0"
