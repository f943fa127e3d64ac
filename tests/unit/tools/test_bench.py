"""The benchmarks' figures, table and targets (tools/bench.py, tools/bench_warm.py,
tools/bench_cluster.py), from job outputs shaped as ``bench_job`` writes them (no committed
recording: issue 57); the jobs themselves run in ``ray-stream-llm bench`` (make bench; its
end-to-end test, tests/e2e/test_cli.py, in make test-slow), not here."""

from __future__ import annotations

import math

import pytest

from ray_stream_llm.tools import bench, bench_warm
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


# --- the cold-start benchmark (tools/bench.py; its jobs: ray-stream-llm bench, make bench) --
def _job_out(rows: int = 8, **report: object) -> dict:
    """A cold start's job output as ``bench_job`` writes it (with the local-disk fields
    ``run_isolated_job`` adds): one engine's load report, the real class's dict."""
    from ray_stream_llm.reports import LoadReport

    fields = {
        "model": "s3://bench/llama-1gib/", "streamed": True, "job_id": "01000000",
        "node_ip": "127.0.0.1", "pid": 4242, "attempt": 1, "ready_seconds": 40.0,
        "metadata_files": 6, "metadata_bytes": 3_500_000, "metadata_seconds": 0.4,
        "metadata_downloaded": True, "weight_files": 4, "weight_bytes": 1 << 30,
        "streamed_tensor_bytes": (1 << 30) - 4096, "stream_seconds": 8.0,
        "streamer_settings": {}, "finished_at": 0.0,
    }  # fmt: skip
    return {
        "rows": rows, "generated_tokens": rows * 16, "build_seconds": 3.0,
        "first_row_seconds": 55.0, "total_seconds": 60.0, "disk_bytes_written": 2_000_000,
        "disk_weight_files": [],
        "load_reports": [LoadReport(**{**fields, **report}).to_dict()],  # type: ignore[arg-type]
    }  # fmt: skip


def test_a_cold_starts_figures_come_from_its_job_and_its_engines_report():
    eager = bench.cold_start_figures("streamed", _job_out(), 8)
    assert (eager["engine_ready_seconds"], eager["weight_seconds"]) == (40.0, 8.0)
    assert eager["stream_gib_per_s"] == 1 / 8.0 and eager["streamed"] is True
    assert (eager["rows"], eager["generated_tokens"], eager["disk_weight_files"]) == (8, 128, [])
    # enforce_eager: nothing compiled, so no compile figure (NaN) and no cache outcome
    assert math.isnan(eager["compile_seconds"]) and eager["compile_cache"] is None
    compiled = bench.cold_start_figures(
        "streamed_compiled", _job_out(compile_seconds=25.0, compile_cache="miss"), 8
    )
    assert (compiled["compile_seconds"], compiled["compile_cache"]) == (25.0, "miss")
    # Ray's own loader: the engine reports, but nothing streamed (no stream figures)
    downloaded = bench.cold_start_figures(
        "downloaded", _job_out(streamed=False, weight_files=None, weight_bytes=None,
                               streamed_tensor_bytes=None, stream_seconds=None), 8
    )  # fmt: skip
    assert downloaded["streamed"] is False and math.isnan(downloaded["weight_seconds"])
    assert math.isnan(downloaded["stream_gib_per_s"])
    with pytest.raises(RuntimeError, match="streamed: 7 rows out of 8"):
        bench.cold_start_figures("streamed", _job_out(rows=7), 8)


def _run(streamed_disk: int = 2_000_000, ratio: float = 0.4) -> dict:
    """One run of the cold-start suite as ``bench`` records it: the three variants (a
    compiling streamed start, an eager one, Ray's own loader as the control), the
    throughput pair and the metadata fetches."""
    cold = {
        "streamed_compiled": bench.cold_start_figures(
            "streamed_compiled", _job_out(compile_seconds=50.0, compile_cache="miss"), 8
        ),
        "streamed": bench.cold_start_figures("streamed", _job_out(), 8),
        "downloaded": bench.cold_start_figures(
            "downloaded",
            {**_job_out(streamed=False), "total_seconds": 150.0, "disk_bytes_written": 1 << 30},
            8,
        ),
    }
    cold["streamed"]["disk_bytes_written"] = streamed_disk
    return {
        "cold_start": cold,
        "throughput": {"streamer_gib_per_s": 1.0, "ceiling_gib_per_s": 1.0 / ratio, "ratio": ratio},
        "metadata": {f"{n}_shards": {"seconds": 0.1 * n} for n in (1, 10, 100)},
    }


ENVIRONMENT = {"cpus": 2, "model": {"bytes": 1 << 30, "shards": 4}}


def test_every_perf_metric_is_a_row_of_the_printed_table_with_min_median_max():
    result = BenchResult(runs=[_run(ratio=0.3), _run(ratio=0.5), _run(ratio=0.4)],
                         environment=ENVIRONMENT)  # fmt: skip
    metrics = {m.name: m for m in result.perf_metrics()}
    lines = bench.format_table(result).splitlines()
    rows = {line.split()[0]: line for line in lines[2:-1]}
    assert set(rows) == set(metrics)
    assert rows["throughput.ratio"].split()[1:] == ["0.300", "x", "0.400", "x", "0.500", "x"]
    assert metrics["throughput.ratio"].value == 0.4  # the median
    assert lines[-1] == "(3 run(s); model 1.00 GiB in 4 shards; 2 CPUs)"
    # the compiling start has a compile figure; the eager ones have none (NaN: no metric)
    assert metrics["cold_start.streamed_compiled.compile_seconds"].value == 50.0
    assert "cold_start.streamed.compile_seconds" not in metrics
    assert "cold_start.downloaded.compile_seconds" not in metrics
    assert {f"metadata.{n}_shards.seconds" for n in (1, 10, 100)} <= set(metrics)


def test_the_default_targets_and_a_missed_one_named():
    assert check_thresholds(BenchResult([_run()], ENVIRONMENT), {}) == []
    # the disk target: the streamed start's local-disk bytes over the control's
    heavy = BenchResult([_run(streamed_disk=(1 << 30) // 10)], ENVIRONMENT)
    assert check_thresholds(heavy, {}) == [
        "disk_ratio = 0.1 is above RSL_BENCH_MAX_STREAMED_WEIGHT_DISK_RATIO=0.05"
    ]
    result = BenchResult([_run(ratio=0.4)], ENVIRONMENT)
    assert check_thresholds(result, {"RSL_BENCH_MIN_THROUGHPUT_RATIO": "0.5"}) == [
        "throughput.ratio = 0.4 is below RSL_BENCH_MIN_THROUGHPUT_RATIO=0.5"
    ]
    assert check_thresholds(result, {"RSL_BENCH_MIN_COLD_START_SPEEDUP": "3"}) == [
        "cold_start.speedup = 2.5 is below RSL_BENCH_MIN_COLD_START_SPEEDUP=3"
    ]


def test_the_copy_suite_puts_the_regions_weight_phase_over_a_plain_copy():
    """--suite copy: the engine's weight phase from the region (less its wait for the pull)
    over one process's copy of the same bytes; each run says where it was measured; a run
    whose engine did not stream from the region is refused, not compared."""
    from ray_stream_llm.tools import bench_copy

    report = {
        "weight_sharing": "node",
        "stream_seconds": 2.5,
        "weight_wait_seconds": 0.5,
        "streamed_tensor_bytes": 2**30,
    }
    got = bench_copy.figures(report, {"seconds": 0.25, "bytes": 2**30, "tensors": 10})
    assert (got["weight_seconds"], got["weight_wait_seconds"]) == (2.0, 0.5)
    assert (got["copy_gib_per_s"], got["weight_over_copy"]) == (4.0, 8.0)
    assert got["where"].startswith("measured on ")
    runs = [{"copy": {**got, "weight_over_copy": x}} for x in (8.0, 6.0, 12.0)]
    result = BenchResult(runs=runs, environment={"cpus": 2})
    assert result.series()["copy.weight_over_copy"] == ([8.0, 6.0, 12.0], "x", "LATENCY")
    table = bench.format_table(result)
    assert "copy.weight_over_copy" in table and f"(copy.*: {got['where']})" in table
    with pytest.raises(RuntimeError, match="did not stream from the node's region"):
        bench_copy.figures({**report, "weight_sharing": "off: too big"}, {"seconds": 1.0})


def test_the_copy_process_copies_every_tensor_of_the_files(tmp_path):
    """The copy runs in a fresh process from tmpfs copies of the files, which it removes:
    the bytes it copied are the files' tensor bytes, every tensor counted."""
    import torch
    from helpers.models import tensor_bytes
    from safetensors.torch import save_file

    from ray_stream_llm.tools import bench_copy

    files = []
    for k in range(2):
        tensors = {f"w{k}.{i}": torch.randn(64, 32 + i) for i in range(5)}
        files.append(tmp_path / f"model-{k}.safetensors")
        save_file(tensors, str(files[-1]))
    tmpfs = tmp_path / "shm"
    got = bench_copy.copy_in_fresh_process(files, tmpfs)
    assert got["bytes"] == sum(tensor_bytes(f) for f in files) and got["tensors"] == 10
    assert got["seconds"] > 0 and list(tmpfs.iterdir()) == []
