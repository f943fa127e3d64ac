"""The node agents (ray_stream_llm.integrations.ray.agent: they clean up after the engines) and the
regions' reapers (ray_stream_llm.weights.region, detached processes), seen from the tests."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import psutil

from helpers.waiting import wait_until
from ray_stream_llm.integrations.vllm.shm import orphaned_segments, remove_orphaned_segments

REAPER_MODULE = "ray_stream_llm.weights.region"

# a process that maps a /dev/shm segment of its own (``{name}``) and waits: vLLM's engine
# core or worker, in the tests of what an engine's processes leave
SEGMENT_MAPPER = textwrap.dedent("""
    import mmap, os, time
    fd = os.open("/dev/shm/{name}", os.O_RDWR | os.O_CREAT, 0o600)
    os.ftruncate(fd, mmap.PAGESIZE)
    m = mmap.mmap(fd, mmap.PAGESIZE)
    print("mapped", flush=True)
    time.sleep(600)
""")


def reapers(region: Path | str | None = None) -> list[psutil.Process]:
    """The regions' reapers running now (``python -m ray_stream_llm.weights.region reap
    <region>``, weights/region.py's ``_spawn_reaper``), with ``region`` only that region's.
    A reaper is matched by its arguments wherever they stand in its command line: just
    started, it can still be the ``setsid`` that execs it."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        for i in range(len(cmdline) - 3):
            if cmdline[i : i + 3] == ["-m", REAPER_MODULE, "reap"] and (
                region is None or cmdline[i + 3] == str(region)
            ):
                found.append(proc)
                break
    return found


def agents() -> list[psutil.Process]:
    """The node agents running now (Ray actors: ``ray::NodeAgent`` in their command line)."""
    return [
        proc
        for proc in psutil.process_iter(["cmdline"])
        if "ray::NodeAgent" in " ".join(proc.info["cmdline"] or [])
    ]


def _reapers_waiting_on_nothing(since: float) -> list[str]:
    """The regions' reapers started since ``since`` whose region (their last argument) no
    longer exists: they end within a second or two of that, whatever else runs; one watching
    an existing region belongs to a job still running (on a shared machine, maybe not this
    run's, and never this run's once its jobs are done: a leaked region is a leftover of its
    own). ``"pid: command line"`` each."""
    found = []
    for proc in psutil.process_iter(["cmdline", "create_time", "status"]):
        cmdline = proc.info["cmdline"] or []
        if (proc.info["create_time"] or 0) < since or proc.info["status"] == "zombie":
            continue
        reaper = cmdline[1:4] == ["-m", REAPER_MODULE, "reap"] and len(cmdline) > 4
        if reaper and not os.path.exists(cmdline[4]):
            found.append(f"{proc.pid}: {' '.join(cmdline)}")
    return found


def wait_for_detached(since: float, timeout: float = 120.0) -> list[str]:
    """Wait until the regions' reapers started since ``since`` whose region is gone have
    finished; what a run left behind is judged once they are done. Returns those still
    running after ``timeout`` s (``"pid: command line"`` each; none, normally)."""
    try:
        wait_until(lambda: not _reapers_waiting_on_nothing(since), timeout, "reapers", poll=0.5)
    except AssertionError:
        return _reapers_waiting_on_nothing(since)
    return []


def segments_left(start: float) -> list[str]:
    """The ``/dev/shm/psm_*`` segments a run that began at ``start`` left behind: created
    since then and mapped by no process, looked at again once no node agent runs when there
    are any (an agent removes an engine's after the engine's last process has exited, which
    can be after the run returns; with nothing to watch it ends). Removed either way, so
    that the machine stays clean; the names are returned for the test to judge."""
    left = orphaned_segments(start - 1)
    if left:
        wait_until(lambda: not agents() or not orphaned_segments(start - 1), 120, "the node agents")
        left = orphaned_segments(start - 1)
    remove_orphaned_segments(start - 1, wait=0)
    return [p.name for p in left]
