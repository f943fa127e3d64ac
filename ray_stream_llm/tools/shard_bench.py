"""Tensor-parallel engines streamed two ways, side by side in one run: ``runai_streamer``
over the plain checkpoint, each rank from the store (``weight_sharing='off'``: every rank
reads every object, TP times the model) and
``runai_streamer_sharded`` over the output of ``ray-stream-llm shard`` (each rank reads its
own files: once the model).

Each job is a cold Ray Data job in a subprocess with its own HOME, TMPDIR and Ray session,
run as every benchmark's job is (:func:`ray_stream_llm.tools.bench_job.run_isolated_job`).
With a local store (an ``http://127.0.0.1`` endpoint) the jobs reach it through
:class:`~ray_stream_llm.tools.shard_proxy.ByteProxy`, which counts the response bytes of
every GET per object: the store's own figure. Against a remote store the bytes are the
engines' own (the load report, per rank).

``python -m ray_stream_llm.tools.shard_bench SOURCE SHARDED TP OUT_JSON`` (the store from
the standard environment); the release script ``release/benchmarks/sharded_tp.py`` and
``tests/e2e/test_shard.py`` call :func:`side_by_side`.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path
from typing import Any

from ray_stream_llm.tools.bench_job import run_isolated_job

PROMPTS = [f"Write item {i} of a list of facts about object storage." for i in range(4)]
MAX_TOKENS = 8
FORMATS = ("runai_streamer", "runai_streamer_sharded")


def _is_weight(key: str) -> bool:
    return key.endswith(".safetensors")


def _local_port(endpoint: str | None) -> int | None:
    if not endpoint:
        return None
    parts = urllib.parse.urlsplit(endpoint)
    if parts.scheme == "http" and parts.hostname == "127.0.0.1" and parts.port:
        return parts.port
    return None


def side_by_side(
    source: str,
    sharded: str,
    tensor_parallel_size: int,
    workdir: Path,
    *,
    env: dict[str, str] | None = None,
    engine_kwargs: dict[str, Any] | None = None,
    num_cpus: int | None = None,
    prompts: list[str] | None = None,
    timeout: float = 900,
) -> dict[str, Any]:
    """Run the two jobs, one after the other, and return their figures: per format the
    rows, the answers, the store's GET bytes per object (local store), each engine's load
    report (per rank: files, bytes, seconds), and the weight phase seconds."""
    from ray_stream_llm.tools.shard_proxy import ByteProxy

    env = dict(env if env is not None else {})
    endpoint = env.get("AWS_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT_URL")
    port = _local_port(endpoint)
    # On vLLM's CPU build the builder gives TP engines the 'mp' backend and unbound threads.
    kwargs = {**(engine_kwargs or {}), "tensor_parallel_size": tensor_parallel_size}
    out: dict[str, Any] = {"tensor_parallel_size": tensor_parallel_size, "jobs": {}}
    cpu_env = {k: v for k, v in env.items() if k.startswith("VLLM_CPU")}
    for load_format, uri in zip(FORMATS, (source, sharded), strict=True):
        spec = {
            "model": uri,
            "prompts": prompts or PROMPTS,
            "load_format": load_format,
            "max_tokens": MAX_TOKENS,
            "num_cpus": num_cpus,
            "engine_kwargs": kwargs,
            # each rank streams from the store (the default, 'auto', would have the plain
            # checkpoint's ranks read the node's one pull: docs/sharing.md)
            "config": {"runtime_env": {"env_vars": cpu_env}, "weight_sharing": "off"},
        }
        proxy = ByteProxy(port) if port else None
        job_env = dict(env)
        if proxy is not None:
            job_env["AWS_ENDPOINT_URL"] = proxy.endpoint_url
        started = time.perf_counter()
        if proxy is not None:
            with proxy:
                figures = run_isolated_job(workdir / load_format, spec, job_env, timeout)
                records = proxy.records()
        else:
            figures = run_isolated_job(workdir / load_format, spec, job_env, timeout)
            records = []
        figures["wall_seconds"] = time.perf_counter() - started
        bucket = uri.removeprefix("s3://").partition("/")[0]
        gets: dict[str, int] = {}
        counts: dict[str, int] = {}
        checks: dict[str, int] = {}
        for r in records:
            if r.method == "GET" and r.bucket == bucket and _is_weight(r.key):
                if r.by_streamer:
                    gets[r.key] = gets.get(r.key, 0) + r.body_bytes
                    counts[r.key] = counts.get(r.key, 0) + 1
                else:  # the driver's header check (two small ranged GETs per file)
                    checks[r.key] = checks.get(r.key, 0) + r.body_bytes
        local = proxy is not None
        figures["store_weight_get_bytes"] = gets if local else None  # by the engines
        figures["store_weight_gets"] = counts if local else None
        figures["store_header_check_bytes"] = checks if local else None  # by the driver
        figures["store_weight_bytes"] = sum(gets.values()) if local else None
        reports = figures["load_reports"]
        figures["engine_weight_bytes"] = sum(int(r.get("weight_bytes") or 0) for r in reports)
        figures["weight_seconds"] = max(
            (float(r["stream_seconds"]) for r in reports if r.get("stream_seconds") is not None),
            default=None,
        )
        out["jobs"][load_format] = figures
    return out


def summary(result: dict[str, Any], model_bytes: int) -> dict[str, Any]:
    """The side-by-side figures: store bytes as a multiple of the model, weight seconds."""
    rows = {}
    for load_format, job in result["jobs"].items():
        served = job["store_weight_bytes"]
        served = served if served is not None else job["engine_weight_bytes"]
        rows[load_format] = {
            "rows": job["rows"],
            "store_bytes": served,
            "x_model": served / model_bytes if model_bytes else None,
            "weight_seconds": job["weight_seconds"],
            "ranks": [
                {k: r[k] for k in ("rank", "files", "weight_bytes", "seconds")}
                for rep in job["load_reports"]
                for r in (rep.get("ranks") or [])
            ],
        }
    return rows


def main(argv: list[str]) -> None:
    if len(argv) != 4:
        sys.exit("usage: python -m ray_stream_llm.tools.shard_bench SOURCE SHARDED TP OUT_JSON")
    source, sharded, tp, out = argv
    workdir = Path(tempfile.mkdtemp(prefix="rsl-shard-bench-", dir="/tmp"))
    try:
        result = side_by_side(source, sharded, int(tp), workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    Path(out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":  # vLLM spawns processes: the guard is required
    main(sys.argv[1:])
