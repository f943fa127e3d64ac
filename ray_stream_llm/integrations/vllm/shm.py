"""Remove the shared-memory segments a vLLM engine leaves behind when it is torn down.

The CPU build of vLLM runs its worker in a child process and talks to it
through a ``multiprocessing.shared_memory`` ring buffer (``/dev/shm/psm_*``,
160 MiB); its tensor-parallel workers share one more (``/dev/shm/vllm_dist_*``, 8 MiB,
vLLM's ``ShmRingBuffer`` for broadcasts between ranks). When Ray Data retires the engine
actor, vLLM's shutdown terminates those processes before the creator unlinks the segment,
and it stays in ``/dev/shm`` until reboot. A segment is an orphan when no live process maps
it; only segments the engine's own processes were seen to map, and only once no
process maps them, are removed: never another engine's or program's.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

SHM_DIR = Path("/dev/shm")
PREFIXES = ("psm_", "vllm_dist_")  # the names of the segments vLLM's processes make


def _shm_mapped(pid: int | str) -> set[str]:
    """Names of the ``/dev/shm`` files process ``pid`` maps now; none once it has exited
    (or is not ours to read)."""
    names: set[str] = set()
    try:
        with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as maps:
            for line in maps:
                if "/dev/shm/" in line:
                    names.add(line.rsplit("/dev/shm/", 1)[1].split(" ", 1)[0].strip())
    except OSError:
        pass
    return names


def _mapped_segments() -> set[str]:
    """Names of ``/dev/shm`` files mapped by any process we can inspect."""
    names: set[str] = set()
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            names |= _shm_mapped(proc.name)
    return names


def _processes(pid: int) -> list[Any]:
    """``pid`` and its descendants now (psutil processes); none when it has exited."""
    import psutil

    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def _mapped_by(procs: list[Any]) -> set[str]:
    """Names of vLLM's segments (:data:`PREFIXES`) that ``procs`` map now."""
    names: set[str] = set()
    for proc in procs:
        names |= {n for n in _shm_mapped(proc.pid) if n.startswith(PREFIXES)}
    return names


def segments_of(pid: int) -> set[str]:
    """Names of vLLM's segments (:data:`PREFIXES`) that ``pid`` or any of its descendants maps
    now: the engine's own (vLLM's ring buffer is mapped by the engine and its workers)."""
    return _mapped_by(_processes(pid))


def _segments(since: float, only: set[str] | None) -> list[Path]:
    """vLLM's segments in ``/dev/shm`` now (:data:`PREFIXES`), created at or after ``since``;
    with ``only``, just those of these names."""
    if not SHM_DIR.is_dir():
        return []
    return [
        p
        for p in SHM_DIR.iterdir()
        if p.name.startswith(PREFIXES) and (only is None or p.name in only) and _newer(p, since)
    ]


def _newer(path: Path, since: float) -> bool:
    try:
        return path.stat().st_mtime >= since
    except FileNotFoundError:
        return False


def orphaned_segments(since: float, only: set[str] | None = None) -> list[Path]:
    """vLLM's segments in ``/dev/shm`` (:data:`PREFIXES`), created at or after ``since``, that
    no process maps; with ``only``, just those of these names."""
    candidates = _segments(since, only)
    if not candidates:
        return []
    mapped = _mapped_segments()
    return [p for p in candidates if p.name not in mapped]


def remove_orphaned_segments(
    since: float, *, wait: float = 10.0, only: set[str] | None = None
) -> list[str]:
    """Remove orphaned segments created since ``since`` (with ``only``: just those of these
    names, the ones an engine's own processes were seen to map); wait up to ``wait`` s for
    exiting processes to unmap them. Returns the names removed."""
    deadline = time.monotonic() + wait
    removed: list[str] = []
    while True:
        for path in orphaned_segments(since, only=only):
            try:
                os.unlink(path)
                removed.append(path.name)
            except FileNotFoundError:
                pass
        if not _segments(since, only) or time.monotonic() >= deadline:
            break
        time.sleep(0.5)
    if removed:
        logger.info(
            "Removed %d shared-memory segment(s) left by the vLLM engine: %s", len(removed), removed
        )
    return removed


def janitor_log(pid: int) -> str | None:
    """Where the node agent logs its watch of the actor ``pid`` (this process), what it saw
    and did (the janitor's work, :func:`watch`): ``rsl-janitor-<pid>.log`` in
    the directory of the file this process's stderr goes to (a Ray worker's: its node's
    session logs, removed with them); None where stderr is no file."""
    try:
        target = os.readlink("/proc/self/fd/2")
    except OSError:
        return None
    if not target.startswith("/") or not os.path.isfile(target):
        return None  # a pipe, a terminal, a deleted file
    return os.path.join(os.path.dirname(target), f"rsl-janitor-{pid}.log")


def _started(procs: list[Any]) -> dict[int, float]:
    """Each process's pid and start time (a reused pid is another process)."""
    import psutil

    found: dict[int, float] = {}
    for proc in procs:
        try:
            found[proc.pid] = proc.create_time()
        except psutil.Error:
            continue
    return found


def _process(pid: int, started: float | None = None) -> Any:
    """The psutil process ``pid`` while it runs, else None: with ``started``, only if it is
    still the process that started then (a reused pid is another process); never a zombie
    (it exited and maps nothing: its parent has only not reaped it)."""
    import psutil

    try:
        proc = psutil.Process(pid)
        if (started is None or proc.create_time() == started) and (
            proc.status() != psutil.STATUS_ZOMBIE
        ):
            return proc
    except psutil.Error:
        pass
    return None


def is_running(pid: int, started: float | None = None) -> bool:
    """Whether ``pid`` runs (:func:`_process`)."""
    return _process(pid, started) is not None


def _running(members: dict[int, float]) -> list[Any]:
    """Those of ``members`` (pid and start time) that still run (:func:`_process`)."""
    return [proc for pid, started in members.items() if (proc := _process(pid, started))]


def _alive(members: dict[int, float]) -> bool:
    return bool(_running(members))


def _signal(members: dict[int, float], signum: int) -> None:
    for proc in _running(members):
        with contextlib.suppress(Exception):  # psutil.Error: it exited meanwhile
            proc.send_signal(signum)


def snapshot(pid: int) -> tuple[dict[int, float], set[str]]:
    """The processes of ``pid``'s tree now (pid and start time) and the segments they map."""
    procs = _processes(pid)
    return _started(procs), _mapped_by(procs)


def _mappers(names: set[str]) -> dict[str, list[int]]:
    """For each of ``names``, the pids of the processes that map it now."""
    import psutil

    found: dict[str, list[int]] = {}
    for proc in psutil.process_iter():
        for name in _mapped_by([proc]) & names:
            found.setdefault(name, []).append(proc.pid)
    return found


Record = Callable[[dict[int, float], set[str]], None]

# How long an engine's processes are given to exit after its actor did, before they are
# ended where the caller ends them (``end_leftovers``: its Ray does not): vLLM's engine core
# and workers do not end by themselves when their actor is killed.
GRACE_S = 5.0


def watch(
    pid: int,
    since: float,
    dirs: list[str],
    poll: float = 0.5,
    grace: float = GRACE_S,
    *,
    term_wait: float = 10.0,
    log: logging.Logger | logging.LoggerAdapter[Any] = logger,
    record: Record | None = None,
    members: dict[int, float] | None = None,
    seen: set[str] | None = None,
    end_leftovers: bool = True,
) -> None:
    """Watch ``pid`` (an engine actor) and its descendants; once the actor has exited, clean
    up after its processes (:func:`clean_after`). ``record(members, seen)`` is called
    whenever the processes or segments seen grow (the node agent keeps them in a file, for
    its restarted self); ``members`` and ``seen``: what was seen of them before;
    ``grace``, ``term_wait`` and ``end_leftovers``: :func:`clean_after`'s."""
    members, seen = dict(members or {}), set(seen or ())
    first = True
    while is_running(pid):
        started, mapped = snapshot(pid)
        if first:
            log.info("watching actor %d: processes %s", pid, list(started))
            first = False
        if record is not None and (mapped - seen or started.keys() - members.keys()):
            record(members | started, seen | mapped)
        seen |= mapped
        members |= started
        time.sleep(poll)
    log.info("actor %d exited; its processes %s mapped %s", pid, sorted(members), sorted(seen))
    clean_after(
        members,
        seen,
        since,
        dirs,
        poll,
        grace,
        term_wait=term_wait,
        log=log,
        end_leftovers=end_leftovers,
    )


def clean_after(
    members: dict[int, float],
    seen: set[str],
    since: float,
    dirs: list[str],
    poll: float = 0.5,
    grace: float = GRACE_S,
    *,
    term_wait: float = 10.0,
    log: logging.Logger | logging.LoggerAdapter[Any] = logger,
    end_leftovers: bool = True,
) -> None:
    """After an engine actor exited: wait (up to ``grace`` s) for every process of its tree
    (``members``: pid and start time) to exit too (vLLM's workers can outlive the actor by
    seconds on a loaded node, and a segment they map is not an orphan yet; what they map
    meanwhile is added to ``seen``), then, with ``end_leftovers``, end those still running
    (an actor killed outright, as Ray's memory monitor kills, leaves vLLM's engine core and
    workers with nobody to serve, holding the KV cache's memory and the segments: SIGTERM,
    then SIGKILL after ``term_wait`` s); without (the caller's Ray ends a dead worker's
    processes itself), send no signal and wait up to ``term_wait`` s more for them to end,
    logging those that do not. Then remove the segments of ``seen`` that no process maps
    any more (waiting up to 30 s for processes that are exiting to unmap them; what still
    maps one then is logged), and the directories ``dirs``."""
    import shutil

    seen = set(seen)
    deadline = time.monotonic() + grace
    while _alive(members) and time.monotonic() < deadline:
        seen |= _mapped_by(_running(members))
        time.sleep(poll)
    signals = ((signal.SIGTERM, term_wait), (signal.SIGKILL, 5.0)) if end_leftovers else ()
    for signum, wait in signals:
        if not _alive(members):
            break
        log.info("sending %s to %s", signal.Signals(signum).name, _running(members))
        _signal(members, signum)
        deadline = time.monotonic() + wait
        while _alive(members) and time.monotonic() < deadline:
            time.sleep(poll)
    if not end_leftovers:
        deadline = time.monotonic() + term_wait
        while _alive(members) and time.monotonic() < deadline:
            seen |= _mapped_by(_running(members))
            time.sleep(poll)
        if running := _running(members):
            log.warning("still running, left to their Ray to end: %s", running)
    if seen:
        remove_orphaned_segments(since, wait=30.0, only=seen)
        kept = {name for name in seen if (SHM_DIR / name).exists()}
        mapped = _mappers(kept) if kept else {}
        if mapped:
            log.warning("segments still mapped, not removed: %s", mapped)
        if unmapped := sorted(kept - mapped.keys()):
            log.info(
                "segments not removed, older than the engine or unmapped only now: %s", unmapped
            )
    for directory in dirs:
        shutil.rmtree(directory, ignore_errors=True)
    log.info("done")
