"""Quickstart: stream a model's weights from S3 into vLLM engines in a Ray Data job.

Set the store in the environment of the driver (Ray passes it to local actors;
on a multi-node cluster put the same variables in the job's runtime_env):
    export AWS_ENDPOINT_URL=http://127.0.0.1:9000   # omit for AWS S3
    export AWS_ACCESS_KEY_ID=... AWS_SECRET_ACCESS_KEY=... AWS_REGION=us-east-1
    export RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING=0   # S3-compatible stores (path style)
    python examples/quickstart.py s3://models/SmolLM2-135M-Instruct/
"""

import sys

import ray

from ray_stream_llm import StreamingvLLMEngineProcessorConfig, build_llm_processor


def main(model_uri: str) -> None:
    config = StreamingvLLMEngineProcessorConfig(
        model_source=model_uri,
        engine_kwargs={"load_format": "runai_streamer", "enforce_eager": True},
        batch_size=8,
        concurrency=1,
    )
    processor = build_llm_processor(
        config,
        preprocess=lambda row: dict(
            messages=[{"role": "user", "content": row["question"]}],
            sampling_params=dict(temperature=0.0, max_tokens=32),
        ),
        postprocess=lambda row: dict(question=row["question"], answer=row["generated_text"]),
    )
    ds = ray.data.from_items([{"question": "What is 2+2?"}, {"question": "Name a primary color."}])
    for row in processor(ds).take_all():
        print(row["question"], "->", row["answer"])


if __name__ == "__main__":  # vLLM spawns processes: keep the guard
    main(sys.argv[1])
