"""The engines' janitors (ray_stream_llm.integrations.vllm.shm) and the regions' reapers
(ray_stream_llm.weights.region), the library's detached processes, seen from the tests."""

from __future__ import annotations

import os
from pathlib import Path

import psutil

from helpers.waiting import wait_until
from ray_stream_llm.integrations.vllm import shm as shm_module
from ray_stream_llm.integrations.vllm.shm import orphaned_segments, remove_orphaned_segments

REAPER_MODULE = "ray_stream_llm.weights.region"


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


def _detached(since: float, reapers: bool) -> list[str]:
    """The janitors (and with ``reapers``, the regions' reapers) started since ``since`` that
    still run though what they wait for is gone: a janitor whose engine (its first argument)
    has exited, a reaper whose region (its last) no longer exists. Both end within a second
    or two of that, whatever else runs; one watching a live engine or an existing region
    belongs to a job still running (on a shared machine, maybe not this run's, and never
    this run's once its jobs are done: a leaked engine or region is a leftover of its own).
    ``"pid: command line"`` each."""
    janitor = os.path.abspath(shm_module.__file__)
    found = []
    for proc in psutil.process_iter(["cmdline", "create_time", "status"]):
        cmdline = proc.info["cmdline"] or []
        if (proc.info["create_time"] or 0) < since or proc.info["status"] == "zombie":
            continue
        if cmdline[1:2] == [janitor] and len(cmdline) > 2:
            waits_on_nothing = not psutil.pid_exists(int(cmdline[2]))
        elif reapers and cmdline[1:4] == ["-m", REAPER_MODULE, "reap"] and len(cmdline) > 4:
            waits_on_nothing = not os.path.exists(cmdline[4])
        else:
            continue
        if waits_on_nothing:
            found.append(f"{proc.pid}: {' '.join(cmdline)}")
    return found


def wait_for_detached(since: float, timeout: float = 120.0, reapers: bool = True) -> list[str]:
    """Wait until the detached processes started since ``since`` have finished: an engine's
    janitor outlives the job and removes its shared memory after its last process exits; a
    region's reaper removes the region once no process holds it (or its warm time is up).
    What a run left behind is judged once they are done. Returns those still running after
    ``timeout`` s (``"pid: command line"`` each; none, normally)."""
    try:
        wait_until(lambda: not _detached(since, reapers), timeout, "detached processes", poll=0.5)
    except AssertionError:
        return _detached(since, reapers)
    return []


def wait_for_janitors(since: float, timeout: float = 120.0) -> list[str]:
    """:func:`wait_for_detached` for the engines' janitors only."""
    return wait_for_detached(since, timeout, reapers=False)


def segments_left(start: float) -> list[str]:
    """The ``/dev/shm/psm_*`` segments a run that began at ``start`` left behind: created
    since then and mapped by no process, looked at again once the run's janitors are done
    when there are any (a janitor removes its engine's after the engine's last process has
    exited, which can be after the run returns). Removed either way, so that the machine
    stays clean; the names are returned for the test to judge."""
    left = orphaned_segments(start - 1)
    if left:
        wait_for_janitors(start)
        left = orphaned_segments(start - 1)
    remove_orphaned_segments(start - 1, wait=0)
    return [p.name for p in left]
