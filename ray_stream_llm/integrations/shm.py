"""Remove the shared-memory segments a vLLM engine leaves behind when it is torn down.

The CPU build of vLLM runs its worker in a child process and talks to it
through a ``multiprocessing.shared_memory`` ring buffer (``/dev/shm/psm_*``,
160 MiB). When Ray Data retires the engine actor, vLLM's shutdown terminates
those processes before the creator unlinks the segment, and it stays in
``/dev/shm`` until reboot. A segment is an orphan when no live process maps
it; only orphans created since a given time are removed, so segments of other
live engines on the node are never touched.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

logger = logging.getLogger(__name__)

SHM_DIR = Path("/dev/shm")


def _mapped_segments() -> set[str]:
    """Names of ``/dev/shm`` files mapped by any process we can inspect."""
    names: set[str] = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            with open(proc / "maps", encoding="utf-8", errors="replace") as maps:
                for line in maps:
                    if "/dev/shm/" in line:
                        names.add(line.rsplit("/dev/shm/", 1)[1].split(" ", 1)[0].strip())
        except OSError:  # the process exited, or is not ours to read
            continue
    return names


def orphaned_segments(since: float, pattern: str = "psm_*") -> list[Path]:
    """``/dev/shm`` segments matching ``pattern``, created at or after ``since``, that no
    process maps."""
    if not SHM_DIR.is_dir():
        return []
    candidates = []
    for path in SHM_DIR.glob(pattern):
        try:
            if path.stat().st_mtime >= since:
                candidates.append(path)
        except FileNotFoundError:
            continue
    if not candidates:
        return []
    mapped = _mapped_segments()
    return [p for p in candidates if p.name not in mapped]


def remove_orphaned_segments(since: float, *, wait: float = 10.0) -> list[str]:
    """Remove orphaned segments created since ``since``; wait up to ``wait`` s for
    exiting processes to unmap theirs. Returns the names removed."""
    deadline = time.monotonic() + wait
    removed: list[str] = []
    while True:
        for path in orphaned_segments(since):
            try:
                os.unlink(path)
                removed.append(path.name)
            except FileNotFoundError:
                pass
        pending = [p for p in SHM_DIR.glob("psm_*") if _newer(p, since)] if SHM_DIR.is_dir() else []
        if not pending or time.monotonic() >= deadline:
            break
        time.sleep(0.5)
    if removed:
        logger.info(
            "Removed %d shared-memory segment(s) left by the vLLM engine: %s", len(removed), removed
        )
    return removed


def _newer(path: Path, since: float) -> bool:
    try:
        return path.stat().st_mtime >= since
    except FileNotFoundError:
        return False


def detach(argv: list[str]) -> None:
    """Start ``argv`` as an orphan in a session of its own (the shell that starts it exits
    at once): Ray kills a worker's child processes when the worker exits, and the point of
    these processes is to outlive the actor that started them."""
    import shlex
    import subprocess

    command = " ".join(shlex.quote(a) for a in argv)
    subprocess.run(
        ["/bin/sh", "-c", f"setsid {command} </dev/null >/dev/null 2>&1 &"],
        check=True,
        close_fds=True,
    )


def spawn_janitor(pid: int, since: float) -> None:
    """A detached process that, once ``pid`` (an engine actor) has exited however it ended,
    removes the orphaned segments created since ``since``, then exits. An actor that Ray
    kills at shutdown runs no ``__del__``; the janitor still cleans up after it."""
    import sys

    detach([sys.executable, "-m", "ray_stream_llm.integrations.shm", str(pid), repr(since)])


def _watch(pid: int, since: float, poll: float = 0.5) -> None:
    while Path(f"/proc/{pid}").exists():
        time.sleep(poll)
    remove_orphaned_segments(since, wait=5.0)


if __name__ == "__main__":
    import sys

    _watch(int(sys.argv[1]), float(sys.argv[2]))
