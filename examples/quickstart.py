"""Quickstart: stream a model's weights from S3 into vLLM engines in a Ray Data job.

The same code as the README's first snippet, with the model URI from the command line.
The store is reached the standard AWS way, from the environment (or give
object_store=ObjectStoreConfig(...) in the config):
    export AWS_ENDPOINT_URL=http://127.0.0.1:9000   # omit for AWS S3
    export AWS_ACCESS_KEY_ID=... AWS_SECRET_ACCESS_KEY=... AWS_REGION=us-east-1
    python examples/quickstart.py s3://models/SmolLM2-135M-Instruct/
"""

import sys

import ray

from ray_stream_llm import StreamingvLLMEngineProcessorConfig, build_llm_processor


def main(model_uri: str) -> None:
    config = StreamingvLLMEngineProcessorConfig(
        model_source=model_uri,
        engine_kwargs={"load_format": "runai_streamer"},
        batch_size=8,
        concurrency=1,
    )
    processor = build_llm_processor(  # or Ray's own ray.data.llm.build_processor
        config,
        preprocess=lambda row: dict(
            messages=[{"role": "user", "content": row["question"]}],
            sampling_params=dict(temperature=0.0, max_tokens=32),
        ),
        postprocess=lambda row: dict(question=row["question"], answer=row["generated_text"]),
    )
    ds = processor(ray.data.from_items([{"question": "What is 2+2?"}]))
    print(ds.take_all())


if __name__ == "__main__":  # vLLM spawns processes: keep the guard
    main(sys.argv[1])
