"""The warm-start and cluster benchmarks' figures and targets (tools/bench_warm.py,
tools/bench_cluster.py, tools/bench.py), from job outputs shaped as ``bench_job`` writes
them; the jobs themselves run in ``ray-stream-llm bench --suite warm|cluster``
(docs/benchmarks.md), not here."""

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


# --- the cluster benchmark (tools/bench_cluster.py; its jobs: bench --suite cluster) ---------
def test_the_cluster_cases_are_specified_side_by_side():
    from ray_stream_llm.tools import bench_cluster

    spec = {
        name: bench_cluster._spec("s3://m/", case, 4) for name, case in bench_cluster.CASES.items()
    }
    for name in ("per-node.3", "peers.3"):  # a head for the CPU stages, a node per engine
        nodes = spec[name]["nodes"]
        assert len(nodes) == 4 and "resources" not in nodes[0]
        assert all(n["resources"] == {"engine_slot": 1} for n in nodes[1:])
        assert spec[name]["config"]["concurrency"] == [3, 3]
        assert spec[name]["config"]["placement_group_config"] == {
            "bundles": [{"CPU": 1, "engine_slot": 1}]
        }
    assert spec["per-node.3"]["config"]["weight_peers"] == 0
    assert spec["peers.3"]["config"]["weight_peers"] == 2
    assert spec["streamed.1"]["config"]["weight_sharing"] == "off"
    assert spec["region.1"]["config"]["weight_sharing"] == "auto"
    for name in ("tp2-store", "tp2-region"):
        assert spec[name]["engine_kwargs"] == {"tensor_parallel_size": 2}
        assert "nodes" not in spec[name] and spec[name]["config"]["concurrency"] == [1, 1]


def test_the_cluster_figures_and_the_peers_target():
    from ray_stream_llm.tools import bench_cluster

    def out(ready, stream, sources, pulled):
        reports = [
            {"ready_seconds": r, "stream_seconds": s, "weight_sharing": "node",
             "pull_source": src, "pull_bytes": pulled, "node_ip": f"10.0.0.{i}"}
            for i, (r, s, src) in enumerate(zip(ready, stream, sources, strict=True))
        ]  # fmt: skip
        return {"load_reports": reports, "first_row_seconds": 90.0, "total_seconds": 100.0,
                "rows": 8}  # fmt: skip

    per_node = out([60.0, 70.0, 65.0], [30.0, 31.0, 29.0], ["store"] * 3, 1e9)
    peers = out([40.0, 42.0, 41.0], [5.0, 6.0, 4.0], ["store", "peer a", "peer a"], 1e9)
    # a real store's bytes: each node's pull that read the store, from the reports
    assert bench_cluster.reported_store_bytes(per_node["load_reports"]) == 3e9
    assert bench_cluster.reported_store_bytes(peers["load_reports"]) == 1e9
    runs = {
        "per-node.3": bench_cluster.figures(per_node, 3.02e9),
        "peers.3": bench_cluster.figures(peers, 1.01e9),
    }
    assert runs["peers.3"]["slowest_ready_seconds"] == 42.0
    assert runs["peers.3"]["slowest_weight_seconds"] == 6.0
    assert runs["peers.3"]["pull_sources"] == ["store", "peer a", "peer a"]
    result = BenchResult(runs=[{"cluster": runs}], environment={"cpus": 2, "model": {"bytes": 1e9}})
    series = {n: v[0][0] for n, v in result.series().items()}
    ratios = bench_cluster.ratios(series, 1e9)
    assert ratios["cluster.peers.3.store_bytes_x_model"] == 1.01
    assert ratios["cluster.per-node.3.store_bytes_x_model"] == 3.02
    assert ratios["cluster.peers.3_over_per-node.3.slowest_weight_seconds"] == 6.0 / 31.0
    assert check_thresholds(result, {}) == []
    assert check_thresholds(result, {"RSL_BENCH_MAX_PEERS_STORE_X": "1.0"}) == [
        "cluster.peers.3.store_bytes_x_model = 1.01 is above RSL_BENCH_MAX_PEERS_STORE_X=1"
    ]
