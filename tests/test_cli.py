"""The console script as a user types it, against the real S3 server."""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from helpers.janitors import segments_left
from helpers.waiting import wait_until

pytestmark = [pytest.mark.s3]

CLI = [sys.executable, "-m", "ray_stream_llm.cli"]


def _cli(args, env, timeout=120, cwd=None):
    return subprocess.run(
        CLI + args, env=env, capture_output=True, text=True, timeout=timeout, cwd=cwd
    )


@pytest.fixture
def env(s3_server, tmp_path):
    return {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path / "home"),
        "RAY_STREAM_LLM_CACHE": str(tmp_path / "cache"),
        **s3_server.env(),
    }


@pytest.mark.parametrize(
    "command", ["inspect", "fetch-metadata", "run", "demo", "bench", "shard", "doctor"]
)
def test_help_has_an_example(command, env):
    proc = _cli([command, "--help"], env)
    assert proc.returncode == 0 and "Example: ray-stream-llm " + command in proc.stdout


def test_inspect_table_and_json(tiny_models, env):
    model = tiny_models["hub-mirror"]
    table = _cli(["inspect", model.uri], env)
    assert table.returncode == 0, table.stderr
    assert "streamable: yes" in table.stdout
    lines = {
        line.split()[0]: line.split()[-1]
        for line in table.stdout.splitlines()[1:]
        if line.startswith("  ")
    }
    assert lines["model.safetensors"] == "streamable_weights"
    assert lines["pytorch_model.bin"] == "other_weights"
    assert lines["original/consolidated.00.pth"] == "other_weights"
    assert lines["config.json"] == "metadata" and lines["README.md"] == "other"
    as_json = _cli(["inspect", model.uri, "--json"], env)
    manifest = json.loads(as_json.stdout)
    assert manifest["streamable"] is True and manifest["problems"] == []
    files = {f["path"]: f for f in manifest["files"]}
    assert set(files) == {p for p in model.metadata | model.weights} | {
        f for f in files if files[f]["role"] == "other"
    }
    size = (model.local / "model.safetensors").stat().st_size
    assert manifest["weight_bytes"] == size


def test_inspect_not_streamable_exits_1_with_the_reason(s3_server, tiny_models, env):
    s3_server.put("s3://models/cli/bin-only/config.json", b"{}")
    s3_server.put("s3://models/cli/bin-only/pytorch_model.bin", b"\0" * 64)
    proc = _cli(["inspect", "s3://models/cli/bin-only/"], env)
    assert proc.returncode == 1
    assert "streamable: no" in proc.stdout and "safe_serialization=True" in proc.stdout


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["inspect", "s3:/models/x"], "InvalidModelURIError"),
        (["inspect", "s3://no-such-bucket/m/"], "ModelNotFoundError"),
        (["fetch-metadata", "s3a://models/x/"], "use s3://models/x/"),
        (
            ["inspect", "s3://models/tiny/single/", "--endpoint-url", "minio:9000"],
            "invalid endpoint_url",
        ),
        (
            ["run", "s3://models/tiny/single/", "missing.jsonl", "--column", "q", "--output", "o"],
            "does not exist",
        ),
    ],
)
def test_bad_input_one_line_no_traceback(args, fragment, env, tiny_models, tmp_path):
    proc = _cli(args, env, cwd=tmp_path)
    assert proc.returncode != 0
    assert fragment in proc.stderr and "Traceback" not in proc.stderr
    assert len([line for line in proc.stderr.splitlines() if line.strip()]) <= 3


def test_run_with_a_wrong_model_answers_before_ray_starts(env, tiny_models, tmp_path):
    """Issue 13: the model is checked before Ray starts: one line, no Ray output."""
    (tmp_path / "q.jsonl").write_text('{"q": "hi"}\n')
    start = time.monotonic()
    proc = _cli(
        ["run", "s3://models/no/such/model/", "q.jsonl", "--column", "q", "--output", "o"],
        env,
        cwd=tmp_path,
    )
    elapsed = time.monotonic() - start
    assert proc.returncode != 0 and "ModelNotFoundError: no objects under" in proc.stderr
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert not (tmp_path / "o").exists()
    assert elapsed < 30, f"{elapsed:.1f}s"  # a hang guard; the note quotes the measured time
    print(f"\nwrong model: {elapsed:.1f}s, one line: {lines[0][:120]}")


def test_run_with_a_wrong_column_names_the_columns(env, tiny_models, tmp_path):
    (tmp_path / "q.jsonl").write_text('{"question": "hi", "id": 1}\n')
    proc = _cli(
        ["run", tiny_models["single"].uri, "q.jsonl", "--column", "q", "--output", "o"],
        env,
        cwd=tmp_path,
    )
    assert proc.returncode == 2
    assert "no column 'q' in 'q.jsonl'; columns: ['question', 'id']" in proc.stderr


def test_fetch_metadata_prints_the_directory(tiny_models, env, tmp_path):
    model = tiny_models["sharded"]
    proc = _cli(["fetch-metadata", model.uri, "--dest", str(tmp_path / "meta")], env)
    assert proc.returncode == 0, proc.stderr
    path = Path(proc.stdout.strip())
    assert path == tmp_path / "meta"
    got = {str(p.relative_to(path)) for p in path.rglob("*") if p.is_file()}
    assert got - {".ray_stream_llm.json"} == set(model.metadata)


@pytest.mark.e2e
@pytest.mark.engine
@pytest.mark.slow  # three cold starts: 6-20 minutes on 2 cores; make test-slow
def test_bench_prints_the_table_and_writes_perf_metrics():
    """`ray-stream-llm bench` end to end, scaled down (2 layers, one run): its own S3 server,
    the three cold starts (streamed, downloaded, streamed compiling), the throughput pair and
    the metadata fetches. Kept out of make test: its figures, table and targets are checked
    on a real run's results in tests/test_bench_figures.py, and its control (Ray's own
    loader writes every weight file in the job's HOME) by one tiny-model job in
    tests/test_e2e.py."""
    work = Path(tempfile.mkdtemp(prefix="rsl-bench-", dir="/tmp"))
    try:
        env = {
            "PATH": os.environ["PATH"],
            "HOME": str(work / "home"),
            "RAY_STREAM_LLM_CACHE": str(work / "cache"),
        }
        proc = _cli(
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
        # tests/test_e2e.py's, with the tiny model): the downloaded run wrote every weight
        # file to local disk, in the job's HOME, and its engine, ours, reported nothing
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


# --- `run`'s input files, read as the job reads them (no engine) -----------------------------
def _write_csv(path: Path) -> list[dict]:
    rows = [
        {"id": "1", "question": "What is 2+2?"},
        {"id": "2", "question": "Name three colors, one per line."},
        {"id": "3", "question": 'A "quoted", comma'},
        {"id": "4", "question": "two\nlines"},
    ]
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=["id", "question"])
        writer.writeheader()
        writer.writerows(rows)
    with open(path, newline="", encoding="utf-8") as f:  # the file as the csv module reads it
        return list(csv.DictReader(f))


def _write_parquet(path: Path) -> list[dict]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table(
        {
            "id": [10, 11, 12],
            "prompt": ["What is 2+2?", "two\nlines", 'A "quoted", comma'],
            "messages": [  # chat messages, the other kind of column `run` takes
                [{"role": "user", "content": "hi"}],
                [{"role": "system", "content": "be brief"}, {"role": "user", "content": "yo"}],
                [],
            ],
        }
    )
    pq.write_table(table, path)
    return pq.read_table(path).to_pylist()


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_run_reads_every_row_and_column_of_the_input_file(suffix, tmp_path):
    """The columns `run` checks before Ray starts (batch.input_columns) and the rows its job
    reads (batch.read_input, the Ray dataset run_batch hands the processor) are the file's,
    as the csv module and pyarrow read it: every row, every column, every value (a quoted
    comma, a value over two lines, chat messages); and the rows reach the job while its
    actors hold every CPU of the node."""
    import pyarrow as pa
    import ray

    from ray_stream_llm.commands.batch import input_columns, read_input
    from ray_stream_llm.integrations.ray.builder import MAP_NUM_CPUS

    path = tmp_path / f"questions{suffix}"
    expected = _write_csv(path) if suffix == ".csv" else _write_parquet(path)
    assert input_columns(path) == list(expected[0])
    temp = tempfile.mkdtemp(prefix="rsl-cli-read-", dir="/tmp")
    ray.init(include_dashboard=False, _temp_dir=temp, num_cpus=2, log_to_driver=False)
    try:
        ds = read_input(path, num_cpus=MAP_NUM_CPUS)

        # then the job's actors take every CPU (on 2 CPUs: the engine and the stages): the
        # rows are read already, nothing of the read waits for a CPU (Ray 2.60's Parquet
        # reader listed the file in a task asking a whole one, and `run` waited forever)
        @ray.remote(num_cpus=2)
        class HoldCPUs:  # the job's engine and stages: it only holds their CPUs
            def ready(self) -> bool:
                return True

        holder = HoldCPUs.remote()
        ray.get(holder.ready.remote(), timeout=60)
        batches: list = []
        reading = threading.Thread(
            target=lambda: batches.extend(ds.iter_batches(batch_format="pyarrow", batch_size=None)),
            daemon=True,
        )
        reading.start()
        wait_until(
            lambda: not reading.is_alive(),
            60,
            "the rows were not read while the job's actors held every CPU",
            poll=0.2,
        )
        got = pa.concat_tables(batches).to_pylist()
    finally:
        ray.shutdown()
        shutil.rmtree(temp, ignore_errors=True)
    if suffix == ".csv":  # pyarrow's CSV reader types the ids; the csv module keeps text
        got = [{k: str(v) for k, v in row.items()} for row in got]
    assert sorted(got, key=lambda r: r["id"]) == expected


@pytest.mark.e2e
@pytest.mark.engine
def test_run_answers_a_parquet_file_with_its_progress_shown(s3_server, tiny_models, work):
    """`run --verbose` on a Parquet file, the one engine job of this file: every row of the
    file comes out in answers.parquet with its columns, and the progress is shown: the
    command's own bar (rows), Ray Data's (shown only with --verbose) and Ray's log lines.
    Quiet, its default, shows neither of Ray's: tests/test_readme.py."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ray_stream_llm.tools.isolated import isolated_env

    path = work / "questions.parquet"
    pq.write_table(
        pa.table({"id": [7, 8, 9], "question": ["What is 2+2?", "Say hi.", "Name a color."]}),
        path,
    )
    expected = sorted((r["id"], r["question"]) for r in pq.read_table(path).to_pylist())
    since = time.time()
    args = ["run", tiny_models["single"].uri, str(path), "--column", "question", "--verbose"]
    proc = _cli(
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
    print(f"\nrun --verbose, Parquet: 3/3 rows, {tokens} tokens, {len(output.splitlines())} lines")
