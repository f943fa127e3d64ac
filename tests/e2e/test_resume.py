"""Long jobs made resumable (issue 35 item 1), on real parts: SeaweedFS, vLLM's CPU build,
a real local Ray, Ray Data's own job checkpointing (``CheckpointConfig``, Ray >= 2.54).

- A job (``read_json`` of 12 files -> the library's processor -> ``write_parquet`` to the
  store) whose output goes through a link that holds every output file's PUT after the
  first, SIGKILLed once Ray Data has committed that first file (so the kill falls between
  two output files, whatever the machine's speed), then run again with the same command
  in a fresh HOME, straight to the store: every id is written exactly once across both
  runs, the re-run writes fewer rows than the input holds, its engine loads the compiled
  artifact the first run shipped to ``compile_cache_uri`` (``compile_cache: hit``), and,
  with ``keep_warm_s``, the node's copy of the weights that the killed job left (whole,
  held by no live process, its keeper killed with its Ray) is adopted by the re-run, which
  keeps it warm from then on and reads no weight byte from the store. Both runs on a 2-CPU
  local Ray: both make progress (the small-cluster defaults leave a CPU for the
  file read and write around the processor, and, on the re-run, for Ray's
  ``CheckpointFilter`` actor).
- ``ray-stream-llm run --resume``: killed after its first batch is recorded, run again, it
  answers only the rows that are missing.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers.janitors import segments_left
from helpers.jobs import (
    reads_under,
    share_model_records,
    wait_regions_released,
    weights_on_local_disk,
)
from helpers.links import TappedLink
from helpers.models import is_weight
from helpers.paths import HELPERS
from helpers.s3log import BUCKET, AccessLog, prefix_of
from helpers.waiting import wait_until

from ray_stream_llm.tools.isolated import isolated_env
from ray_stream_llm.weights import marks

DRIVER = HELPERS / "resume_job.py"
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


def output_ids(client: Any, prefix: str) -> dict[str, list[int]]:
    """The ids of the rows in each Parquet object under ``prefix`` of the store, by name (an
    object is there once its PUT has ended: whole)."""
    listed = client.list_objects_v2(Bucket=BUCKET, Prefix=f"{prefix}/").get("Contents", [])
    return {
        o["Key"].rsplit("/", 1)[1]: pq.read_table(
            pa.BufferReader(client.get_object(Bucket=BUCKET, Key=o["Key"])["Body"].read()),
            columns=["id"],
        )
        .column("id")
        .to_pylist()
        for o in sorted(listed, key=lambda o: o["Key"])
        if o["Key"].endswith(".parquet")
    }


def _committed(checkpoint: Path) -> list[Path]:
    """The checkpoints Ray Data committed (its two-phase commit renames
    ``<id>.pending.parquet`` to ``<id>.parquet`` once the task's output file is written)."""
    found = checkpoint.rglob("*.parquet") if checkpoint.is_dir() else []
    return [p for p in found if not p.name.endswith(".pending.parquet")]


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


def start_job(
    run_dir: Path, spec: dict, server_env: dict[str, str], records: Path
) -> subprocess.Popen:
    """The job's driver in its own session and HOME (with the session's vLLM model-class
    records, ``records``), as a user's command would run."""
    run_dir.mkdir(parents=True)
    share_model_records(run_dir, records)
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


def _log_tail(run_dir: Path) -> str:
    """The last 6,000 characters of the job's log (:func:`start_job` writes it)."""
    return (run_dir / "job.log").read_text("utf-8", "replace")[-6000:]


def finish(proc: subprocess.Popen, run_dir: Path, timeout: float) -> None:
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        tail = _log_tail(run_dir)
        pytest.fail(f"the job did not finish within {timeout:.0f} s; its log ends:\n{tail}")
    assert rc == 0, _log_tail(run_dir)


def spec_for(
    work: Path,
    run: str,
    model: str,
    output: str,
    num_cpus: int,
    cache_uri: str | None,
    config: dict | None = None,
) -> dict:
    return {
        "config": config or {},
        "model": model,
        "input": str(work / "input"),
        "output": output,
        "checkpoint": str(work / "checkpoint"),
        "num_cpus": num_cpus,
        "ray_temp_dir": str(work / run / "ray"),
        "compile_cache_uri": cache_uri,
        "report": str(work / run / "report.json"),
    }


def kill_at_first_output(
    proc: subprocess.Popen, run_dir: Path, link: TappedLink, checkpoint: Path
) -> None:
    """SIGKILL the job's driver (started by :func:`start_job` in ``run_dir``, its output
    written through ``link``, which holds every output file's PUT after the first) once Ray
    Data has committed the first file's checkpoint and a second file waits for its PUT:
    the kill falls between two output files whatever the machine's speed (its Ray goes
    with its session)."""
    try:
        wait_until(
            lambda: (link.held_requests and _committed(checkpoint)) or proc.poll() is not None,
            600,
            "no output file from the first run",
        )
        if proc.poll() is not None:  # the job's own log says why (CI shows the message)
            tail = _log_tail(run_dir)
            pytest.fail(
                f"the first run ended (exit {proc.returncode}) before it could be "
                f"killed; its log ends:\n{tail}"
            )
        os.kill(proc.pid, signal.SIGKILL)  # the driver only: its Ray goes with its session
        proc.wait()
    finally:
        if _group_alive(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)
    wait_until(lambda: not _group_alive(proc.pid), 60, "the killed job's processes linger")


@pytest.fixture
def sharing_dir():
    """The jobs' weight_sharing_dir (memory-backed); removed at the end with what a job kept
    warm in it."""
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
def test_a_killed_job_resumes_warm_on_two_cpus_and_writes_every_id_once(
    s3_server, tiny_models, work, sharing_dir, vllm_modelinfos
):
    write_input(work / "input")
    model = tiny_models["single"].uri
    cache_uri = f"s3://models/compile-cache/{uuid.uuid4().hex[:8]}/"
    prefix = f"resume-{uuid.uuid4().hex[:8]}"
    output = f"s3://{BUCKET}/{prefix}"
    config = {"keep_warm_s": 600, "weight_sharing_dir": str(sharing_dir)}
    first_log = AccessLog(s3_server)
    with TappedLink(s3_server.port) as link:
        link.hold(rf"^PUT /{BUCKET}/{prefix}/[^ ?]*\.parquet", after=1)
        first = start_job(
            work / "first",
            spec_for(work, "first", model, output, 2, cache_uri, config),
            link.store_env(s3_server.env()),
            vllm_modelinfos,
        )
        kill_at_first_output(first, work / "first", link, work / "checkpoint")
    first_files = output_ids(s3_server.client(), prefix)
    assert 0 < sum(map(len, first_files.values())) < ROWS, first_files
    first_gets = weight_gets(first_log, model)
    assert first_gets, "the first run read the weights from the store"
    # the killed job's engine, and its node's agent (the region's keeper), died with it:
    # its complete copy of the weights is left, which the re-run finds
    [region] = [r for r in sharing_dir.glob("*/*") if marks.objects_of(r)]
    assert all(marks.done(region, o.path) for o in marks.objects_of(region))

    log = AccessLog(s3_server)
    second = start_job(
        work / "second",
        spec_for(work, "second", model, output, 2, cache_uri, config),
        s3_server.env(),
        vllm_modelinfos,
    )
    finish(second, work / "second", 600)
    rerun_gets = weight_gets(log, model)
    files = output_ids(s3_server.client(), prefix)
    ids = [i for file_ids in files.values() for i in file_ids]
    rerun_rows = sum(len(v) for name, v in files.items() if name not in first_files)
    assert sorted(ids) == list(range(ROWS)), "every id exactly once across both runs"
    assert 0 < rerun_rows < ROWS, f"the re-run wrote {rerun_rows} of {ROWS} rows"
    [report] = json.loads((work / "second" / "report.json").read_text())
    assert report["compile_cache"] == "hit", report["line"]
    # the re-run's engine streamed the whole model from the node's region, which it adopted
    # (the same weights, moved from the killed Ray session's node id to this one's) and
    # kept warm for its keep_warm_s once it ended (its driver's exit retired it) ...
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
        f"first run: {sum(map(len, first_files.values()))} rows before the kill, "
        f"weight GETs {dict(first_gets)}; "
        f"re-run: {rerun_rows} rows, weight GETs {rerun_gets}; kept copy {region} adopted as "
        f"{adopted}; re-run's engine: {report['line']}; its pull figures: "
        f"pull_bytes={report['pull_bytes']} pull_source={report['pull_source']}"
    )


@pytest.mark.s3
@pytest.mark.e2e
@pytest.mark.engine
def test_run_resume_answers_only_what_a_killed_run_left(
    s3_server, tiny_models, work, vllm_modelinfos
):
    """``ray-stream-llm run --resume s3://...``, on a Parquet file without an ``id`` column
    (rows keyed by their position): killed while it records its second batch (the store
    behind a link that lets the record's first PUT through and holds the next, so that the
    kill falls between two records whatever the machine's load: all the answers can come
    out at once), the same command again (``--verbose``) answers only the rows not recorded,
    and answers.parquet holds each row once. The re-run shows its progress: the command's
    own bar, Ray Data's (shown only with --verbose) and Ray's log lines; quiet, its default,
    shows neither of Ray's (tests/e2e/test_readme.py). The model is a mirror of a Hub
    repository (the tiny model's safetensors beside its .bin, .pth, .gguf and more): the
    store served its safetensors alone to both runs, no weight file of any format was
    written to local disk, and the job's metadata directory holds exactly the model's
    metadata files."""
    questions = [f"What is {i} plus {i}?" for i in range(12)]
    pq.write_table(pa.table({"question": questions}), work / "q.parquet")
    model = tiny_models["hub-mirror"]
    prefix = f"record-{uuid.uuid4().hex[:8]}"
    record = f"s3://{BUCKET}/{prefix}/"
    argv = [
        str(Path(sys.executable).with_name("ray-stream-llm")), "run", model.uri,
        str(work / "q.parquet"), "--column", "question", "--output", str(work / "out"),
        "--resume", record, "--batch-size", "2", "--max-tokens", "4",
        # what is under test is the record, not vLLM's compile (the README's `run` compiles)
        "--engine-kwarg", "enforce_eager=true",
    ]  # fmt: skip

    def start(run: str, env: dict[str, str], *more: str) -> subprocess.Popen:
        (work / run).mkdir()
        share_model_records(work / run, vllm_modelinfos)
        log = open(work / run / "job.log", "w")  # noqa: SIM115 (closed with the process)
        return subprocess.Popen(
            [*argv, *more],
            env=isolated_env(work / run, env),
            cwd=work / run,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def recorded_tables() -> list[pa.Table]:
        client = s3_server.client()
        listed = client.list_objects_v2(Bucket=BUCKET, Prefix=f"{prefix}/").get("Contents", [])
        return [
            pq.read_table(
                pa.BufferReader(client.get_object(Bucket=BUCKET, Key=o["Key"])["Body"].read())
            )
            for o in listed
            if o["Key"].endswith(".parquet")
        ]

    start_s, before = time.time(), s3_server.served()
    with TappedLink(s3_server.port) as link:
        link.hold(rf"^PUT /{BUCKET}/{prefix}/", after=1)
        first = start("first", link.store_env(s3_server.env()))
        try:
            wait_until(
                lambda: link.held_requests or first.poll() is not None,
                600,
                "the first run never recorded a second batch",
            )
            assert first.poll() is None, (work / "first" / "job.log").read_text()[-4000:]
            os.kill(first.pid, signal.SIGKILL)
            first.wait()
        finally:
            if _group_alive(first.pid):
                os.killpg(first.pid, signal.SIGKILL)
    # the link closed: the held PUT was never forwarded
    wait_until(lambda: not _group_alive(first.pid), 60, "the killed run's processes linger")
    wait_regions_released(start_s)
    tables = recorded_tables()
    recorded = sum(t.num_rows for t in tables)
    puts = [r for r in link.requests if r.startswith("PUT ")]
    assert len(tables) == 1 and 0 < recorded < len(questions), (len(tables), recorded, puts)
    second = start("second", s3_server.env(), "--verbose")
    finish(second, work / "second", 600)
    log = (work / "second" / "job.log").read_text()
    assert f"resumed: {recorded} row(s) recorded in {record} before this run, " in log, log
    assert f"{len(questions) - recorded} answered now" in log, log
    answers = pq.read_table(work / "out" / "answers.parquet").to_pylist()
    assert [a["question"] for a in answers] == questions  # each row once, in the file's order
    assert all(a["generated_text"] for a in answers)
    positions = [r for t in recorded_tables() for r in t["__row"].to_pylist()]
    assert sorted(positions) == list(range(len(questions)))  # recorded once each, both runs
    # the re-run's progress, shown: the command's bar, Ray Data's and Ray's own lines
    tokens = sum(a["num_generated_tokens"] for a in answers)
    assert f"rows: {len(questions)}/{len(questions)}  generated tokens: {tokens}" in log, log
    assert re.search(r"Answering: 100%", log.replace("\r", "\n")), log[-3000:]
    assert "Running Dataset:" in log and "Started a local Ray instance" in log, log[-3000:]
    assert segments_left(start_s) == []  # the engines' shared memory was released
    # the mirror: its safetensors streamed, no weight file of any format on local disk, and
    # the metadata the engine read beside them fetched whole
    reads = reads_under(s3_server, model.uri, before)
    weight_reads = {u.removeprefix(model.uri) for u in reads if is_weight(u.rsplit("/", 1)[1])}
    assert weight_reads == {"model.safetensors"}, weight_reads
    assert weights_on_local_disk(work, start_s) == {}
    home = work / "second" / "home" / ".cache" / "ray_stream_llm" / "models"
    [metadata] = [p for p in home.iterdir() if p.is_dir()]
    got = {str(p.relative_to(metadata)) for p in metadata.rglob("*") if p.is_file()}
    assert got - {".ray_stream_llm.json"} == set(model.metadata), got
    print(f"run --resume: {recorded} rows recorded before the kill, the rest after")
