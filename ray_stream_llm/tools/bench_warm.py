"""The warm-start benchmark: the same job cold, on a warm node, and on a fresh node with the
compile cache shipped through the store, with 1 and with 2 engines, side by side.

vLLM's default engine arguments (it compiles); weights shared on the node
(``weight_sharing="node"``) and kept warm (``keep_warm_s``); ``compile_cache_uri`` on the
benchmark store. The store is reached through a capped link (:mod:`.link`, 100 MiB/s),
as in the node-sharing benchmark. Per engine count, three jobs, each in its own Ray
cluster:

- ``cold``: an empty node (a fresh HOME: no vLLM cache; no kept weights): it compiles,
  ships its artifact and keeps its weights warm;
- ``warm``: the same job again in the same HOME, within ``keep_warm_s``: vLLM's local cache
  and the kept weights;
- ``fresh``: once the kept weights are gone, a fresh HOME: nothing local, the compiled
  artifact fetched from the store.

Figures per job: each engine's ready and compile seconds and the compile outcome, and the
bytes the store sent through the link (weights, metadata, listings, compile artifacts).
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ray_stream_llm.tools.bench_job import MAX_TOKENS, PROMPTS, SAMPLING, run_isolated_job
from ray_stream_llm.tools.link import Link

SCENARIOS = ("cold", "warm", "fresh")
ENGINES = (1, 2)
DEFAULT_RATE = 100 << 20  # bytes/s, as the node-sharing benchmark
KEEP_WARM_S = 60.0  # the warm job starts well within it (its stage actors adopt the copy)


def _spec(
    model_uri: str,
    engines: int,
    num_cpus: int,
    cache_uri: str,
    engine_kwargs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "model": model_uri,
        "prompts": list(PROMPTS),
        "load_format": "runai_streamer",
        "max_tokens": MAX_TOKENS,
        "num_cpus": num_cpus,
        "sampling": SAMPLING,
        "engine_kwargs": {"enforce_eager": False, **(engine_kwargs or {})},  # default: compile
        "config": {
            "concurrency": [engines, engines],  # a fixed pool: every engine starts
            "weight_sharing": "node",
            "keep_warm_s": KEEP_WARM_S,
            "compile_cache_uri": cache_uri,
        },
    }


def _wait_until_no_region(timeout: float = KEEP_WARM_S + 60) -> None:
    """The kept weights gone: once their ``keep_warm_s`` is up, the node's next region
    removes them (a local Ray's agent, their keeper, ended with its driver); here the bench
    does it (``sweep_regions``) as soon as their time is up."""
    from ray_stream_llm.weights.lifetime import sweep_regions
    from ray_stream_llm.weights.region import DEFAULT_BASE

    deadline = time.monotonic() + timeout
    while sweep_regions(Path(DEFAULT_BASE)) or any(
        p.is_file() for p in Path(DEFAULT_BASE).rglob("*")
    ):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the kept weights under {DEFAULT_BASE} outlived keep_warm_s")
        time.sleep(2.0)


def warm_starts(
    model_uri: str,
    store_env: dict[str, str],
    store_port: int | None,
    workdir: Path,
    *,
    cache_prefix: str = "s3://bench/compile-cache/",
    rate: float = DEFAULT_RATE,
    engines: Sequence[int] = ENGINES,
    num_cpus: int = 4,
    engine_kwargs: dict[str, Any] | None = None,
    progress: Callable[[str], None] = print,
) -> dict[str, dict[str, Any]]:
    """Per engine count, the three jobs; ``"<scenario>.<n>"`` -> its figures. Without
    ``store_port`` (a real store) no link is capped and the store's bytes are not measured
    (NaN)."""
    results: dict[str, dict[str, Any]] = {}
    for n in engines:
        cache_uri = f"{cache_prefix.rstrip('/')}/{uuid.uuid4().hex[:8]}/"
        # every engine starts before the first batch: the builder's ENGINE_START_WAIT_S
        spec = _spec(model_uri, n, max(num_cpus, 2 * n), cache_uri, engine_kwargs)
        _wait_until_no_region()  # a cold node: no weights kept by an earlier job
        for scenario in SCENARIOS:
            if scenario == "fresh":
                _wait_until_no_region()
            progress(f"  warm starts: {scenario}, {n} engine(s) ...")
            home = workdir / f"warm-{n}-{'fresh' if scenario == 'fresh' else 'node'}"
            if store_port is None:
                out, carried = run_isolated_job(home, spec, store_env), math.nan
            else:
                with Link(store_port, rate=rate) as link:
                    out = run_isolated_job(home, spec, link.store_env(store_env))
                    carried = link.bytes_down
            results[f"{scenario}.{n}"] = figures(out, carried)
    return results


def figures(out: dict[str, Any], link_bytes: float) -> dict[str, Any]:
    """One job's figures from its output (``bench_job``) and the bytes its link carried."""
    reports = out["load_reports"]
    compile_seconds = [r.get("compile_seconds") for r in reports]
    return {
        "slowest_ready_seconds": max(r["ready_seconds"] for r in reports),
        "ready_seconds": [r["ready_seconds"] for r in reports],
        "slowest_compile_seconds": max(
            (s for s in compile_seconds if s is not None), default=math.nan
        ),
        "compile_seconds": compile_seconds,
        "compile_cache": [r.get("compile_cache") for r in reports],
        # everything the store sent: weights, metadata, listings, compile artifacts (the
        # load reports' pull bytes describe the kept copy's original pull, not this job)
        "store_bytes": float(link_bytes),
        "first_row_seconds": out["first_row_seconds"],
        "engines": len(reports),
        "rows": out["rows"],
    }


def ratios(series: dict[str, float]) -> dict[str, float]:
    """The targets' figures, from the medians: each scenario's slowest engine ready over the
    cold job's, per engine count; two engines together over one alone (cold)."""
    out = {}
    for n in ENGINES:
        cold = series.get(f"warm.cold.{n}.slowest_ready_seconds")
        for scenario in ("warm", "fresh"):
            other = series.get(f"warm.{scenario}.{n}.slowest_ready_seconds")
            if cold and other:
                out[f"warm.{n}.{scenario}_over_cold_ready"] = other / cold
    one, two = (series.get(f"warm.cold.{n}.slowest_ready_seconds") for n in (1, 2))
    if one and two:
        out["warm.cold.2_engines_over_1_ready"] = two / one
    return out
