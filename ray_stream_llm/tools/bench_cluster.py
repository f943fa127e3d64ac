"""The cluster benchmark: where each engine's weights come from, side by side in one run,
behind one link capped for the whole cluster (a bucket's share, 100 MiB/s by default).

- ``per-node.3`` / ``peers.3``: three Ray nodes on this machine (``ray.cluster_utils``:
  a raylet and an object store each) with one engine slot each, one engine per node;
  each node pulls the model from the store (``weight_peers=0``), or the nodes fill each
  other's regions over Ray (``weight_peers=2``, the default);
- ``streamed.1`` / ``region.1``: one engine on one node, streaming from the store
  (``weight_sharing="off"``) or from the node's region (``"auto"``, the default);
- ``tp2-store`` / ``tp2-region``: one engine of two tensor-parallel ranks (vLLM's ``mp``
  workers), each rank streaming from the store, or both from the node's region.

Each job runs cold, in its own isolated HOME and Ray cluster
(:func:`ray_stream_llm.tools.bench_job.run_isolated_job`). Figures per job: the bytes the
link carried (the store sent: weights, metadata, listings), the slowest engine's seconds
to ready, each engine's weight phase (its streamer's first request to its last tensor,
waits for the node's pull included), where each node's pull read, the first row, the total.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ray_stream_llm.tools.bench_job import MAX_TOKENS, PROMPTS, SAMPLING, run_isolated_job
from ray_stream_llm.tools.link import Link

DEFAULT_RATE = 100 << 20  # bytes/s: the cluster's share of a store link
NODES = 3
# one engine per node, with room for one actor of each CPU stage (Ray Data spreads them)
SLOT = {"num_cpus": 4, "resources": {"engine_slot": 1}}

CASES: dict[str, dict[str, Any]] = {
    "per-node.3": {"nodes": NODES, "config": {"weight_sharing": "node", "weight_peers": 0}},
    "peers.3": {"nodes": NODES, "config": {"weight_sharing": "node", "weight_peers": 2}},
    "streamed.1": {"config": {"weight_sharing": "off"}},
    "region.1": {"config": {"weight_sharing": "auto"}},
    "tp2-store": {"tp": 2, "config": {"weight_sharing": "off"}},
    "tp2-region": {"tp": 2, "config": {"weight_sharing": "auto"}},
}

# each case beside its control
PAIRS = (("peers.3", "per-node.3"), ("region.1", "streamed.1"), ("tp2-region", "tp2-store"))


def _spec(model_uri: str, case: dict[str, Any], num_cpus: int) -> dict[str, Any]:
    config = dict(case["config"])
    spec: dict[str, Any] = {
        "model": model_uri,
        "prompts": list(PROMPTS),
        "load_format": "runai_streamer",
        "max_tokens": MAX_TOKENS,
        "num_cpus": num_cpus,
        "sampling": SAMPLING,
    }
    if nodes := case.get("nodes"):
        # a head for the CPU stages, and a node per engine
        spec["nodes"] = [{"num_cpus": num_cpus}] + [SLOT] * nodes
        config["concurrency"] = [nodes, nodes]
        config["placement_group_config"] = {"bundles": [{"CPU": 1, "engine_slot": 1}]}
    else:
        config["concurrency"] = [1, 1]
    if tp := case.get("tp"):
        spec["engine_kwargs"] = {"tensor_parallel_size": tp}
        spec["num_cpus"] = max(num_cpus, 2 * tp)
    spec["config"] = config
    return spec


def cluster(
    model_uri: str,
    store_env: dict[str, str],
    store_port: int,
    workdir: Path,
    *,
    rate: float = DEFAULT_RATE,
    cases: Sequence[str] = tuple(CASES),
    num_cpus: int = 4,
    progress: Callable[[str], None] = print,
) -> dict[str, dict[str, Any]]:
    """One cold job per case; ``case`` -> its figures."""
    results: dict[str, dict[str, Any]] = {}
    for name in cases:
        progress(f"  cluster: {name}, link capped at {rate / 2**20:.0f} MiB/s ...")
        spec = _spec(model_uri, CASES[name], num_cpus)
        # every engine starts before the first batch (the builder's ENGINE_START_WAIT_S):
        # the figures are about all of them
        with Link(store_port, rate=rate) as link:
            out = run_isolated_job(workdir / f"cluster-{name}", spec, link.store_env(store_env))
            served = link.bytes_down
        results[name] = figures(out, served)
    return results


def figures(out: dict[str, Any], store_bytes: float) -> dict[str, Any]:
    """One job's figures from its output (``bench_job``) and the store's bytes."""
    reports = out["load_reports"]
    weights = [r["stream_seconds"] for r in reports if r.get("stream_seconds") is not None]
    return {
        "store_bytes": store_bytes,
        "slowest_ready_seconds": max(r["ready_seconds"] for r in reports),
        "slowest_weight_seconds": max(weights) if weights else math.nan,
        "weight_seconds": weights,
        "first_row_seconds": out["first_row_seconds"],
        "total_seconds": out["total_seconds"],
        "engines": len(reports),
        "rows": out["rows"],
        "shared": [r.get("weight_sharing") for r in reports],
        "pull_sources": [r.get("pull_source") for r in reports],
    }


def ratios(series: dict[str, float], model_bytes: int) -> dict[str, float]:
    """The store's bytes per case in model bytes; peers over per-node pulls, seconds."""
    out = {}
    for key, value in series.items():
        if key.startswith("cluster.") and key.endswith(".store_bytes"):
            out[key.removesuffix("store_bytes") + "store_bytes_x_model"] = value / model_bytes
    for a, b in PAIRS:
        for figure in ("slowest_ready_seconds", "slowest_weight_seconds"):
            x, y = series.get(f"cluster.{a}.{figure}"), series.get(f"cluster.{b}.{figure}")
            if x and y:
                out[f"cluster.{a}_over_{b}.{figure}"] = x / y
    return out


def reported_store_bytes(reports: list[dict[str, Any]]) -> float:
    """Weight bytes the store served, from the load reports (a real store's link cannot be
    counted here): each node's pull that read the store; NaN when no engine shared."""
    pulls = {
        r["node_ip"]: r["pull_bytes"]
        for r in reports
        if r.get("pull_bytes") is not None and r.get("pull_source") == "store"
    }
    shared = any(r.get("pull_bytes") is not None for r in reports)
    return float(sum(pulls.values())) if shared else math.nan


def on_running_cluster(
    model_uri: str,
    workdir: Path,
    engines: int,
    *,
    engine_kwargs: dict[str, Any] | None = None,
    progress: Callable[[str], None] = print,
) -> dict[str, dict[str, Any]]:
    """The release variant: ``per-node.<engines>`` and ``peers.<engines>`` on the Ray
    cluster this machine belongs to (``address="auto"``), the store's weight bytes from
    the load reports."""
    results: dict[str, dict[str, Any]] = {}
    for name, peers in (("per-node", 0), ("peers", 2)):
        progress(f"  cluster: {name}, {engines} engines on the running cluster ...")
        spec = {
            "model": model_uri,
            "prompts": list(PROMPTS),
            "load_format": "runai_streamer",
            "max_tokens": MAX_TOKENS,
            "sampling": SAMPLING,
            "address": "auto",
            "engine_kwargs": engine_kwargs,
            "config": {
                "concurrency": [engines, engines],
                "weight_sharing": "node",
                "weight_peers": peers,
            },
        }
        out = run_isolated_job(workdir / f"cluster-{name}", spec, {}, timeout=3600)
        results[f"{name}.{engines}"] = figures(out, reported_store_bytes(out["load_reports"]))
    return results
