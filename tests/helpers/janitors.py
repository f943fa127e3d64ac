"""The engines' janitors (ray_stream_llm.integrations.vllm.shm), seen from the tests."""

from __future__ import annotations

import os
import time

from ray_stream_llm.integrations.vllm import shm as shm_module
from ray_stream_llm.integrations.vllm.shm import orphaned_segments, remove_orphaned_segments


def wait_for_janitors(since: float, timeout: float = 120.0) -> list[int]:
    """Wait until the engines' janitors started since ``since`` have finished: they are
    detached, outlive the job and remove its shared memory after its last process exits,
    so what a job left behind is judged once they are done. Returns those still running
    after ``timeout`` s (none, normally)."""
    import psutil

    janitor = os.path.abspath(shm_module.__file__)
    deadline = time.monotonic() + timeout
    while True:
        running = []
        for proc in psutil.process_iter(["cmdline", "create_time"]):
            cmdline = proc.info["cmdline"] or []
            if (proc.info["create_time"] or 0) >= since and cmdline[1:2] == [janitor]:
                running.append(proc.pid)
        if not running or time.monotonic() >= deadline:
            return running
        time.sleep(0.5)


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
