"""What an engine's processes leave in /dev/shm (ray_stream_llm/integrations/vllm/shm.py), its
own logic on real processes and real segments, without Ray or vLLM: which segments a process
tree maps, that only unmapped segments of the names given are removed, and that the clean-up
after an engine sends its leftover processes a signal only where it is asked to. The segments
are named ``psm_rsltest...`` (a prefix vLLM's own never have) and removed by each test; the
processes are the test's children, ended by it. The node agent doing this in Ray:
tests/integration/test_agent.py."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from ray_stream_llm.integrations.vllm import shm

# A process that maps the /dev/shm segments named on its command line (as vLLM's engine core
# and workers map its ring buffer: shm_open is a file of /dev/shm, mmap'ed), says so, and
# runs until its stdin closes. With "trap", it also reports a SIGTERM and runs on.
CHILD = textwrap.dedent("""
    import mmap, os, signal, sys
    if sys.argv[1] == "trap":
        signal.signal(signal.SIGTERM, lambda *_: print("TERM", flush=True))
    maps = []
    for name in sys.argv[2:]:
        fd = os.open("/dev/shm/" + name, os.O_RDWR)
        maps.append(mmap.mmap(fd, mmap.PAGESIZE))
    print("ready", flush=True)
    sys.stdin.read()
""")


class Child:
    """A child process running :data:`CHILD`, ready (its segments mapped) once made."""

    def __init__(self, *names: str, trap: bool = False) -> None:
        args = [sys.executable, "-c", CHILD, "trap" if trap else "-", *names]
        self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        assert self.proc.stdout.readline().strip() == "ready"  # a signal, not a sleep
        self.pid = self.proc.pid
        self.started = psutil.Process(self.pid).create_time()

    def members(self) -> dict[int, float]:
        return {self.pid: self.started}

    def finish(self) -> str:
        """End it (stdin closed) and return what it printed after ``ready``."""
        out, _ = self.proc.communicate(timeout=10)
        return out

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.communicate(timeout=10)


@pytest.fixture
def segment() -> Iterator[Callable[[str], str]]:
    """Makes ``/dev/shm/psm_rsltest<tag><role>`` segments (one page) on call; removes them after."""
    made: list[Path] = []
    tag = uuid.uuid4().hex[:8]

    def make(role: str) -> str:
        path = shm.SHM_DIR / f"psm_rsltest{tag}{role}"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, os.sysconf("SC_PAGE_SIZE"))
        finally:
            os.close(fd)
        made.append(path)
        return path.name

    try:
        yield make
    finally:
        for path in made:
            path.unlink(missing_ok=True)


@pytest.fixture
def children() -> Iterator[list[Child]]:
    """The test's child processes, killed after it."""
    made: list[Child] = []
    try:
        yield made
    finally:
        for child in made:
            child.kill()


def test_segments_of_a_process_tree_are_the_prefixed_ones_its_processes_map(segment, children):
    mapped = segment("mapped")
    elsewhere = segment("elsewhere")  # made, mapped by no one
    other = f"rsltest{uuid.uuid4().hex[:8]}"  # mapped, but not a vLLM name (no PREFIXES)
    other_path = shm.SHM_DIR / other
    other_path.write_bytes(b"\0" * os.sysconf("SC_PAGE_SIZE"))
    try:
        child = Child(mapped, other)
        children.append(child)
        assert shm._shm_mapped(child.pid) >= {mapped, other}
        assert mapped in shm.segments_of(child.pid)
        assert other not in shm.segments_of(child.pid)
        assert elsewhere not in shm.segments_of(child.pid)
        # the engine actor's own tree: its children's segments are its own
        assert mapped in shm.segments_of(os.getpid())
        members, seen = shm.snapshot(os.getpid())
        assert members[child.pid] == child.started and mapped in seen
        assert child.finish() == ""
        # an exited process maps nothing (its /proc entry is gone or unreadable)
        assert shm._shm_mapped(child.pid) == set()
        assert shm.segments_of(child.pid) == set()
    finally:
        other_path.unlink(missing_ok=True)


def test_only_unmapped_segments_of_the_names_given_and_new_enough_are_removed(segment, children):
    since = time.time() - 1
    held, loose, foreign, old = (segment(r) for r in ("held", "loose", "foreign", "old"))
    os.utime(shm.SHM_DIR / old, (since - 60, since - 60))  # older than the engine
    children.append(Child(held))
    everything = {held, loose, foreign, old}
    assert {p.name for p in shm.orphaned_segments(since, only=everything)} == {loose, foreign}
    assert shm.orphaned_segments(since, only=set()) == []

    removed = shm.remove_orphaned_segments(since, wait=0, only={held, loose, old})
    assert removed == [loose]
    left = {name for name in everything if (shm.SHM_DIR / name).exists()}
    assert left == {held, foreign, old}  # mapped, not asked for, older than `since`

    # once its last mapper has ended, a segment is an orphan and goes
    assert children[0].finish() == ""
    assert shm.remove_orphaned_segments(since, wait=0, only={held}) == [held]


def test_clean_after_without_end_leftovers_sends_no_signal_and_removes_the_rest(
    segment, children, tmp_path, caplog
):
    since = time.time() - 1
    left = segment("left")  # what the engine mapped: unmapped now
    private = tmp_path / "engine-private"
    (private / "sub").mkdir(parents=True)
    (private / "sub" / "file").write_text("x")
    child = Child(trap=True)  # an engine core that outlives its actor, mapping nothing now
    children.append(child)

    with caplog.at_level(logging.INFO, logger=shm.__name__):
        shm.clean_after(
            child.members(),
            {left},
            since,
            [str(private)],
            poll=0.01,
            grace=0.0,
            term_wait=0.05,
            end_leftovers=False,
        )
    assert child.proc.poll() is None  # still running: left to its Ray
    assert not (shm.SHM_DIR / left).exists()
    assert not private.exists()
    assert "left to their Ray to end" in caplog.text
    assert child.finish() == ""  # it saw no SIGTERM


def test_clean_after_with_end_leftovers_terms_then_kills_what_still_runs(children, tmp_path):
    polite, stubborn = Child(), Child(trap=True)  # the second runs on after a SIGTERM
    children += [polite, stubborn]
    shm.clean_after(
        polite.members() | stubborn.members(),
        set(),
        time.time(),
        [str(tmp_path / "never-made")],  # a directory already gone is no error
        poll=0.01,
        grace=0.0,
        term_wait=0.2,
        end_leftovers=True,
    )
    assert polite.proc.wait(timeout=10) == -signal.SIGTERM
    assert stubborn.proc.wait(timeout=10) == -signal.SIGKILL


def test_a_process_is_running_only_while_it_is_the_one_that_started_then(children):
    child = Child()
    children.append(child)
    assert shm.is_running(child.pid) and shm.is_running(child.pid, child.started)
    assert not shm.is_running(child.pid, child.started + 1)  # a reused pid: another process
    child.proc.send_signal(signal.SIGKILL)
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # ended, left unreaped: a zombie
    assert psutil.Process(child.pid).status() == psutil.STATUS_ZOMBIE
    assert not shm.is_running(child.pid)  # a zombie maps nothing and serves no one


def test_janitor_log_sits_beside_the_file_stderr_goes_to(tmp_path):
    code = "from ray_stream_llm.integrations.vllm.shm import janitor_log; print(janitor_log(7))"
    with open(tmp_path / "worker.err", "w") as err:
        to_file = subprocess.run(
            [sys.executable, "-c", code], stderr=err, capture_output=False, stdout=subprocess.PIPE
        )
    assert to_file.stdout.decode().strip() == str(tmp_path / "rsl-janitor-7.log")
    to_pipe = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert to_pipe.stdout.strip() == "None"
