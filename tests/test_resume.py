"""Long jobs made resumable (issue 35 item 1), on real parts: SeaweedFS, vLLM's CPU build,
a real local Ray, Ray Data's own job checkpointing (``CheckpointConfig``, Ray >= 2.54).

- A job (``read_json`` of 12 files -> the library's processor -> ``write_parquet``) whose
  driver is SIGKILLed once its first output file appears, then run again with the same
  command in a fresh HOME: every id is written exactly once across both runs, the re-run
  writes fewer rows than the input holds, its engine loads the compiled artifact the
  first run shipped to ``compile_cache_uri`` (``compile_cache: hit``), and, with
  ``keep_warm_s``, the node's copy of the weights that the killed job left (kept warm by its
  reaper) is adopted by the re-run, which reads no weight byte from the store.
- The same job on a 2-CPU local Ray, killed and resumed: both runs make progress (the
  small-cluster defaults leave a CPU for the file read and write around the processor,
  and, on the re-run, for Ray's ``CheckpointFilter`` actor).
- ``ray-stream-llm run --resume``: killed after its first batch is recorded, run again, it
  answers only the rows that are missing.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from helpers.jobs import wait_regions_released
from helpers.s3log import AccessLog, prefix_of
from helpers.waiting import wait_until

from ray_stream_llm.tools.isolated import isolated_env

DRIVER = Path(__file__).parent / "helpers" / "resume_job.py"
FILES, ROWS_PER_FILE = 12, 4
ROWS = FILES * ROWS_PER_FILE
HEADER_READS = 2  # GETs of one safetensors object by the driver's check of its header


def write_input(root: Path) -> Path:
    """12 JSONL files of 4 questions each, ids 0..47."""
    root.mkdir(parents=True)
    for f in range(FILES):
        lines = [
            json.dumps({"id": i, "question": f"What is {i} plus {i}?"})
            for i in range(f * ROWS_PER_FILE, (f + 1) * ROWS_PER_FILE)
        ]
        (root / f"part-{f:02d}.jsonl").write_text("\n".join(lines) + "\n")
    return root


def output_ids(output: Path) -> list[int]:
    """The ids of every row in the Parquet files under ``output``."""
    ids: list[int] = []
    for path in sorted(output.glob("*.parquet")):
        ids += pq.read_table(path, columns=["id"]).column("id").to_pylist()
    return ids


def _group_alive(pgid: int) -> bool:
    """Whether any process of process group ``pgid`` (the job's session) is still there."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid and fields[0] != "Z":
                return True
    return False


def start_job(run_dir: Path, spec: dict, server_env: dict[str, str]) -> subprocess.Popen:
    """The job's driver in its own session and HOME, as a user's command would run."""
    run_dir.mkdir(parents=True)
    (run_dir / "spec.json").write_text(json.dumps(spec))
    env = isolated_env(run_dir, server_env)
    log = open(run_dir / "job.log", "w")  # noqa: SIM115 (closed with the process)
    return subprocess.Popen(
        [sys.executable, str(DRIVER), str(run_dir / "spec.json")],
        env=env,
        cwd=run_dir,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def finish(proc: subprocess.Popen, run_dir: Path, timeout: float) -> None:
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        tail = (run_dir / "job.log").read_text("utf-8", "replace")[-6000:]
        pytest.fail(f"the job did not finish within {timeout:.0f} s; its log ends:\n{tail}")
    assert rc == 0, (run_dir / "job.log").read_text("utf-8", "replace")[-6000:]


def spec_for(
    work: Path,
    run: str,
    model: str,
    num_cpus: int,
    cache_uri: str | None,
    config: dict | None = None,
) -> dict:
    return {
        "config": config or {},
        "model": model,
        "input": str(work / "input"),
        "output": str(work / "output"),
        "checkpoint": str(work / "checkpoint"),
        "num_cpus": num_cpus,
        "ray_temp_dir": str(work / run / "ray"),
        "compile_cache_uri": cache_uri,
        "report": str(work / run / "report.json"),
    }


def kill_at_first_output(proc: subprocess.Popen, output: Path) -> list[int]:
    """SIGKILL the job's driver once its first output file appears (its Ray goes with its
    session); the ids written before the kill."""
    try:
        wait_until(
            lambda: any(output.glob("*.parquet")) or proc.poll() is not None,
            600,
            "no output file from the first run",
        )
        assert proc.poll() is None, "the first run ended before it could be killed"
        os.kill(proc.pid, signal.SIGKILL)  # the driver only: its Ray goes with its session
        proc.wait()
    finally:
        if _group_alive(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)
    wait_until(lambda: not _group_alive(proc.pid), 60, "the killed job's processes linger")
    ids = output_ids(output)
    assert 0 < len(ids) < ROWS
    return ids


@pytest.fixture
def sharing_dir():
    """The jobs' weight_sharing_dir (memory-backed); removed at the end with what a job kept
    warm in it (its reaper exits once the region is gone)."""
    path = Path("/dev/shm") / f"rsl-resume-{uuid.uuid4().hex[:8]}"
    yield path
    shutil.rmtree(path, ignore_errors=True)


def kept_warm(base: Path) -> list[Path]:
    """The regions under ``base`` kept warm for a later job (``.warm_until`` set)."""
    return [r for r in base.glob("*/*") if (r / ".warm_until").is_file()]


def weight_gets(log: AccessLog, model: str) -> dict[str, int]:
    """GETs of the model's safetensors objects the store answered since ``log`` began."""
    return {k: n for k, n in log.gets(prefix_of(model)).items() if k.endswith(".safetensors")}


@pytest.mark.s3
@pytest.mark.e2e
@pytest.mark.engine
def test_a_killed_job_resumes_warm_and_writes_every_id_once(
    s3_server, tiny_models, work, sharing_dir
):
    write_input(work / "input")
    model = tiny_models["single"].uri
    cache_uri = f"s3://models/compile-cache/{uuid.uuid4().hex[:8]}/"
    config = {"keep_warm_s": 600, "weight_sharing_dir": str(sharing_dir)}
    first_log = AccessLog(s3_server)
    first = start_job(
        work / "first", spec_for(work, "first", model, 4, cache_uri, config), s3_server.env()
    )
    first_ids = kill_at_first_output(first, work / "output")
    first_gets = weight_gets(first_log, model)
    assert first_gets, "the first run read the weights from the store"
    # the killed job's engine died with it: its region's reaper (a process of its own
    # session) keeps the complete copy warm once no live process holds it
    [region] = wait_until(
        lambda: kept_warm(sharing_dir),
        60,
        lambda: f"nothing kept warm: {list(sharing_dir.rglob('*'))}",
    )

    log = AccessLog(s3_server)
    second = start_job(
        work / "second", spec_for(work, "second", model, 4, cache_uri, config), s3_server.env()
    )
    finish(second, work / "second", 600)
    rerun_gets = weight_gets(log, model)
    ids = output_ids(work / "output")
    rerun_rows = len(ids) - len(first_ids)
    assert sorted(ids) == list(range(ROWS)), "every id exactly once across both runs"
    assert 0 < rerun_rows < ROWS, f"the re-run wrote {rerun_rows} of {ROWS} rows"
    [report] = json.loads((work / "second" / "report.json").read_text())
    assert report["compile_cache"] == "hit", report["line"]
    # the re-run's engine streamed the whole model from the node's region, which it adopted
    # (the same weights, moved from the killed Ray session's node id to this one's) ...
    assert report["weight_sharing"] == "node", report["line"]
    weights = sum(f.stat().st_size for f in tiny_models["single"].local.glob("*.safetensors"))
    assert report["weight_bytes"] == weights, report["line"]
    [adopted] = wait_until(lambda: kept_warm(sharing_dir), 60, "the re-run kept nothing warm")
    assert not region.exists() and adopted.name == region.name, (region, adopted)
    assert adopted.parent.name != region.parent.name  # another Ray session's node id
    # ... and no weight byte came from the store: the re-run's only GETs of the weight
    # objects are the driver's header check (ray_stream_llm.manifest: two ranged GETs each,
    # the 8-byte length and the JSON header); the first run's pull read them besides
    assert rerun_gets == dict.fromkeys(first_gets, HEADER_READS), (rerun_gets, first_gets)
    assert all(n > HEADER_READS for n in first_gets.values()), first_gets
    assert (report["pull_source"], report["pull_bytes"]) == ("kept warm", 0), report["line"]
    print(
        f"first run: {len(first_ids)} rows before the kill, weight GETs {dict(first_gets)}; "
        f"re-run: {rerun_rows} rows, weight GETs {rerun_gets}; kept copy {region} adopted as "
        f"{adopted}; re-run's engine: {report['line']}; its pull figures: "
        f"pull_bytes={report['pull_bytes']} pull_source={report['pull_source']}"
    )


@pytest.mark.s3
@pytest.mark.e2e
@pytest.mark.engine
def test_a_checkpointed_job_resumes_on_a_two_cpu_ray(s3_server, tiny_models, work):
    """Killed at its first output file and run again, both on a 2-CPU Ray: the re-run, whose
    graph holds Ray's CheckpointFilter actor besides the processor's, finishes."""
    write_input(work / "input")
    model = tiny_models["single"].uri
    start = time.time()
    first = start_job(work / "first", spec_for(work, "first", model, 2, None), s3_server.env())
    first_ids = kill_at_first_output(first, work / "output")
    wait_regions_released(start)
    second = start_job(work / "second", spec_for(work, "second", model, 2, None), s3_server.env())
    finish(second, work / "second", 420)
    wait_regions_released(start)
    ids = output_ids(work / "output")
    assert sorted(ids) == list(range(ROWS)), "every id exactly once across both runs"
    print(f"2 CPUs: {len(first_ids)} rows before the kill, {len(ids) - len(first_ids)} after")


@pytest.mark.s3
@pytest.mark.e2e
@pytest.mark.engine
def test_run_resume_answers_only_what_a_killed_run_left(s3_server, tiny_models, work):
    """``ray-stream-llm run --resume``, on an input without an ``id`` column (rows keyed by
    their position): killed once its first batch is recorded, the same command again
    answers only the rows not recorded, and answers.parquet holds each row once."""
    questions = [f"What is {i} plus {i}?" for i in range(12)]
    (work / "q.jsonl").write_text("".join(json.dumps({"question": q}) + "\n" for q in questions))
    record = work / "record"
    argv = [
        str(Path(sys.executable).with_name("ray-stream-llm")), "run", tiny_models["single"].uri,
        str(work / "q.jsonl"), "--column", "question", "--output", str(work / "out"),
        "--resume", str(record), "--batch-size", "2", "--max-tokens", "4",
    ]  # fmt: skip

    def start(run: str) -> subprocess.Popen:
        (work / run).mkdir()
        env = isolated_env(work / run, s3_server.env())
        log = open(work / run / "job.log", "w")  # noqa: SIM115 (closed with the process)
        return subprocess.Popen(argv, env=env, cwd=work / run, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip

    start_s = time.time()
    first = start("first")
    try:
        wait_until(
            lambda: any(record.glob("*.parquet")) or first.poll() is not None,
            600,
            "nothing recorded by the first run",
        )
        assert first.poll() is None, (work / "first" / "job.log").read_text()[-4000:]
        os.kill(first.pid, signal.SIGKILL)
        first.wait()
    finally:
        if _group_alive(first.pid):
            os.killpg(first.pid, signal.SIGKILL)
    wait_until(lambda: not _group_alive(first.pid), 60, "the killed run's processes linger")
    wait_regions_released(start_s)
    recorded = sum(pq.read_table(p).num_rows for p in record.glob("*.parquet"))
    assert 0 < recorded < len(questions)
    second = start("second")
    finish(second, work / "second", 600)
    log = (work / "second" / "job.log").read_text()
    assert f"resumed: {recorded} row(s) recorded in {record} before this run, " in log, log
    assert f"{len(questions) - recorded} answered now" in log, log
    answers = pq.read_table(work / "out" / "answers.parquet").to_pylist()
    assert [a["question"] for a in answers] == questions  # each row once, in the file's order
    assert all(a["generated_text"] for a in answers)
    positions = [r for p in record.glob("*.parquet") for r in pq.read_table(p)["__row"].to_pylist()]
    assert sorted(positions) == list(range(len(questions)))  # recorded once each, both runs
    print(f"run --resume: {recorded} rows recorded before the kill, the rest after")


@pytest.mark.s3
def test_the_resume_record_in_a_store_prefix_and_a_shared_dir(s3_server, no_aws_env, tmp_path):
    """What ``run --resume`` records (no engine): each batch one Parquet file, read back
    whole, in an ``s3://`` prefix of the store given only as an ObjectStoreConfig (the
    test's environment holds no AWS variable) and in a directory; an input without an
    ``id`` column keyed by position; a repeated id refused, naming the column."""
    import pyarrow as pa

    from ray_stream_llm.commands.batch import InputError, ResumeLog, keyed_input
    from ray_stream_llm.stores.settings import ObjectStoreConfig

    store = ObjectStoreConfig(
        endpoint_url=s3_server.endpoint_url,
        region_name=s3_server.region,
        aws_access_key_id=s3_server.access_key_id,
        aws_secret_access_key=s3_server.secret_access_key,
    )
    prefix = f"s3://models/resume-record/{uuid.uuid4().hex[:8]}/"
    for location, object_store in ((prefix, store), (str(tmp_path / "record"), None)):
        log = ResumeLog(location, object_store)
        assert log.recorded() is None
        log.record(pa.table({"id": [1, 2], "generated_text": ["a", "b"]}))
        log.record(pa.table({"id": [3], "generated_text": ["c"]}))
        again = ResumeLog(location, object_store)
        assert sorted(again.recorded()["id"].to_pylist()) == [1, 2, 3], location
        assert len(again._parts()) == 2, location  # one file per batch, no partial one
    assert any(r.uri.startswith(prefix) and r.method == "GET" for r in s3_server.served())

    plain = tmp_path / "plain.jsonl"
    plain.write_text('{"question": "a"}\n{"question": "b"}\n')
    table, key = keyed_input(plain)
    assert key == "__row" and table["__row"].to_pylist() == [0, 1]
    twice = tmp_path / "twice.jsonl"
    twice.write_text('{"id": 7, "question": "a"}\n{"id": 7, "question": "b"}\n')
    with pytest.raises(InputError, match="'id' column .* repeats a value"):
        keyed_input(twice)
