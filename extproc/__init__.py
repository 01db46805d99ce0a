"""LLM traffic brain for Envoy: an ext_proc service for OpenAI-style traffic to vLLM pools."""

__version__ = "0.1.0"
