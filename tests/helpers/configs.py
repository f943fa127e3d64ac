"""A streaming config with placeholders, for the builder's decisions that need no store
(tests/unit/integrations/ray/test_builder.py, tests/integration/test_engine_nodes.py)."""

from __future__ import annotations

from ray_stream_llm.config import StreamingvLLMEngineProcessorConfig

STREAM = {"load_format": "runai_streamer"}


def stream_config(**fields) -> StreamingvLLMEngineProcessorConfig:
    return StreamingvLLMEngineProcessorConfig(
        model_source="s3://models/m/", engine_kwargs=dict(STREAM), concurrency=2, **fields
    )
