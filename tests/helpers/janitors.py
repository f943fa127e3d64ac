"""The node agents (ray_stream_llm.integrations.ray.agent: they clean up after the engines and
keep the node's shared regions), seen from the tests."""

from __future__ import annotations

import textwrap

import psutil

from helpers.waiting import wait_until
from ray_stream_llm.integrations.vllm.shm import orphaned_segments, remove_orphaned_segments

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


def agents() -> list[psutil.Process]:
    """The node agents running now (Ray actors: ``ray::NodeAgent`` in their command line)."""
    return [
        proc
        for proc in psutil.process_iter(["cmdline"])
        if "ray::NodeAgent" in " ".join(proc.info["cmdline"] or [])
    ]


def segments_left(start: float) -> list[str]:
    """vLLM's ``/dev/shm`` segments (``psm_*``, ``vllm_dist_*``: ``shm.PREFIXES``) a run
    that began at ``start`` left behind: created since then and mapped by no process, looked
    at again once no node agent runs when there are any (an agent removes an engine's after
    the engine's last process has exited, which can be after the run returns; with nothing
    to watch it ends). Removed either way, so that the machine stays clean; the names are
    returned for the test to judge."""
    left = orphaned_segments(start - 1)
    if left:
        wait_until(lambda: not agents() or not orphaned_segments(start - 1), 120, "the node agents")
        left = orphaned_segments(start - 1)
    remove_orphaned_segments(start - 1, wait=0)
    return [p.name for p in left]
