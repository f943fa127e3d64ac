"""The console script's engine jobs, as a user types them, against the real S3 server:
``run`` on a Parquet file with its progress shown (of a mirror of a Hub repository: only
its safetensors streamed, nothing of it written to disk), and ``bench`` (make
test-slow). The commands that start no engine: tests/integration/test_cli.py."""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
from pathlib import Path

import pytest
from helpers.cli import run_cli
from helpers.janitors import segments_left
from helpers.jobs import reads_under, weights_on_local_disk
from helpers.models import is_weight

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


@pytest.mark.e2e
@pytest.mark.engine
def test_run_answers_a_parquet_file_with_its_progress_shown(s3_server, tiny_models, work):
    """`run --verbose` on a Parquet file, the one engine job of this file: every row of the
    file comes out in answers.parquet with its columns, and the progress is shown: the
    command's own bar (rows), Ray Data's (shown only with --verbose) and Ray's log lines.
    Quiet, its default, shows neither of Ray's: tests/e2e/test_readme.py. The model is a
    mirror of a Hub repository (the tiny model's safetensors beside its .bin, .pth, .gguf
    and more): the store served its safetensors alone, no weight file of any format was
    written to local disk, and the job's metadata directory holds exactly the model's
    metadata files."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ray_stream_llm.tools.isolated import isolated_env

    path = work / "questions.parquet"
    pq.write_table(
        pa.table({"id": [7, 8, 9], "question": ["What is 2+2?", "Say hi.", "Name a color."]}),
        path,
    )
    expected = sorted((r["id"], r["question"]) for r in pq.read_table(path).to_pylist())
    model = tiny_models["hub-mirror"]
    since, before = time.time(), s3_server.served()
    args = ["run", model.uri, str(path), "--column", "question", "--verbose"]
    proc = run_cli(
        [*args, "--output", str(work / "out"), "--max-tokens", "4"],
        {**isolated_env(work), **s3_server.env()},
        timeout=600,
        cwd=work,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    table = pq.read_table(work / "out" / "answers.parquet").to_pylist()
    assert sorted((r["id"], r["question"]) for r in table) == expected
    tokens = sum(r["num_generated_tokens"] for r in table)
    assert f"rows: 3/3  generated tokens: {tokens}" in proc.stdout, proc.stdout
    bar = proc.stderr.replace("\r", "\n")
    assert re.search(r"Answering: 100%.*\b3/3\b", bar), bar[-3000:]
    assert "Running Dataset:" in output, output[-3000:]  # Ray Data's progress
    assert "Started a local Ray instance" in output, output[-3000:]
    assert segments_left(since) == []  # the engine's shared memory was released
    # the mirror: its safetensors streamed, no weight file of any format on local disk, and
    # the metadata the engine read beside them fetched whole
    reads = reads_under(s3_server, model.uri, before)
    weight_reads = {u.removeprefix(model.uri) for u in reads if is_weight(u.rsplit("/", 1)[1])}
    assert weight_reads == {"model.safetensors"}, weight_reads
    written = weights_on_local_disk(work, since)
    assert written == {}, written
    [metadata] = [p for p in (work / "home/.cache/ray_stream_llm/models").iterdir() if p.is_dir()]
    got = {str(p.relative_to(metadata)) for p in metadata.rglob("*") if p.is_file()}
    assert got - {".ray_stream_llm.json"} == set(model.metadata), got
    print(f"\nrun --verbose, Parquet: 3/3 rows, {tokens} tokens, {len(output.splitlines())} lines")
