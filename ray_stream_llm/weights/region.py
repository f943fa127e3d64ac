"""One pull of the weights per node, shared by every engine on it.

A *region* is a directory under a memory-backed base (``/dev/shm/ray_stream_llm`` by
default) named for the model's URI, its weight objects (keys, sizes, ETags) and the
Ray node: ``<base>/<node>/<key>/``. It holds ``.created`` (the region's marker: the model's
URI and the weight objects, in the order the engines read them), one file per safetensors
object under its own name once that file is whole, ``.partial/<name>`` for a file still
being written (with ``.progress/<name>``, its contiguous prefix), ``.refs/`` (one file per
process using the region), ``.lock`` (the region's lock) and ``.pull.lock`` (held by the
one process pulling). No file is made before its bytes come, none is sparse.

This module is the region as its holders see it: :class:`NodeWeights` (a process's hold on
the node's region: made if new, within the node's memory) and :class:`RegionWeights` (an
engine's weight source from it: vLLM is given the model's URI, and the region's path, which
holds the node's ID, apart). The engine's processes read it through
:mod:`ray_stream_llm.weights.reading` (each file once it is whole). The pull is
:mod:`ray_stream_llm.weights.pull`; the region's holders, its keeper and its warm time are
:mod:`ray_stream_llm.weights.lifetime`; its marks are :mod:`ray_stream_llm.weights.marks`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Literal, get_args

from ray_stream_llm.errors import InvalidSettingError, WeightSharingError
from ray_stream_llm.stores import ObjectInfo, StoreDeadline
from ray_stream_llm.uri import ModelURI
from ray_stream_llm.weights import memory
from ray_stream_llm.weights.lifetime import (
    add_ref,
    adopt_warm,
    drop_ref,
    reap_in_thread,
    region_lock,
    remove,
    reuse_warm,
    sweep_regions,
)
from ray_stream_llm.weights.marks import (
    CREATED,
    FAILED,
    UNSHARED,
    WARM_UNTIL,
    PullRecord,
    done,
)
from ray_stream_llm.weights.pull import (
    fail,
    finished_pull,
    start_pull,
    unshared,
)
from ray_stream_llm.weights.store import StoreWeights

if TYPE_CHECKING:
    from ray_stream_llm.fetch import FetchReport

logger = logging.getLogger(__name__)

DEFAULT_BASE = "/dev/shm/ray_stream_llm"
SharingMode = Literal["node", "off"]


@dataclasses.dataclass(frozen=True)
class Sharing:
    """What an actor was told: ``mode`` is "node" (share) or "off"; ``required`` when the
    user asked for sharing explicitly (then a region that cannot fit is an error)."""

    mode: SharingMode
    base: str = DEFAULT_BASE
    required: bool = False
    engine_resources: dict[str, float] = dataclasses.field(default_factory=dict)
    pull_timeout_s: float | None = None  # the store's budget per call (None: the default)
    keep_warm_s: float = 0.0  # how long a complete region outlives its last engine
    peers: int = (
        0  # nodes a node serves at once (integrations/ray/peers.py); 0: each reads the store
    )
    # engines whose KV cache still comes out of the node's memory (vLLM's CPU build: one)
    kv_cache_engines: int = 0

    def __post_init__(self) -> None:
        if self.mode not in get_args(SharingMode):
            raise InvalidSettingError(
                f"Sharing.mode is {self.mode!r}; it is one of {get_args(SharingMode)!r} "
                "(the builder makes it from weight_sharing: 'node' or 'auto' share, 'off' not)"
            )


@dataclasses.dataclass(frozen=True)
class Holder:
    """Who holds a region, as its runtime names it: the node (regions are per node), the Ray
    actor (None: this process), the region's keeper (removes it once no one holds it) and
    its puller (pulls what is missing). Outside Ray: one node, ``local``; this process keeps
    and pulls, in threads. In a Ray worker: ``integrations.ray.node.holder()``."""

    node: str = "local"
    actor: str | None = None
    keeper: Callable[[Path], None] | None = None
    puller: Callable[[Path], None] | None = None


def region_for(
    uri: ModelURI, objects: tuple[ObjectInfo, ...], base: str, node: str = "local"
) -> Path:
    """The region of ``objects`` of ``uri`` on ``node`` under ``base``."""
    fingerprint = json.dumps(
        [str(uri), sorted((o.path, o.size, o.etag) for o in objects)], sort_keys=True
    )
    key = hashlib.sha256(fingerprint.encode()).hexdigest()[:16]
    return Path(base) / node / key


def is_memory_backed(path: Path) -> bool:
    """Whether ``path`` lives on tmpfs or ramfs (read from /proc/mounts)."""
    best, fstype = "", ""
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return False
    resolved = str(path.resolve())
    for line in mounts:
        parts = line.split()
        under = len(parts) >= 3 and (
            resolved == parts[1] or resolved.startswith(parts[1].rstrip("/") + "/")
        )
        if under and len(parts[1]) > len(best):
            best, fstype = parts[1], parts[2]
    return fstype in ("tmpfs", "ramfs")


TEND_S = 1.0  # how often a holder asks its puller again while its region fills


class NodeWeights:
    """A process's use of one region: :meth:`acquire` it, :meth:`release` it. Its
    ``keeper`` keeps the region until no one holds it, its ``puller`` pulls what is missing
    (its :class:`Holder`'s; by default this process, in threads). While it holds an
    incomplete region it asks its puller again each :data:`TEND_S` (:meth:`tend`): a puller
    asked while it pulls does nothing, and one that died (the node's agent, killed and
    restarted by Ray) takes the pull up again."""

    def __init__(
        self,
        uri: ModelURI,
        objects: tuple[ObjectInfo, ...],
        sharing: Sharing,
        holder: Holder | None = None,
    ):
        self.uri = uri
        self.holder = holder or Holder()
        self.keeper = self.holder.keeper or reap_in_thread  # removes it once no one holds it
        self.objects = objects
        self.puller = self.holder.puller or (lambda region: start_pull(region, uri, objects))
        self.sharing = sharing
        self.region = region_for(uri, objects, sharing.base, self.holder.node)
        self.reason: str | None = None  # why the weights are not shared here, if they are not
        self._ref: Path | None = None
        self._tending: threading.Thread | None = None
        self._asked = False  # a new attempt: ask the puller even after a failed pull
        self._wake = threading.Event()
        self._lock = threading.Lock()

    @property
    def weight_bytes(self) -> int:
        return sum(o.size for o in self.objects)

    def acquire(self) -> str | None:
        """Hold a reference to the region (made if new), hand it to the keeper, and have the
        puller pull what is missing; return the region's path, or None with the reason
        logged when sharing cannot fit (``required``: a WeightSharingError)."""
        base = Path(self.sharing.base)
        if self.sharing.base == DEFAULT_BASE and not is_memory_backed(base.parent):
            self._cannot(f"{base.parent} is not memory-backed (tmpfs)")
            return None
        sweep_regions(base, keep=self.region)
        adopted = adopt_warm(self.region)  # the same weights kept warm by an earlier job
        with region_lock(self.region):
            if not (self.region / CREATED).exists():
                kv = self.sharing.kv_cache_engines
                problem = memory.memory_problem(base, self.weight_bytes, kv_cache_engines=kv)
                if problem and sweep_regions(base, keep=self.region, warm_too=True):
                    # warm ones made room
                    problem = memory.memory_problem(base, self.weight_bytes, kv_cache_engines=kv)
                if problem:
                    remove(self.region)  # made by the lock just taken
                    self._cannot(problem)
                    return None
                made = {
                    "uri": str(self.uri),
                    "objects": [dataclasses.asdict(o) for o in self.objects],
                    # resolved here, in the actor: every waiter's process uses the same
                    "timeout_s": self.sharing.pull_timeout_s or StoreDeadline().total,
                    "keep_warm_s": self.sharing.keep_warm_s,
                    "required": self.sharing.required,
                    "peers": self.sharing.peers,
                    "kv_cache_engines": self.sharing.kv_cache_engines,
                }
                (self.region / CREATED).write_text(json.dumps(made))
            elif adopted or (self.region / WARM_UNTIL).exists():
                reuse_warm(self.region, self.sharing.keep_warm_s)
            (self.region / WARM_UNTIL).unlink(missing_ok=True)  # in use again
            self._ref = add_ref(self.region, self.holder.actor)
        self.keeper(self.region)  # every holder asks: the keeper takes a region once
        self.tend()  # and one pull runs at a time (pull.py)
        return str(self.region)

    def tend(self, now: bool = False) -> None:
        """Have the puller pull what is missing, in a thread that asks it again each
        :data:`TEND_S` while this process holds the region and it is incomplete; it stops
        at the pull's end, its failure (a new :meth:`tend`, the engine's next start attempt,
        asks again: the pull starts over from the ranges it had) or the release. ``now``:
        ask once in this thread first (an engine's start attempt after a failed pull: the
        failure mark is gone before vLLM starts). A puller that raises (no node agent took
        the request) fails the pull with a typed error."""
        if now:
            self._ask()
        with self._lock:
            self._asked = not now
            self._wake.set()
            if self._tending is None:
                self._tending = threading.Thread(target=self._tend, name="rsl-tend", daemon=True)
                self._tending.start()

    def _tend(self) -> None:
        while True:
            with self._lock:
                if self._ref is None or (not self._asked and self._settled()):
                    self._tending = None  # the next tend() starts a new thread
                    return
                self._asked = False
                self._wake.clear()
            self._ask()
            self._wake.wait(TEND_S)

    def _settled(self) -> bool:
        """Whether the region's pull needs no one to ask again: every file whole, the pull
        failed or was given up for the store, or the region is gone."""
        region = self.region
        if not (region / CREATED).exists():
            return True
        if (region / FAILED).exists() or (region / UNSHARED).exists():
            return True
        return all(done(region, o.path) for o in self.objects)

    def _ask(self) -> None:
        try:
            self.puller(self.region)
        except Exception as exc:
            fail(
                self.region,
                WeightSharingError(
                    f"nothing on this node pulls the shared weights of {str(self.uri)!r} "
                    f"into {self.region}: {type(exc).__name__}: {exc}; is the node's agent "
                    "(namespace ray_stream_llm) failing? weight_sharing='off' streams each "
                    "engine from the store"
                ),
            )

    def _cannot(self, reason: str) -> None:
        self.reason = reason  # for the load report
        if self.sharing.required:
            raise WeightSharingError(
                f"weight_sharing='node' for {str(self.uri)!r}: the weights "
                f"({self.weight_bytes / 2**30:.2f} GiB) cannot be shared on this node: "
                f"{reason}; free memory, set weight_sharing_dir to a larger memory-backed "
                "directory, or weight_sharing='off' to stream each engine from the store"
            )
        logger.warning(
            "Weights of %s not shared on this node (%s): each engine streams from the store",
            self.uri,
            reason,
        )

    def release(self) -> None:
        """Drop this process's reference; the last one removes the region, or leaves it
        warm for ``keep_warm_s`` (its keeper removes it then)."""
        with self._lock:
            ref, self._ref = self._ref, None
            self._wake.set()  # the tending thread ends
        if ref is None:
            return
        drop_ref(self.region, ref)


class RegionWeights:
    """An engine's weights from the node's shared region, filled by the node's one pull
    (a :class:`~ray_stream_llm.weights.source.WeightSource`)."""

    sharing = "node"

    def __init__(self, uri: ModelURI, fetched: FetchReport, node: NodeWeights, region: str):
        self.uri, self.fetched, self.node, self.region = uri, fetched, node, region
        self._released = False

    @property
    def model_weights(self) -> str:
        # the URI; the engine's processes find the region in reading.REGION_ENV
        return str(self.uri)

    def prepare(self) -> RegionWeights | StoreWeights:
        # the pull asked for again with each attempt; after a failed pull, in this thread,
        # so that vLLM's processes, started next, never read that attempt's failure mark
        self.node.tend(now=(Path(self.region) / FAILED).exists())
        why = unshared(self.region)
        if why is None:
            return self
        self.release()  # 'auto' gave the region up: the store, for this engine
        return StoreWeights(self.uri, self.fetched, f"off: {why}")

    def sizes(self) -> dict[str, int]:
        return {os.path.join(self.region, o.path): o.size for o in self.fetched.weight_objects}

    def pull(self) -> PullRecord | None:
        return finished_pull(self.region)  # its record follows the last file by moments

    def release(self) -> None:
        if not self._released:
            self._released = True
            self.node.release()  # the node's last engine removes the region (or keeps it warm)
