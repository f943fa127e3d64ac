"""How long a node's region lives: its holders, its keeper, kept warm, retired.

Clean-up is reference counted: each holder of a region adds its mark to ``.refs/``
(:func:`add_ref`) and drops it when done (:func:`drop_ref`); the last one retires the
region: removed, or, whole and asked to be kept warm (``keep_warm_s``), kept until
``.warm_until``. A Ray actor's mark is its actor id (``actor-<id>``, holding its raylet's
pid and start time): it holds the region until Ray reports the actor dead (asked by the
node's agent, its keeper) or its Ray has ended. Any other process's mark is its pid and
start time (``<pid>-<start>``): it holds the region while that process runs. A holder that
is killed cannot drop its mark, so every holder hands the region to its *keeper*: in a Ray
job the node's agent (``integrations/ray/agent.py``, an actor), which runs :func:`reap`
until the region is gone; outside Ray a thread of the holding process
(:func:`reap_in_thread`). A region whose keeper ended too (its Ray shut down, its driver
killed) is retired by the next region made on the node (:func:`sweep_regions`) or by the
driver's exit (:func:`retire`); a warm one left under an earlier Ray session's node id is
taken by the next job of the same weights (:func:`adopt_warm`).

The region's lock is :func:`ray_stream_llm.files.locked` (its limits are stated there), of
the local node: regions are per node by design.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from ray_stream_llm.files import locked, write_whole
from ray_stream_llm.weights.marks import (
    CREATED,
    FAILED,
    LOCK,
    REFS,
    WARM_UNTIL,
    PullRecord,
    PullSource,
    done,
    keep_warm_s,
    marker,
    objects_of,
    record_pull,
)
from ray_stream_llm.weights.pull import pull_free

logger = logging.getLogger(__name__)


def _proc_start(pid: int) -> str | None:
    """The start time of ``pid`` (clock ticks since boot) while it runs: None once it has
    exited, a zombie too (it maps nothing: its parent has only not reaped it)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if len(fields) < 20 or fields[0] in ("Z", "X") else fields[19]


ActorAlive = Callable[[str], bool]  # whether Ray has the actor of this id alive


def live_refs(region: Path, actor_alive: ActorAlive | None = None) -> list[Path]:
    """The marks of ``region``'s live holders; those of ended ones are removed. An actor's
    mark holds while its Ray runs; with ``actor_alive`` (the node's agent: its Ray's actor
    table), in a worker of the actor's own raylet, only while Ray has the actor alive."""
    live = []
    for ref in (region / REFS).glob("*"):
        if ref.name.startswith("."):
            continue  # a mark being written (files.write_whole's temporary name)
        if ref.name.startswith("actor-"):
            holds = _actor_holds(ref, actor_alive)
        else:
            pid, _, start = ref.name.partition("-")
            holds = pid.isdigit() and _proc_start(int(pid)) == start
        if holds:
            live.append(ref)
        else:
            ref.unlink(missing_ok=True)  # its holder is gone
    return live


def _actor_holds(ref: Path, actor_alive: ActorAlive | None) -> bool:
    """Whether the actor of the mark ``ref`` still holds its region: not once its raylet
    has ended (its Ray is gone; a worker may outlive it by seconds, serving no one); where
    this process is a worker of that raylet and ``actor_alive`` is given, as Ray says."""
    try:
        pid, start = ref.read_text().split()
        raylet = int(pid)
    except (OSError, ValueError):
        return False  # written whole (add_ref): unreadable is gone
    if _proc_start(raylet) != start:
        return False
    if actor_alive is None or raylet != os.getppid():
        return True  # its Ray's node agent decides
    return actor_alive(ref.name.removeprefix("actor-"))


def add_ref(region: Path, actor: str | None = None) -> Path:
    """A holder's mark in ``region`` (under :func:`region_lock`), written whole: for the Ray
    actor ``actor``, ``actor-<id>`` holding its raylet's (its parent's) pid and start time;
    else this process's ``<pid>-<start time>`` (the driver, a task, no Ray)."""
    if actor is None:
        ref = region / REFS / f"{os.getpid()}-{_proc_start(os.getpid())}"
        ref.touch()
    else:
        ref = region / REFS / f"actor-{actor}"
        write_whole(ref, f"{os.getppid()} {_proc_start(os.getppid())}\n")
    return ref


def drop_ref(region: Path, ref: Path) -> None:
    """Drop ``ref``; the last holder retires the region (removed, or kept warm)."""
    ref.unlink(missing_ok=True)
    retire(region)


def _idle(region: Path, actor_alive: ActorAlive | None = None) -> bool:
    """Whether no live holder holds ``region`` (:func:`live_refs`) and none pulls into it
    (a decision to retire it is taken under its lock: :func:`retire`, :func:`sweep_regions`)."""
    return not live_refs(region, actor_alive) and pull_free(region)


@contextlib.contextmanager
def region_lock(region: Path) -> Iterator[None]:
    """The region's lock, on the region that exists now (re-made if its keeper removed it)."""
    while True:
        (region / REFS).mkdir(parents=True, exist_ok=True)
        try:
            held = locked(region / LOCK)
        except FileNotFoundError:  # the region went while this process waited
            continue
        with held:
            yield
            return


def _complete(region: Path) -> bool:
    try:
        objects = objects_of(region)
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return not (region / FAILED).exists() and all(done(region, o.path) for o in objects)


def _retire(region: Path) -> bool:
    """Under the region's lock, when no live process holds it and no one pulls into it:
    keep a complete region warm until its deadline (set now, the first time), else remove
    it. True when it was removed."""
    keep = keep_warm_s(region)
    if keep > 0 and _complete(region):
        if not (region / WARM_UNTIL).exists():
            (region / WARM_UNTIL).write_text(repr(time.time() + keep))
            logger.info("Shared weights in %s kept warm for %.0fs for a later job", region, keep)
        if _warm(region):
            return False
    remove(region)
    return True


def adopt_warm(region: Path) -> bool:
    """Move a warm region of the same weights that an earlier Ray session of this host left
    under another node id to ``region`` (Ray gives a node a new id each session); True
    when one was adopted. A region still referenced, or no longer warm, is left alone."""
    if region.exists():
        return False
    for other in sorted(region.parent.parent.glob(f"*/{region.name}")):
        if other == region or not (other / WARM_UNTIL).exists():
            continue
        with region_lock(other):
            if region.exists() or not _idle(other) or not _warm(other):
                continue
            region.parent.mkdir(parents=True, exist_ok=True)
            os.rename(other, region)
        _remove_node_dir(other)
        logger.info("Adopted the warm shared weights of %s as %s", other, region)
        return True
    return False


def reuse_warm(region: Path, keep_s: float) -> None:
    """A copy kept warm by an earlier job, taken by this one: its pull record says so (this
    job's engines read no byte of the store: their reports say ``pull_source: "kept warm"``,
    ``pull_bytes: 0``), and it is kept after this job for ``keep_s``, this job's
    ``keep_warm_s``."""
    now = time.time()
    record_pull(region, PullRecord(now, now, 0, os.getpid(), PullSource("kept warm")))
    write_whole(region / CREATED, json.dumps({**marker(region), "keep_warm_s": keep_s}))


def sweep_regions(base: Path, *, keep: Path | None = None, warm_too: bool = False) -> list[Path]:
    """Retire the regions under ``base`` that no live process references and no one pulls
    into (left by a job whose keeper ended with it, or under an old Ray node id), except
    ``keep``: each is removed, or, whole and asked to be kept warm, kept from now on for its
    ``keep_warm_s`` (:func:`_retire`); with ``warm_too`` (room is needed) removed even then.
    The regions removed. Each is checked under its own lock, as its keeper would."""
    removed = []
    for region in sorted(base.glob("*/*")):
        if region == keep or not (region / LOCK).is_file():
            continue
        with region_lock(region):
            if not _idle(region):
                continue
            if warm_too:
                remove(region)
            elif not _retire(region):
                continue
            removed.append(region)
    if removed:
        logger.info("Removed %d shared region(s) no live process used: %s", len(removed), removed)
    return removed


def _warm(region: Path) -> bool:
    """Whether the region is kept warm for a later job (``.warm_until`` in the future)."""
    try:
        return float((region / WARM_UNTIL).read_text()) > time.time()
    except (OSError, ValueError):
        return False


def reap(
    region: Path,
    *,
    grace: float = 2.0,
    poll: float = 0.5,
    actor_alive: ActorAlive | None = None,
) -> None:
    """Keep ``region`` until it is gone: retire it (:func:`_retire`) once no live holder
    (:func:`live_refs`, given ``actor_alive``) has held it or pulled into it for ``grace``
    seconds, and, kept warm, remove it once its time is up and no job took it again. The
    keeper's loop."""
    idle_since: float | None = None
    while region.exists():
        if not _idle(region, actor_alive):
            idle_since = None
        elif idle_since is None:
            idle_since = time.monotonic()
        elif time.monotonic() - idle_since >= grace and retire(region, actor_alive=actor_alive):
            return
        time.sleep(poll)


_reaping: set[Path] = set()
_reaping_lock = threading.Lock()


def reap_in_thread(region: Path) -> None:
    """The keeper of a process with no node agent (outside Ray: a test, a tool): a daemon
    thread of this process runs :func:`reap`, once per region. It ends with the process;
    what it kept is then retired by the node's next region (:func:`sweep_regions`)."""

    def run() -> None:
        while True:
            reap(region)
            with _reaping_lock:  # made again as this thread ended: kept on
                if not region.exists():
                    _reaping.discard(region)
                    return

    with _reaping_lock:
        if region in _reaping:
            return
        _reaping.add(region)
    threading.Thread(target=run, name="rsl-reap", daemon=True).start()


def retire(region: Path, wait: float = 0.0, actor_alive: ActorAlive | None = None) -> bool:
    """Retire ``region`` as its keeper would once no live holder holds it (waiting up to
    ``wait`` s for its holders to end: :func:`live_refs`, given ``actor_alive``): removed, or
    kept warm. True when it is gone (or was already); False while it is held, pulled into
    or kept warm."""
    deadline = time.monotonic() + wait
    while region.exists():
        with region_lock(region):
            if _idle(region, actor_alive):
                return _retire(region)
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)
    return True


def remove(region: Path) -> None:
    """Remove ``region`` and its node's directory once empty: the one place a region is
    deleted (its last holder, its keeper, the sweep, a region refused as it was made)."""
    shutil.rmtree(region, ignore_errors=True)
    _remove_node_dir(region)


def _remove_node_dir(region: Path) -> None:
    """The region's node directory, once empty; never the base above it (``weight_sharing_dir``
    may be the user's own directory)."""
    with contextlib.suppress(OSError):
        region.parent.rmdir()  # only when empty
