"""The console script's ``bench`` end to end, as a user types it, against the real S3 server
(make test-slow). ``run`` with an engine: tests/e2e/test_resume.py (a Parquet file, killed
and resumed, its progress shown); the commands that start no engine:
tests/integration/test_cli.py."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from helpers.cli import run_cli

pytestmark = [pytest.mark.s3]


@pytest.mark.e2e
@pytest.mark.engine
@pytest.mark.slow  # three cold starts: 6-20 minutes on 2 cores; make test-slow
def test_bench_prints_the_table_and_writes_perf_metrics():
    """`ray-stream-llm bench` end to end, scaled down (2 layers, one run): its own S3 server,
    the three cold starts (streamed, downloaded, streamed compiling), the throughput pair and
    the metadata fetches. Kept out of make test: its figures, table and targets are checked
    on a real run's results in tests/unit/tools/test_bench.py, and its control (Ray's own
    loader writes every weight file in the job's HOME) by one tiny-model job in
    tests/e2e/test_streamed_jobs.py."""
    work = Path(tempfile.mkdtemp(prefix="rsl-bench-", dir="/tmp"))
    try:
        env = {
            "PATH": os.environ["PATH"],
            "HOME": str(work / "home"),
            "RAY_STREAM_LLM_CACHE": str(work / "cache"),
        }
        proc = run_cli(
            [
                "bench",
                "--repeat",
                "1",
                "--layers",
                "2",
                "--workdir",
                str(work / "w"),
                "--json",
                str(work / "out.json"),
            ],
            env,
            timeout=900,
        )
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
        metrics = {
            m["perf_metric_name"]: m["perf_metric_value"]
            for m in json.loads((work / "out.json").read_text())["perf_metrics"]
        }
        for name in metrics:  # every figure is a row of the printed table
            assert any(line.startswith(name + " ") for line in proc.stdout.splitlines()), name
        assert {f"metadata.{n}_shards.seconds" for n in (1, 10, 100)} <= set(metrics)
        run = json.loads((work / "out.json").read_text())["runs"][0]
        streamed, downloaded = run["cold_start"]["streamed"], run["cold_start"]["downloaded"]
        compiled = run["cold_start"]["streamed_compiled"]
        assert streamed["rows"] == downloaded["rows"] == compiled["rows"] == 8
        # ignore_eos: every row generates exactly the fixed number of tokens
        assert streamed["generated_tokens"] == downloaded["generated_tokens"] == 8 * 16
        # a user's default start compiles (a fresh HOME: nothing cached); the eager ones do not
        assert compiled["compile_cache"] == "miss" and compiled["compile_seconds"] > 0
        assert metrics["cold_start.streamed_compiled.compile_seconds"] > 0
        assert "cold_start.streamed.compile_seconds" not in metrics
        assert streamed["compile_cache"] is None
        # the control (Ray's own load format; make test's run of it on Ray 2.60 is
        # tests/e2e/test_streamed_jobs.py's, with the tiny model): the downloaded run wrote
        # every weight file to local disk, in the job's HOME, and its engine, ours, reported nothing
        # streamed; the streamed runs wrote only metadata
        shards = sorted((work / "cache" / "bench" / "llama-1gib").glob("*.safetensors"))
        model_bytes = sum(p.stat().st_size for p in shards)
        assert downloaded["disk_bytes_written"] >= model_bytes
        assert sorted(Path(f).name for f in downloaded["disk_weight_files"]) == [
            p.name for p in shards
        ]
        assert all(f.startswith("home/") for f in downloaded["disk_weight_files"])
        assert downloaded["streamed"] is False and streamed["streamed"] is True
        assert streamed["disk_bytes_written"] < 16 << 20
        assert streamed["disk_weight_files"] == compiled["disk_weight_files"] == []
        assert run["throughput"]["bytes"] == model_bytes and run["throughput"]["ratio"] > 0
    finally:
        shutil.rmtree(work, ignore_errors=True)
