"""The node-sharing benchmark: plain streaming, Ray's download path and shared streaming,
with 1 and with 2 engines on one node, side by side, behind one capped link.

The store is reached through :class:`~ray_stream_llm.tools.link.Link`, which
stands for the node's share of a real store's link (``rate`` bytes/s, 100 MiB/s by
default): on loopback, with no cap, a store is as fast as local memory and the weights
hide behind fixed costs. Each job runs cold, in its own isolated HOME and Ray cluster
(:func:`ray_stream_llm.tools.bench_job.run_isolated_job`). Figures per path and engine
count: the bytes the link carried (the store served: weights, plus metadata and
listings), the slowest engine's seconds to ready, each engine's weight phase (its
streamer's first request to its last tensor, waits for the node's pull included), the
first row, the total, and the local-disk bytes written.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ray_stream_llm.tools.bench_job import MAX_TOKENS, PROMPTS, SAMPLING, run_isolated_job
from ray_stream_llm.tools.link import Link

PATHS = ("streamed", "downloaded", "shared")
ENGINES = (1, 2)
DEFAULT_RATE = 100 << 20  # bytes/s: one node's share of a store link


def _spec(model_uri: str, path: str, engines: int, num_cpus: int) -> dict[str, Any]:
    return {
        "model": model_uri,
        "prompts": list(PROMPTS),
        "load_format": None if path == "downloaded" else "runai_streamer",
        "max_tokens": MAX_TOKENS,
        "num_cpus": num_cpus,
        "sampling": SAMPLING,
        "config": {
            "concurrency": [engines, engines],  # a fixed pool: every engine starts
            **(
                {"weight_sharing": "node" if path == "shared" else "off"}
                if path != "downloaded"
                else {}
            ),
        },
    }


def node_sharing(
    model_uri: str,
    store_env: dict[str, str],
    store_port: int | None,
    workdir: Path,
    *,
    rate: float = DEFAULT_RATE,
    engines: Sequence[int] = ENGINES,
    paths: Sequence[str] = PATHS,
    num_cpus: int = 4,
    progress: Callable[[str], None] = print,
) -> dict[str, dict[str, Any]]:
    """One cold job per (path, engines); ``"<path>.<n>"`` -> its figures."""
    results: dict[str, dict[str, Any]] = {}
    for n in engines:
        for path in paths:
            progress(
                f"  node sharing: {path}, {n} engine(s), link capped at "
                f"{rate / 2**20:.0f} MiB/s ..."
            )
            spec = _spec(model_uri, path, n, max(num_cpus, 2 * n))
            # every engine starts before the first batch (the builder's ENGINE_START_WAIT_S):
            # the figures are about all of them
            work = workdir / f"sharing-{path}-{n}"
            work.mkdir(parents=True, exist_ok=True)
            if store_port is None:  # a real store and link: the bytes from the load reports
                out = run_isolated_job(work, spec, store_env)
                served = _reported_bytes(out["load_reports"])
            else:
                with Link(store_port, rate=rate) as link:
                    out = run_isolated_job(work, spec, link.store_env(store_env))
                    served = link.bytes_down
            reports = out["load_reports"]
            weights = [r["stream_seconds"] for r in reports if r.get("stream_seconds") is not None]
            results[f"{path}.{n}"] = {
                "store_bytes": served,
                "slowest_ready_seconds": max(r["ready_seconds"] for r in reports),
                "slowest_weight_seconds": max(weights) if weights else math.nan,
                "weight_seconds": weights,  # each engine's
                "build_seconds": out["build_seconds"],
                "metadata_seconds": max(r["metadata_seconds"] for r in reports),
                "first_row_seconds": out["first_row_seconds"],
                "total_seconds": out["total_seconds"],
                "disk_bytes_written": out["disk_bytes_written"],
                "engines": len(reports),
                "rows": out["rows"],
                "shared": [r.get("weight_sharing") for r in reports],
                "waits": [r.get("weight_wait_seconds") for r in reports],
                "pull_hidden": [r.get("pull_hidden_seconds") for r in reports],
            }
    return results


def _reported_bytes(reports: list[dict[str, Any]]) -> float:
    """Weight bytes the store served, from the load reports: each node's one pull when the
    weights were shared, else each engine's stream; NaN for Ray's download path."""
    pulls = {r["node_ip"]: r["pull_bytes"] for r in reports if r.get("pull_bytes") is not None}
    if pulls:
        return float(sum(pulls.values()))
    streamed = [r["weight_bytes"] for r in reports if r.get("weight_bytes") is not None]
    return float(sum(streamed)) if streamed else math.nan


def ratios(series: dict[str, float], model_bytes: int) -> dict[str, float]:
    """The targets' figures, from the medians: store bytes per engine count and path, in
    model bytes; the slowest weight phase shared vs plain streaming."""
    out = {}
    for n in ENGINES:
        for path in PATHS:
            key = f"sharing.{path}.{n}.store_bytes"
            if key in series:
                out[f"sharing.{path}.{n}.store_bytes_x_model"] = series[key] / model_bytes
        shared = series.get(f"sharing.shared.{n}.slowest_weight_seconds")
        plain = series.get(f"sharing.streamed.{n}.slowest_weight_seconds")
        if shared and plain:
            out[f"sharing.{n}.weight_seconds_shared_over_streamed"] = shared / plain
    return out
