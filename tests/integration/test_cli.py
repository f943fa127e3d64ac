"""The console script as a user types it, against the real S3 server (its engine jobs:
tests/e2e/test_cli.py)."""

from __future__ import annotations

import csv
import json
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

import pytest
from helpers.cli import run_cli
from helpers.waiting import wait_until

pytestmark = [pytest.mark.s3]


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
    proc = run_cli([command, "--help"], env)
    assert proc.returncode == 0 and "Example: ray-stream-llm " + command in proc.stdout


def test_inspect_table_and_json(tiny_models, env):
    model = tiny_models["hub-mirror"]
    table = run_cli(["inspect", model.uri], env)
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
    as_json = run_cli(["inspect", model.uri, "--json"], env)
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
    proc = run_cli(["inspect", "s3://models/cli/bin-only/"], env)
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
    proc = run_cli(args, env, cwd=tmp_path)
    assert proc.returncode != 0
    assert fragment in proc.stderr and "Traceback" not in proc.stderr
    assert len([line for line in proc.stderr.splitlines() if line.strip()]) <= 3


def test_run_with_a_wrong_model_answers_before_ray_starts(env, tiny_models, tmp_path):
    """Issue 13: the model is checked before Ray starts: one line, no Ray output."""
    (tmp_path / "q.jsonl").write_text('{"q": "hi"}\n')
    start = time.monotonic()
    proc = run_cli(
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
    proc = run_cli(
        ["run", tiny_models["single"].uri, "q.jsonl", "--column", "q", "--output", "o"],
        env,
        cwd=tmp_path,
    )
    assert proc.returncode == 2
    assert "no column 'q' in 'q.jsonl'; columns: ['question', 'id']" in proc.stderr


def test_fetch_metadata_prints_the_directory(tiny_models, env, tmp_path):
    model = tiny_models["sharded"]
    proc = run_cli(["fetch-metadata", model.uri, "--dest", str(tmp_path / "meta")], env)
    assert proc.returncode == 0, proc.stderr
    path = Path(proc.stdout.strip())
    assert path == tmp_path / "meta"
    got = {str(p.relative_to(path)) for p in path.rglob("*") if p.is_file()}
    assert got - {".ray_stream_llm.json"} == set(model.metadata)


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
