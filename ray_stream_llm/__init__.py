"""Streaming vLLM weights from object storage in Ray Data LLM."""
