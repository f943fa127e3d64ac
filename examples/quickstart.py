"""Quickstart: stream a model's weights from object storage into vLLM engines in a Ray
Data job. The README's quickstart program, line for line.

The store is reached the standard AWS way, from the environment; with the local store
(`ray-stream-llm local-store`) that is `source ~/.cache/ray_stream_llm/local-store/env.sh`.
For another store set AWS_ENDPOINT_URL (omit for AWS S3), AWS_ACCESS_KEY_ID,
AWS_SECRET_ACCESS_KEY and AWS_REGION, or give object_store=ObjectStoreConfig(...) in the
config.
"""

import ray
from ray.data.llm import build_processor

from ray_stream_llm import StreamingvLLMEngineProcessorConfig

config = StreamingvLLMEngineProcessorConfig(
    model_source="s3://models/SmolLM2-135M-Instruct/",
    engine_kwargs={"load_format": "runai_streamer"},
    batch_size=8,
    concurrency=1,
)
processor = build_processor(  # ray_stream_llm.build_llm_processor for code written for Ray <= 2.54
    config,
    preprocess=lambda row: dict(
        messages=[{"role": "user", "content": row["question"]}],
        sampling_params=dict(temperature=0.0, max_tokens=32),
    ),
    postprocess=lambda row: dict(question=row["question"], answer=row["generated_text"]),
)
ds = processor(ray.data.from_items([{"question": "What is 2+2?"}]))
print(ds.take_all())
