"""The warm-start benchmark's figures and targets (tools/bench_warm.py, tools/bench.py), from
job outputs shaped as ``bench_job`` writes them; the jobs themselves run in
``ray-stream-llm bench --suite warm`` (docs/benchmarks.md), not here."""

from __future__ import annotations

import math

from ray_stream_llm.tools import bench_warm
from ray_stream_llm.tools.bench import BenchResult, check_thresholds


def _out(ready: list[float], compile_s: list[float | None], cache: list[str | None]) -> dict:
    return {
        "load_reports": [
            {"ready_seconds": r, "compile_seconds": c, "compile_cache": o}
            for r, c, o in zip(ready, compile_s, cache, strict=True)
        ],
        "first_row_seconds": max(ready) + 5,
        "rows": 8,
    }


def test_a_jobs_figures_take_the_slowest_engine():
    got = bench_warm.figures(_out([40.0, 50.0], [30.0, 2.0], ["miss", "hit"]), 1.5e9)
    assert got["slowest_ready_seconds"] == 50.0 and got["slowest_compile_seconds"] == 30.0
    assert got["compile_cache"] == ["miss", "hit"] and got["store_bytes"] == 1.5e9
    eager = bench_warm.figures(_out([20.0], [None], [None]), 0)
    assert math.isnan(eager["slowest_compile_seconds"])  # nothing compiled: not measured


def test_the_targets_compare_each_start_with_the_cold_one():
    runs = {
        "cold.1": bench_warm.figures(_out([100.0], [60.0], ["miss"]), 1e9),
        "warm.1": bench_warm.figures(_out([30.0], [2.0], ["hit"]), 1e5),
        "fresh.1": bench_warm.figures(_out([60.0], [3.0], ["hit"]), 1e9),
        "cold.2": bench_warm.figures(_out([110.0, 125.0], [60.0, 3.0], ["miss", "hit"]), 1e9),
    }
    result = BenchResult(runs=[{"warm": runs}], environment={"cpus": 2})
    series = {n: v[0][0] for n, v in result.series().items()}
    assert bench_warm.ratios(series) == {
        "warm.1.warm_over_cold_ready": 0.3,
        "warm.1.fresh_over_cold_ready": 0.6,
        "warm.cold.2_engines_over_1_ready": 1.25,
    }
    assert check_thresholds(result, {}) == [
        "warm.1.fresh_over_cold_ready = 0.6 is above RSL_BENCH_MAX_FRESH_READY_RATIO=0.5",
        "warm.cold.2_engines_over_1_ready = 1.25 is above "
        "RSL_BENCH_MAX_TWO_ENGINES_READY_RATIO=1.2",
    ]
