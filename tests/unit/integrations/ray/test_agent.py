"""The node agent's own logic that runs without Ray (ray_stream_llm/integrations/ray/agent.py):
the records it keeps on the node (an engine's processes and segments through JSON, a kept
region's file), where an engine's watch logs, the actor table read as "alive" when it cannot
be read, and the driver's exit finishing what the agents of an ended Ray left (real processes
and /dev/shm segments the test made, records in a state directory of the test's own: never
the node's). The agent in Ray: tests/integration/test_agent.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from ray_stream_llm.integrations.ray import agent
from ray_stream_llm.integrations.vllm import shm

# An engine's process left running: runs until its stdin closes; with "trap", a SIGTERM is
# reported (on stdout) and survived.
LEFTOVER = textwrap.dedent("""
    import signal, sys
    if sys.argv[1] == "trap":
        signal.signal(signal.SIGTERM, lambda *_: print("TERM", flush=True))
    print("ready", flush=True)
    sys.stdin.read()
""")


def start(trap: bool = False) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", LEFTOVER, "trap" if trap else "-"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def started(proc: subprocess.Popen[str] | int) -> tuple[int, float]:
    pid = proc if isinstance(proc, int) else proc.pid
    return pid, psutil.Process(pid).create_time()


@pytest.fixture
def procs() -> Iterator[Callable[..., subprocess.Popen[str]]]:
    """Starts :data:`LEFTOVER` processes; kills those still running after the test."""
    made: list[subprocess.Popen[str]] = []

    def make(trap: bool = False) -> subprocess.Popen[str]:
        made.append(start(trap))
        return made[-1]

    try:
        yield make
    finally:
        for proc in made:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=10)
            for pipe in (proc.stdin, proc.stdout):
                if pipe is not None:
                    pipe.close()


@pytest.fixture
def segments() -> Iterator[Callable[[], Path]]:
    """Makes unmapped ``/dev/shm/psm_rsltest...`` segments; removes those left after the test."""
    made: list[Path] = []

    def make() -> Path:
        path = shm.SHM_DIR / f"psm_rsltest{uuid.uuid4().hex[:12]}"
        path.write_bytes(b"\0" * 4096)
        made.append(path)
        return path

    try:
        yield make
    finally:
        for path in made:
            path.unlink(missing_ok=True)


@pytest.fixture
def state(tmp_path, monkeypatch) -> Path:
    """The agents' state directory for this test alone (the node's is never read here)."""
    directory = tmp_path / "state"
    directory.mkdir()
    monkeypatch.setattr(agent, "state_dir", lambda: directory)
    return directory


def ended_ray() -> tuple[int, float]:
    """The pid and start time of a raylet that has ended (a process started and reaped)."""
    proc = start()
    found = started(proc)
    proc.communicate(timeout=10)
    return found


def record(directory: Path, name: str, **fields: object) -> Path:
    path = directory / f"{name}.json"
    path.write_text(json.dumps(fields))
    return path


# --- the records -------------------------------------------------------------------------------
def test_the_state_dir_is_per_user_on_dev_shm():
    found = agent.state_dir()
    assert found.name == f"ray_stream_llm-agent-{os.getuid()}"
    root = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    assert found.parent == Path(root)  # the same for every job's TMPDIR


def test_an_engines_record_survives_its_json_form():
    engine = agent.EngineRecord(4242, 1700000000.25, (17, 1699999999.5), 1700000000.0, ["/d"])
    engine.set_tree({4242: 1700000000.25, 17: 1700000001.5}, {"vllm_dist_b", "psm_a"})
    assert engine.seen == ["psm_a", "vllm_dist_b"]  # sorted: the same tree, the same file
    text = engine.to_json()
    assert json.loads(text)["members"] == {"4242": 1700000000.25, "17": 1700000001.5}
    assert agent.EngineRecord.from_json(text) == engine
    with pytest.raises(ValueError, match="not an engine record"):
        agent.EngineRecord.from_json(json.dumps({"pid": 1}))


def test_a_region_is_recorded_once_by_its_path_with_this_workers_parent(tmp_path):
    region = "/dev/shm/ray_stream_llm/regions/model-a"
    first = agent._record_region(tmp_path, region)
    assert first.parent == tmp_path / "regions" and first.suffix == ".json"
    assert agent._record_region(tmp_path, region) == first  # asked again: the same record
    other = agent._record_region(tmp_path, region + "-b")
    assert other != first and sorted((tmp_path / "regions").iterdir()) == sorted([first, other])
    assert json.loads(first.read_text()) == {
        "region": region,
        "raylet": list(started(os.getppid())),
    }
    assert [p.name for p in (tmp_path / "regions").iterdir() if p.name.startswith(".")] == []


def test_an_engines_watch_logs_to_its_own_file_only_where_its_directory_is(tmp_path):
    pid = int(uuid.uuid4().int % 10**9)
    log = agent._engine_log(str(tmp_path / f"rsl-janitor-{pid}.log"), pid)
    try:
        log.info("watching actor %d", pid)
        for handler in log.handlers:
            handler.flush()
        assert f"watching actor {pid}" in (tmp_path / f"rsl-janitor-{pid}.log").read_text()
        assert not log.propagate  # not in the agent's log as well
    finally:
        for handler in list(log.handlers):
            log.removeHandler(handler)
            handler.close()
    gone = agent._engine_log(str(tmp_path / "session-gone" / "rsl-janitor-1.log"), pid + 1)
    assert gone.handlers == [] and gone.propagate  # the agent's log
    assert agent._engine_log(None, pid + 2).handlers == []


def test_an_actor_is_alive_where_the_actor_table_cannot_be_read():
    import ray

    assert not ray.is_initialized()  # no Ray here: its table cannot be read
    assert agent.actor_alive("ff" * 16)  # a region is never removed under a holder
    assert not ray.is_initialized()  # and none was started to read it


# --- the driver's exit -------------------------------------------------------------------------
def test_finish_orphaned_ends_what_an_ended_rays_engine_left_and_nothing_of_a_running_ray(
    state, tmp_path, procs, segments
):
    actor, core, other = procs(), procs(), procs()
    gone_segment, kept_segment = segments(), segments()
    gone_dir, kept_dir = tmp_path / "engine-gone", tmp_path / "engine-kept"
    gone_dir.mkdir()
    kept_dir.mkdir()
    since = min(p.stat().st_mtime for p in (gone_segment, kept_segment)) - 1
    gone = record(
        state,
        "gone",
        pid=actor.pid,
        started=started(actor)[1],
        raylet=list(ended_ray()),
        since=since,
        dirs=[str(gone_dir)],
        members={str(p): t for p, t in (started(actor), started(core))},
        seen=[gone_segment.name],
    )
    running = record(
        state,
        "running",
        pid=other.pid,
        started=started(other)[1],
        raylet=list(started(os.getpid())),  # this process: a Ray that still runs
        since=since,
        dirs=[str(kept_dir)],
        members={str(other.pid): started(other)[1]},
        seen=[kept_segment.name],
    )
    unreadable = state / "torn.json"
    unreadable.write_text("{")

    assert agent.finish_orphaned(wait=0.0) == [actor.pid]
    # the ended Ray's engine: its actor and its engine core ended, its segment and dir gone
    assert actor.wait(timeout=10) in (-signal.SIGTERM, -signal.SIGKILL)
    assert core.wait(timeout=10) in (-signal.SIGTERM, -signal.SIGKILL)
    assert not gone_segment.exists() and not gone_dir.exists() and not gone.exists()
    # the running Ray's engine is its agent's: nothing of it touched
    assert other.poll() is None
    assert kept_segment.exists() and kept_dir.exists() and running.exists()
    assert not unreadable.exists()  # a record that cannot be read is not tried again


def test_finish_orphaned_sends_no_signal_where_the_ending_ray_ends_its_processes(
    state, procs, segments
):
    leftover = procs(trap=True)  # would report a SIGTERM and survive it
    segment = segments()
    raylet = ended_ray()
    record(
        state,
        "engine",
        pid=leftover.pid,
        started=started(leftover)[1],
        raylet=list(raylet),
        since=segment.stat().st_mtime - 1,
        dirs=[],
        members={str(leftover.pid): started(leftover)[1]},
        seen=[segment.name],
    )
    assert leftover.stdin is not None
    leftover.stdin.close()  # its Ray ends it: it exits by itself
    assert agent.finish_orphaned(ending={raylet}, wait=0.0, ray_ends=True) == [leftover.pid]
    assert leftover.wait(timeout=10) == 0
    assert leftover.stdout is not None and leftover.stdout.read() == ""  # never sent SIGTERM
    assert not segment.exists() and list(state.iterdir()) == []
