"""Ray job entrypoint: answer a handful of questions with a model streamed from S3, write Parquet.

Submitted with the Ray Jobs CLI (see README.md beside this file):

    ray job submit --address http://127.0.0.1:8265 \\
        --runtime-env examples/job_submission/runtime_env.yaml \\
        -- python entrypoint.py s3://models/SmolLM2-135M-Instruct/ /shared/results

The store settings come from the environment, which the job's runtime_env
``env_vars`` give to this driver and to every actor of the job, the standard AWS
way: ``AWS_ENDPOINT_URL`` (omit for AWS S3), ``AWS_REGION``, ``AWS_ACCESS_KEY_ID``
and ``AWS_SECRET_ACCESS_KEY`` (omit both to use instance roles or profiles).
``--endpoint-url`` and ``--region`` give the first two as arguments instead; the
library then delivers them to every actor (an ``ObjectStoreConfig``). Give each
setting in one place: Ray refuses a job whose driver sets a variable that the
job's runtime_env sets too. The keys are read from the environment only, so they
never appear in the job's entrypoint.

Output: Parquet files (columns question, answer, num_generated_tokens) in
OUTPUT_DIR, which must be reachable from every node (a shared file system or an
``s3://`` URI) on a multi-node cluster. The last line printed is ``ROWS <n>``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from typing import Any

QUESTIONS: list[str] = [
    "What is 2+2?",
    "Name three primary colors.",
    "What is the capital of France?",
    "How many legs does a spider have?",
    "Say hello in French.",
]
ENGINE_KWARGS: dict[str, Any] = {
    "load_format": "runai_streamer",  # stream the safetensors from the store, no local copy
    "enforce_eager": True,
    "dtype": "bfloat16",
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "model_uri",
        nargs="?",
        default=os.environ.get("RSL_MODEL_URI"),
        help="model directory in object storage, e.g. s3://models/SmolLM2-135M-"
        "Instruct/ (default: $RSL_MODEL_URI)",
    )
    parser.add_argument(
        "output_dir",
        nargs="?",
        default=os.environ.get("RSL_OUTPUT_DIR"),
        help="where to write the Parquet results: an absolute path or an "
        "s3:// URI (default: $RSL_OUTPUT_DIR)",
    )
    parser.add_argument(
        "--endpoint-url",
        help="S3 endpoint of an S3-compatible store, when the environment has no AWS_ENDPOINT_URL",
    )
    parser.add_argument("--region", help="store region, when the environment has no AWS_REGION")
    parser.add_argument("--max-tokens", type=int, default=32, help="tokens to generate per answer")
    parser.add_argument("--batch-size", type=int, default=8)
    args = parser.parse_args(argv)
    if not args.model_uri or not args.output_dir:
        parser.error("give MODEL_URI and OUTPUT_DIR (or $RSL_MODEL_URI and $RSL_OUTPUT_DIR)")
    return args


def _placeholders(values: dict[str, str | None]) -> list[str]:
    """Names whose value still holds a runtime_env.yaml placeholder such as ``<access-key-id>``."""
    return [name for name, value in values.items() if value and re.search(r"<[^<>]+>", value)]


def _job_env_vars() -> dict[str, str]:
    """The env_vars of the Ray job's runtime_env (empty when not run as a job)."""
    config = json.loads(os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR") or "{}")
    return dict((config.get("runtime_env") or {}).get("env_vars") or {})


def object_store_from(args: argparse.Namespace) -> Any:
    """The store settings given as arguments, as an ``ObjectStoreConfig``; None when there
    are none: the environment then is all there is (every process reads it)."""
    from ray_stream_llm import ObjectStoreConfig
    from ray_stream_llm.stores.settings import derive_settings

    names = ("AWS_ENDPOINT_URL", "AWS_REGION", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
    unfilled = _placeholders({name: os.environ.get(name) for name in names})
    if unfilled:
        sys.exit(
            f"entrypoint.py: {', '.join(unfilled)} still hold the runtime_env.yaml "
            "placeholder: fill in the real values"
        )
    if not (args.endpoint_url or args.region):
        return None
    store = ObjectStoreConfig(endpoint_url=args.endpoint_url, region_name=args.region)
    twice = sorted(set(derive_settings(store).env) & set(_job_env_vars()))
    if twice:
        sys.exit(
            f"entrypoint.py: --endpoint-url/--region set {', '.join(twice)}, which the "
            "job's runtime_env sets too; give each setting in one place"
        )
    return store


def _output_path(output_dir: str) -> str:
    if "://" in output_dir:
        return output_dir
    # the job runs in a copy of working_dir that Ray deletes: never write relative to it
    return os.path.abspath(os.path.expanduser(output_dir))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import ray

    import ray_stream_llm
    from ray_stream_llm import (
        RayStreamLLMError,
        StreamingvLLMEngineProcessorConfig,
        build_llm_processor,
        load_reports,
    )

    print(f"ray_stream_llm {ray_stream_llm.__version__} from {ray_stream_llm.__file__}")

    output = _output_path(args.output_dir)
    store = object_store_from(args)
    max_tokens = args.max_tokens

    # In a Ray job this connects to the job's cluster (RAY_ADDRESS is set by Ray);
    # run directly, it starts a local cluster.
    ray.init()
    config = StreamingvLLMEngineProcessorConfig(
        model_source=args.model_uri,
        engine_kwargs=dict(ENGINE_KWARGS),
        batch_size=args.batch_size,
        concurrency=1,
        object_store=store,
    )
    try:
        processor = build_llm_processor(
            config,
            preprocess=lambda row: dict(
                messages=[{"role": "user", "content": row["question"]}],
                sampling_params=dict(temperature=0.0, max_tokens=max_tokens),
            ),
            postprocess=lambda row: dict(
                question=row["question"],
                answer=row["generated_text"],
                num_generated_tokens=int(row.get("num_generated_tokens") or 0),
            ),
        )
    except RayStreamLLMError as exc:  # a bad input, caught before any actor starts
        sys.exit(f"entrypoint.py: {type(exc).__name__}: {exc}")
    results = processor(ray.data.from_items([{"question": q} for q in QUESTIONS])).materialize()
    for report in load_reports():  # the streamer's figures, measured in vLLM's processes
        print(
            f"LOAD weight_bytes={report.weight_bytes} "
            f"streamed_tensor_bytes={report.streamed_tensor_bytes}"
        )
    for row in results.take_all():
        print(f"{row['question']!r} -> {row['answer']!r}")
    results.write_parquet(output)
    rows = results.count()
    print(f"wrote {rows} rows to {output}")
    print(f"ROWS {rows}", flush=True)
    return 0 if rows == len(QUESTIONS) else 1


if __name__ == "__main__":  # vLLM spawns processes: keep the guard
    sys.exit(main())
