"""Release test: tensor-parallel engines streamed (``runai_streamer``: every rank reads the
whole checkpoint) vs pre-sharded (``runai_streamer_sharded`` over the output of
``ray-stream-llm shard``: each rank reads its own files), same model, same store, one run.

Per format: rows answered, the bytes the store served to the engines (per rank, from the
load reports; from the local store's byte proxy in the CPU variant) as a multiple of the
model, and the weight phase seconds (the slowest rank's streamer, first request to last
tensor) against thresholds from the environment:

* ``RSL_BENCH_MAX_STREAMED_WEIGHT_SECONDS`` / ``RSL_BENCH_MAX_SHARDED_WEIGHT_SECONDS``:
  Ray's published 8xH100 figures (doc/source/serve/llm/user-guides/model-loading.md:
  Llama-70B TP4 91.9 s streamed from S3, 24.98 s pre-sharded; Qwen-235B TP8 573 s,
  75.4 s) are the thresholds to beat;
* ``RSL_BENCH_MAX_SHARDED_STORE_X`` (pre-sharded: about 1.0x the model) and
  ``RSL_BENCH_MIN_STREAMED_STORE_X`` (streamed: about TP x the model).

GPU: ``RSL_RELEASE_MODEL_URI`` (an s3:// model), ``RSL_RELEASE_TP``, and optionally
``RSL_RELEASE_SHARDED_URI`` (default ``<model>-tp<N>/``; written by ``shard`` when not
complete there). CPU (no ``RSL_RELEASE_MODEL_URI``): the local store's generated 1 GiB
model at TP=2 (vLLM's CPU build, ``VLLM_CPU_OMP_THREADS_BIND=nobind``).
Run: ``pytest release/benchmarks/sharded_tp.py`` or ``python release/benchmarks/sharded_tp.py``.
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import RESULTS, bench_store, engine_kwargs

from ray_stream_llm.commands.shard import shard_model
from ray_stream_llm.tools import bench
from ray_stream_llm.tools.shard_bench import side_by_side, summary


def _limit(name):
    value = os.environ.get(name)
    return float(value) if value else None


def thresholds(rows, tp):
    """The missed thresholds, each as one line."""
    failures = []
    checks = [
        ("runai_streamer", "weight_seconds", "RSL_BENCH_MAX_STREAMED_WEIGHT_SECONDS", max),
        ("runai_streamer_sharded", "weight_seconds", "RSL_BENCH_MAX_SHARDED_WEIGHT_SECONDS", max),
        ("runai_streamer_sharded", "x_model", "RSL_BENCH_MAX_SHARDED_STORE_X", max),
        ("runai_streamer", "x_model", "RSL_BENCH_MIN_STREAMED_STORE_X", min),
    ]
    for load_format, key, env, kind in checks:
        limit, value = _limit(env), rows[load_format][key]
        if limit is None:
            continue
        if value is None or (value > limit if kind is max else value < limit):
            failures.append(f"{load_format} {key} = {value} ({env} = {limit}, TP={tp})")
    return failures


def run():
    tp = int(os.environ.get("RSL_RELEASE_TP", "2"))
    with bench_store() as (store, workdir):
        sharded = os.environ.get("RSL_RELEASE_SHARDED_URI") or (
            store.model_uri.rstrip("/") + f"-tp{tp}/"
        )
        written = shard_model(store.model_uri, tp, sharded, engine_kwargs=engine_kwargs())
        gpu = bool(os.environ.get("RSL_RELEASE_MODEL_URI"))
        result = side_by_side(
            store.model_uri,
            sharded,
            tp,
            workdir / "jobs",
            env=dict(store.env),
            engine_kwargs=engine_kwargs(),
            num_cpus=None if gpu else 2 * tp,
        )
    rows = summary(result, store.model_bytes)
    out = {
        "tensor_parallel_size": tp,
        "model_uri": store.model_uri,
        "model_bytes": store.model_bytes,
        "shard": written.to_dict(),
        "side_by_side": rows,
        "environment": bench.environment(store),
    }
    RESULTS.mkdir(exist_ok=True)
    path = os.environ.get(bench.OUTPUT_ENV) or RESULTS / f"sharded_tp{tp}.json"
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
    for load_format, row in rows.items():
        print(
            f"{load_format:>24}: {row['rows']} rows, store {row['store_bytes']} bytes "
            f"({row['x_model']:.2f}x the model), weight phase {row['weight_seconds']:.2f}s"
        )
    print(f"results: {path}")
    for job in result["jobs"].values():
        assert job["rows"] == len(job["answers"]) > 0
    failures = thresholds(rows, tp)
    assert not failures, failures
    return out


def test_sharded_tp():
    run()


if __name__ == "__main__":
    run()
