"""One pull of the weights per node, shared by every engine on it.

A *region* is a directory under a memory-backed base (``/dev/shm/ray_stream_llm`` by
default) named for the model's URI, its weight objects (keys, sizes, ETags) and the
Ray node: ``<base>/<node>/<key>/``. It holds ``.created`` (the region's marker: the model's
URI and the weight objects, in the order the engines read them), one file per safetensors
object under its own name once that file is whole, ``.partial/<name>`` for a file still
being written (with ``.progress/<name>``, its contiguous prefix), ``.refs/`` (one file per
process using the region), ``.lock`` (the region's lock) and ``.pull.lock`` (held by the
one process pulling). No file is made before its bytes come, none is sparse.

The pull: the first stage actor or engine of a node that finds files missing takes
``.pull.lock`` and reads each object from the store with parallel ranged GETs,
file by file, writing the ranges into ``.partial/<name>``; once every byte is in and its
size (and MD5, where the ETag is one) checked, the file is renamed to ``<name>``, so no
reader ever sees a file under its name that is still being written. Engines stream the
region's files with the Run:ai streamer (local files, memory speed); this library's vLLM
loader takes the files from the marker and waits for each by its name in the region
(:func:`wait_for`) before it streams it, so the first engine streams while the pull goes
on. A pull that fails writes ``.failed`` (the error's class and message), which fails every
waiting engine with that typed error (:func:`pull_error`; the engine's retry policy then
pulls again); a puller that dies releases its lock, and a waiting engine takes the pull
over, resuming each partial file from its recorded prefix. Nothing waits forever.

Clean-up is reference counted: each process adds ``.refs/<pid>-<start time>`` and
removes it when done; the last one removes the region (or keeps it warm for
``keep_warm_s``). A process that is killed cannot, so every holder hands the region to
its *keeper* (:class:`NodeWeights`' ``keeper``): in a Ray job the node's agent
(``integrations/ray/agent.py``, an actor), which runs :func:`reap` until the region is
gone; outside Ray a thread of the holding process (:func:`reap_in_thread`). A region
whose keeper ended too (its Ray shut down, its driver killed) is retired by the next
region made on the node (:func:`sweep_regions`: removed, or kept warm from then on if it
is whole and its job asked for ``keep_warm_s``) or by the driver's exit (:func:`retire`).

The locks are :func:`ray_stream_llm.files.locked` (its limits are stated there), of the
local node: regions are per node by design.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import dataclasses
import hashlib
import itertools
import json
import logging
import os
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal, get_args

from ray_stream_llm import errors
from ray_stream_llm.errors import (
    InvalidSettingError,
    ModelNotFoundError,
    ObjectChangedError,
    RayStreamLLMError,
    WeightSharingError,
)
from ray_stream_llm.files import HeldLock, locked, try_locked, write_whole
from ray_stream_llm.stores import ObjectInfo, StoreDeadline
from ray_stream_llm.uri import ModelURI, parse_model_uri
from ray_stream_llm.weights.marks import (
    CREATED,
    FAILED,
    UNSHARED,
    done,
    failure,
    partial,
    progress,
    record_digest,
    record_failure,
    record_progress,
)

logger = logging.getLogger(__name__)

DEFAULT_BASE = "/dev/shm/ray_stream_llm"
CHUNK = 8 << 20  # bytes per ranged GET
WORKERS = 16  # parallel ranged GETs, each on a connection of its own
MARGIN = 512 << 20  # memory kept free beyond the weights
MIN_PULL_RATE = 1 << 20  # bytes/s: a pull slower than this over its whole size is stuck
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
    peers: int = 0  # nodes a node serves at once (weights/peers.py); 0: each reads the store
    # engines whose KV cache still comes out of the node's memory (vLLM's CPU build: one)
    kv_cache_engines: int = 0

    def __post_init__(self) -> None:
        if self.mode not in get_args(SharingMode):
            raise InvalidSettingError(
                f"Sharing.mode is {self.mode!r}; it is one of {get_args(SharingMode)!r} "
                "(the builder makes it from weight_sharing: 'node' or 'auto' share, 'off' not)"
            )

    def node_can_host_an_engine(self) -> bool:
        """Whether this node has the resources one engine asks for (a CPU-only node of a
        GPU cluster does not: its stage actors must not pull weights there)."""
        wanted = {k: v for k, v in self.engine_resources.items() if v}
        if not wanted:
            return True
        import ray

        if not ray.is_initialized():
            return True  # not in Ray (a test, a tool): one node, it hosts the engines
        try:
            node = ray.get_runtime_context().get_node_id()
            [info] = [n for n in ray.nodes() if n.get("NodeID") == node]
            have = info.get("Resources", {})
        except Exception as exc:  # in a Ray worker: unknown means "do not pull here"
            logger.warning(
                "Not pulling the shared weights on this node: its resources could not be "
                "read (%s: %s); the engines pull on their own nodes",
                type(exc).__name__,
                exc,
            )
            return False
        missing = {k: v for k, v in wanted.items() if have.get(k, 0) < v}
        if missing:
            logger.info(
                "Not pulling the shared weights on this node: an engine asks for %s, the "
                "node has %s",
                missing,
                {k: have.get(k, 0) for k in missing},
            )
        return not missing


def _node_id() -> str:
    import ray

    if not ray.is_initialized():  # not in a Ray process (a test, a tool): never start Ray
        return "local"
    return str(ray.get_runtime_context().get_node_id())[:16]


def region_for(uri: ModelURI, objects: tuple[ObjectInfo, ...], base: str) -> Path:
    fingerprint = json.dumps(
        [str(uri), sorted((o.path, o.size, o.etag) for o in objects)], sort_keys=True
    )
    key = hashlib.sha256(fingerprint.encode()).hexdigest()[:16]
    return Path(base) / _node_id() / key


def region_of_dir(directory: str | os.PathLike[str]) -> Path | None:
    """The region at ``directory`` (it holds the region's marker), or None. Keyed on the
    directory itself, whatever string named it (relative, ``~``, ``..``)."""
    try:
        path = Path(os.path.realpath(os.path.expanduser(os.fspath(directory))))
        return path if (path / CREATED).is_file() else None
    except (OSError, ValueError):
        return None


def planned_files(directory: str | os.PathLike[str]) -> list[str] | None:
    """The weight files of the region at ``directory``, in the order its marker lists them
    (the store's listing the stage actor planned from), or None where it is no region."""
    region = region_of_dir(directory)
    if region is None:
        return None
    return [str(region / obj.path) for obj in objects_of(region)]


def pull_timeout(weight_bytes: int, store_timeout_s: float | None = None) -> float:
    """Seconds a pull of ``weight_bytes`` may take before its waiters give up: the store's
    budget for one call (``RAY_STREAM_LLM_STORE_TIMEOUT_S``, ObjectStoreConfig.timeout_s)
    plus the size at :data:`MIN_PULL_RATE`."""
    budget = store_timeout_s if store_timeout_s is not None else StoreDeadline().total
    return budget + weight_bytes / MIN_PULL_RATE


def _marker(region: Path) -> dict[str, Any]:
    """The region's marker (:data:`CREATED`) as written when the region was made."""
    meta: dict[str, Any] = json.loads((region / CREATED).read_text())
    return meta


def objects_of(region: str | Path) -> tuple[ObjectInfo, ...]:
    """The weight objects a region was made for, in the order its marker lists them."""
    meta = _marker(Path(region))
    return tuple(ObjectInfo(**o) for o in meta["objects"])


def _proc_start(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _live_refs(region: Path) -> list[Path]:
    live = []
    for ref in (region / ".refs").glob("*"):
        pid, _, start = ref.name.partition("-")
        if pid.isdigit() and _proc_start(int(pid)) == start:
            live.append(ref)
        else:
            ref.unlink(missing_ok=True)  # its process is gone
    return live


@contextlib.contextmanager
def _locked(region: Path) -> Iterator[None]:
    """The region's lock, on the region that exists now (re-made if its keeper removed it)."""
    while True:
        (region / ".refs").mkdir(parents=True, exist_ok=True)
        try:
            held = locked(region / ".lock")
        except FileNotFoundError:  # the region went while this process waited
            continue
        with held:
            yield
            return


def memory_problem(
    base: Path, weight_bytes: int, *, region: Path | None = None, kv_cache_engines: int = 0
) -> str | None:
    """Why a region of ``weight_bytes`` cannot fit under ``base`` now, or None: the
    cgroup's limits (a container's) and the host's, the tmpfs, the node's other regions
    (their full size) and the KV cache of ``kv_cache_engines`` engines still to come (vLLM's
    CPU build: :attr:`Sharing.kv_cache_engines`) (:mod:`ray_stream_llm.weights.memory`).
    ``region``: the region about to be pulled (checked again before each pull starts; its
    bytes in already count)."""
    from ray_stream_llm.weights import memory

    return memory.memory_problem(
        base, weight_bytes, region=region, kv_cache_engines=kv_cache_engines, margin=MARGIN
    )


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


class NodeWeights:
    """A process's use of one region: :meth:`acquire` it, :meth:`release` it."""

    def __init__(
        self,
        uri: ModelURI,
        objects: tuple[ObjectInfo, ...],
        sharing: Sharing,
        keeper: Callable[[Path], None] | None = None,
    ):
        self.uri = uri
        self.keeper = keeper or reap_in_thread  # removes the region once no one holds it
        self.objects = objects
        self.sharing = sharing
        self.region = region_for(uri, objects, sharing.base)
        self.reason: str | None = None  # why the weights are not shared here, if they are not
        self._ref: Path | None = None

    @property
    def weight_bytes(self) -> int:
        return sum(o.size for o in self.objects)

    def acquire(self) -> str | None:
        """Hold a reference to the region (made if new), hand it to the keeper, and start
        the pull if no one is pulling; return the region's path, or None with the reason
        logged when sharing cannot fit (``required``: a WeightSharingError)."""
        base = Path(self.sharing.base)
        if self.sharing.base == DEFAULT_BASE and not is_memory_backed(base.parent):
            self._cannot(f"{base.parent} is not memory-backed (tmpfs)")
            return None
        created = False
        sweep_regions(base, keep=self.region)
        adopted = _adopt_warm(self.region)  # the same weights kept warm by an earlier job
        with _locked(self.region):
            if not (self.region / CREATED).exists():
                kv = self.sharing.kv_cache_engines
                problem = memory_problem(base, self.weight_bytes, kv_cache_engines=kv)
                if problem and sweep_regions(base, keep=self.region, warm_too=True):
                    # warm ones made room
                    problem = memory_problem(base, self.weight_bytes, kv_cache_engines=kv)
                if problem:
                    shutil.rmtree(self.region, ignore_errors=True)
                    self._cannot(problem)
                    return None
                marker = {
                    "uri": str(self.uri),
                    "objects": [dataclasses.asdict(o) for o in self.objects],
                    # resolved here, in the actor: every waiter's process uses the same
                    "timeout_s": self.sharing.pull_timeout_s or StoreDeadline().total,
                    "keep_warm_s": self.sharing.keep_warm_s,
                    "required": self.sharing.required,
                    "peers": self.sharing.peers,
                    "kv_cache_engines": self.sharing.kv_cache_engines,
                }
                (self.region / CREATED).write_text(json.dumps(marker))
                created = True
            if not created and (adopted or (self.region / WARM_UNTIL).exists()):
                _reuse_warm(self.region, self.sharing.keep_warm_s)
            (self.region / WARM_UNTIL).unlink(missing_ok=True)  # in use again
            start = _proc_start(os.getpid())
            self._ref = self.region / ".refs" / f"{os.getpid()}-{start}"
            self._ref.touch()
        self.keeper(self.region)  # every holder asks: the keeper takes a region once
        start_pull(self.region, self.uri, self.objects)
        return str(self.region)

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
        ref, self._ref = self._ref, None
        if ref is None:
            return
        with _locked(self.region):
            ref.unlink(missing_ok=True)
            if not _live_refs(self.region) and _pull_free(self.region):
                _retire(self.region)


WARM_UNTIL = ".warm_until"  # a region kept for a later job: the time it may be removed


def _keep_warm_s(region: Path) -> float:
    try:
        return float(_marker(region).get("keep_warm_s") or 0.0)
    except (OSError, ValueError, TypeError):
        return 0.0


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
    keep = _keep_warm_s(region)
    if keep > 0 and _complete(region):
        if not (region / WARM_UNTIL).exists():
            (region / WARM_UNTIL).write_text(repr(time.time() + keep))
            logger.info("Shared weights in %s kept warm for %.0fs for a later job", region, keep)
        if _warm(region):
            return False
    shutil.rmtree(region, ignore_errors=True)
    _remove_empty_parents(region)
    return True


def _adopt_warm(region: Path) -> bool:
    """Move a warm region of the same weights that an earlier Ray session of this host left
    under another node id to ``region`` (Ray gives a node a new id each session); True
    when one was adopted. A region still referenced, or no longer warm, is left alone."""
    if region.exists():
        return False
    for other in sorted(region.parent.parent.glob(f"*/{region.name}")):
        if other == region or not (other / WARM_UNTIL).exists():
            continue
        with _locked(other):
            if region.exists() or _live_refs(other) or not _pull_free(other) or not _warm(other):
                continue
            region.parent.mkdir(parents=True, exist_ok=True)
            os.rename(other, region)
        _remove_empty_parents(other)
        logger.info("Adopted the warm shared weights of %s as %s", other, region)
        return True
    return False


def _reuse_warm(region: Path, keep_warm_s: float) -> None:
    """A copy kept warm by an earlier job, taken by this one: its pull record says so (this
    job's engines read no byte of the store: their reports say ``pull_source: "kept warm"``,
    ``pull_bytes: 0``), and it is kept after this job for this job's ``keep_warm_s``."""
    now = time.time()
    record = {"started": now, "finished": now, "bytes": 0, "source": "kept warm"}
    write_whole(region / ".pull.json", json.dumps({**record, "pid": os.getpid()}))
    write_whole(region / CREATED, json.dumps({**_marker(region), "keep_warm_s": keep_warm_s}))


def _pull_free(region: Path) -> bool:
    """Whether no process is pulling into ``region`` (its pull lock is free)."""
    try:
        held = try_locked(region / ".pull.lock")
    except OSError:
        return True
    if held is None:
        return False
    held.release()
    return True


def start_pull(region: Path, uri: ModelURI, objects: tuple[ObjectInfo, ...]) -> bool:
    """Pull what is missing in a background thread, unless all is there or someone is
    pulling; True when this process pulls."""
    if all(done(region, o.path) for o in objects):
        _serve_peers(region)
        return False
    held = try_locked(region / ".pull.lock")
    if held is None:
        return False
    (region / FAILED).unlink(missing_ok=True)  # a new attempt
    thread = threading.Thread(
        target=_pull, args=(region, uri, objects, held), daemon=True, name="rsl-node-pull"
    )
    thread.start()
    return True


def _serve_peers(region: Path) -> None:
    """A whole region serves the nodes that join later (kept warm from an earlier Ray
    session, its peer actors gone with that session): :func:`peers.serve`."""
    with contextlib.suppress(OSError, ValueError, TypeError):
        if fanout := int(_marker(region).get("peers") or 0):
            from ray_stream_llm.weights import peers

            peers.serve(region, fanout)


def _changed(listed: dict[str, ObjectInfo], objects: tuple[ObjectInfo, ...]) -> list[str]:
    """The objects whose size or ETag in the store's listing now is not what the region was
    made for."""
    return [
        o.path
        for o in objects
        if (now := listed.get(o.path)) is not None and (now.size, now.etag) != (o.size, o.etag)
    ]


def _md5_of(etag: str) -> str | None:
    """The object's MD5 when its ETag is one (a single-part S3 upload: 32 hex digits)."""
    hexdigits = len(etag) == 32 and all(c in "0123456789abcdefABCDEF" for c in etag)
    return etag.lower() if hexdigits else None


Read = Callable[[str, int, int], bytes]  # (object path, first byte, last byte) -> bytes


def _pull_file(
    uri: ModelURI,
    obj: ObjectInfo,
    region: Path,
    read: Read,
    pool: Any,
    expected: Callable[[str], tuple[str, str] | None] | None = None,
) -> int:
    """One object into ``.partial/<name>`` with parallel ranged reads (the store's GETs
    pinned to the listed ETag, or a peer's region), renamed to ``<name>`` once whole and
    checked; the bytes read. Every range is checked for length, the total against the
    listing, the MD5 against the ETag where the ETag is one, and the sha256 against the one
    the serving peer's own pull recorded (``expected``: ``(digest, peer)``, or None where
    the store was read); both hashed in order, while the ranges after it are still arriving.
    The sha256 is recorded (``.sha256/<name>``) before the rename, for the peers this node
    serves. The file's contiguous prefix is recorded as it grows, for those peers; a
    partial file that a dead puller left is resumed from that prefix (hashed again from the
    file). A file that fails a check is removed."""
    path = partial(region, obj.path)
    path.parent.mkdir(parents=True, exist_ok=True)
    md5 = hashlib.md5(usedforsecurity=False) if _md5_of(obj.etag) else None
    sha = hashlib.sha256()
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)

    def fetch(span: tuple[int, int]) -> tuple[int, bytes]:
        data = read(obj.path, span[0], span[1])
        if len(data) != span[1] - span[0] + 1:
            raise RayStreamLLMError(
                f"{obj.path!r} of {str(uri)!r}: got {len(data)} bytes for bytes "
                f"{span[0]}-{span[1]}; the connection was cut"
            )
        return os.pwrite(fd, data, span[0]), data

    try:
        # the prefix a puller before this one wrote and recorded (0 for a new file)
        written = have = min(progress(region, obj.path), os.fstat(fd).st_size, obj.size)
        for offset in range(0, have, CHUNK):
            data = os.pread(fd, min(CHUNK, have - offset), offset)
            sha.update(data)
            if md5 is not None:
                md5.update(data)
        ranges = [(s, min(s + CHUNK, obj.size) - 1) for s in range(have, obj.size, CHUNK)]
        window: collections.deque[concurrent.futures.Future[tuple[int, bytes]]]
        window = collections.deque()
        pending = iter(ranges)
        for span in itertools.islice(pending, 2 * WORKERS):
            window.append(pool.submit(fetch, span))
        while window:
            wrote, data = window.popleft().result()
            written += wrote
            record_progress(region, obj.path, written)  # in order: no gap before
            sha.update(data)
            if md5 is not None:
                md5.update(data)
            for span in itertools.islice(pending, 1):
                window.append(pool.submit(fetch, span))
    finally:
        os.close(fd)
    problem: RayStreamLLMError | None = None
    peer = expected(obj.path) if expected is not None and written == obj.size else None
    if written != obj.size:
        problem = RayStreamLLMError(
            f"{obj.path!r} of {str(uri)!r}: {written} bytes written to {path}, the listing said "
            f"{obj.size}; is {region} full?"
        )
    elif md5 is not None and md5.hexdigest() != _md5_of(obj.etag):
        problem = ObjectChangedError(
            f"{obj.path!r} of {str(uri)!r}: the bytes read have MD5 {md5.hexdigest()}, the "
            f"store's ETag says {obj.etag}; the object is damaged or changed while it was read"
        )
    elif peer is not None and peer[0] != sha.hexdigest():
        problem = ObjectChangedError(
            f"{obj.path!r} of {str(uri)!r}: the bytes copied from {peer[1]} have sha256 "
            f"{sha.hexdigest()}, that node's own pull of the store recorded {peer[0]}; a byte "
            "was damaged in that node's memory or on the way, and none of it is served: run the "
            "job again (weight_peers=0 reads the store on every node)"
        )
    if problem is not None:  # the next pull starts the file again
        with contextlib.suppress(OSError):  # (a region removed meanwhile has no file)
            record_progress(region, obj.path, 0)
            path.unlink(missing_ok=True)
        raise problem
    record_digest(region, obj.path, sha.hexdigest())
    (region / obj.path).parent.mkdir(parents=True, exist_ok=True)
    os.rename(path, region / obj.path)  # whole and checked: readers see it from now on
    return written - have


def _pull(region: Path, uri: ModelURI, objects: tuple[ObjectInfo, ...], lock: HeldLock) -> None:
    from ray_stream_llm import stores

    started = time.time()
    pulled = 0
    try:
        if problem := memory_problem(
            region.parent.parent,
            sum(o.size for o in objects),
            region=region,
            kv_cache_engines=_kv_cache_engines(region),
        ):
            message = f"{str(uri)!r} not pulled into {region}: {problem}"
            if not _required(region):  # 'auto': the engines stream from the store instead
                write_whole(region / UNSHARED, message)
                logger.warning("%s; its engines stream from the store", message)
                return
            raise WeightSharingError(message)
        deadline = StoreDeadline(  # a store down between ranges is waited out, then resumed
            pull_timeout(sum(o.size for o in objects), _budget(region)), wait_out_outages=True
        )
        client, listing = stores.list_model(uri, None, deadline, connections=WORKERS)
        listed = {o.path: o for o in listing}
        gone = [o.path for o in objects if o.path not in listed]
        if gone:
            raise ModelNotFoundError(
                f"{', '.join(repr(p) for p in gone[:5])} of {str(uri)!r} is no longer in the "
                "store (it was when this job listed the model); upload it again, or run the "
                "job on the model as it is now"
            )
        changed = _changed(listed, objects)
        if changed:
            raise ObjectChangedError(
                f"{', '.join(repr(p) for p in changed[:5])} of {str(uri)!r} changed in the "
                "store since this job listed the model (size or ETag); nothing of it was "
                "shared: run the job again to load the new version"
            )
        missing = [o for o in objects if not done(region, o.path)]
        etags = {o.path: o.etag for o in objects}

        def store_read(name: str, first: int, last: int) -> bytes:
            return stores.read(client, uri, name, deadline, first, last, etag=etags[name])

        read: Read = store_read
        peer = None
        if missing and _marker(region).get("peers"):
            from ray_stream_llm.weights import peers

            peer = peers.join(region, store_read, int(_marker(region)["peers"]))
            read = peer or store_read
        with concurrent.futures.ThreadPoolExecutor(WORKERS) as pool:
            expected = peer.digest if peer else None
            for obj in missing:  # file by file, its ranges in parallel
                pulled += _pull_file(uri, obj, region, read, pool, expected)
        status: dict[str, Any] = {
            "started": started,
            "finished": time.time(),
            "bytes": pulled,
            "pid": os.getpid(),
        }
        status.update(peer.status() if peer else {"source": "store"})
        write_whole(region / ".pull.json", json.dumps(status))
        logger.info(
            "Pulled %d bytes of %s into %s in %.2fs from %s (shared by this node's engines)",
            pulled,
            uri,
            region,
            time.time() - started,
            status["source"],
        )
    except Exception as exc:  # every waiting engine fails with it
        if _exiting(exc):  # this process is going away, not the store: a waiter takes over
            logger.warning("The shared pull of %s stops with its process: %s", uri, exc)
            return
        _fail(region, exc)
        logger.warning("The shared pull of %s failed: %s: %s", uri, type(exc).__name__, exc)
    finally:
        lock.release()


def _kv_cache_engines(region: Path) -> int:
    try:
        return int(_marker(region).get("kv_cache_engines") or 0)
    except (OSError, ValueError):
        return 0


def _required(region: Path) -> bool:
    try:
        return bool(_marker(region).get("required"))
    except (OSError, ValueError):
        return True


def unshared(region: str | Path) -> str | None:
    """Why the region was given up for streaming from the store ('auto' only), or None."""
    try:
        return (Path(region) / UNSHARED).read_text()
    except OSError:
        return None


def _exiting(exc: BaseException) -> bool:
    """Whether ``exc`` says this process is shutting down (a stage actor that Ray retires
    while its pull thread runs: the pool refuses new work), not that the pull failed."""
    return sys.is_finalizing() or (
        isinstance(exc, RuntimeError) and "cannot schedule new futures" in str(exc)
    )


def _budget(region: Path) -> float | None:
    try:
        value = _marker(region).get("timeout_s")
    except (OSError, ValueError):
        return None
    return float(value) if value is not None else None


def _fail(region: Path, error: BaseException) -> None:
    """Tell every waiter the pull failed: ``.failed`` with the error's class and message, or,
    where it cannot be written (the region's memory is full), an empty ``.failed``, which
    waiters read as a failure whose message was lost. Only a region that is gone takes no
    mark, and its waiters fail on that."""
    try:
        record_failure(region, error)
    except OSError:
        with contextlib.suppress(OSError):
            (region / FAILED).touch()


def pull_error(region: str | Path) -> Exception | None:
    """The error a waiter of ``region`` fails with when its pull failed (None when it did
    not): the library's typed class the pull failed with (a class of
    :mod:`ray_stream_llm.errors`, so ``except ObjectChangedError`` catches it in the
    engine's process, and the builtin it subclasses too); any other error, or a mark that
    names no class (an older release's plain text, or an empty mark), is a
    ``RuntimeError``. The message starts "the shared pull of the weights failed: "."""
    found = failure(Path(region))
    if found is None:
        return None
    name, message = found
    cls = getattr(errors, name, None) if name else None
    if isinstance(cls, type) and issubclass(cls, errors.RayStreamLLMError):
        return cls(f"the shared pull of the weights failed: {message}")
    if name:
        message = f"{name}: {message}"
    message = message or "its message could not be written (memory full?)"
    return RuntimeError(f"the shared pull of the weights failed: {message}")


def pull_status(region: str | Path) -> dict[str, Any] | None:
    """The record of the pull that filled ``region`` (``.pull.json``), None before it is
    written: the pull writes it just after its last file is whole."""
    try:
        status: dict[str, Any] = json.loads((Path(region) / ".pull.json").read_text())
    except (OSError, ValueError):
        return None
    return status


def finished_pull(region: str | Path, timeout: float = 30.0) -> dict[str, Any] | None:
    """:func:`pull_status` once the pull has ended: a reader that saw the last file whole
    can come before the record; it waits while the pull still holds its lock (up to
    ``timeout`` s). None where no pull ended with a record (it failed, or never ran)."""
    deadline = time.monotonic() + timeout
    while (status := pull_status(region)) is None and time.monotonic() < deadline:
        if _pull_free(Path(region)):
            return pull_status(region)  # ended meanwhile, or no pull holds it
        time.sleep(0.05)
    return status


def file_source(region: str | Path, name: str) -> tuple[str, float]:
    """In the engine's process: what to stream for the weight file ``name`` of ``region``
    (the directory vLLM was given) once it may be read, and the seconds waited: the whole
    file (:func:`wait_for`), or its object in the store when 'auto' gave the region up
    before pulling it (the URI made from the region's marker)."""
    region = Path(region)
    waited = wait_for(region, name)
    if done(region, name):
        return str(region / name), waited
    return parse_model_uri(_marker(region)["uri"]).object_uri(name), waited


def wait_for(region: str | Path, name: str, timeout: float | None = None) -> float:
    """In the engine's process: block until the weight file ``name`` of ``region`` is
    whole (under its name), or the region was given up for the store (:data:`UNSHARED`,
    'auto' only: see :func:`file_source`); seconds waited. Raises when the pull failed (its
    typed error: :func:`pull_error`) or the region is gone; takes the pull over when its
    puller died. ``timeout``: by default the region's pull timeout (:func:`pull_timeout`)."""
    region = Path(region)
    if not (region / CREATED).is_file():
        raise FileNotFoundError(f"{region} is not a shared region (or it was removed)")
    objects = objects_of(region)
    if name not in {o.path for o in objects}:
        raise FileNotFoundError(f"{name!r} is not a weight file of the shared region {region}")
    if timeout is None:
        timeout = pull_timeout(sum(o.size for o in objects), _budget(region))
    begin = time.monotonic()
    while not done(region, name):
        if (region / UNSHARED).exists():
            break
        if (error := pull_error(region)) is not None:  # None: no failure mark
            raise error
        if not (region / CREATED).exists():
            raise FileNotFoundError(f"the shared region {region} was removed while {name} waited")
        if time.monotonic() - begin > timeout:
            raise TimeoutError(
                f"{region / name} not complete after {timeout:.0f}s (the pull's budget for "
                "its size)"
            )
        if _pull_free(region) and not done(region, name):
            _take_over(region)
        time.sleep(0.05)
    return time.monotonic() - begin


def _take_over(region: Path) -> None:
    """The puller died: pull the missing files from this process (the store settings are
    in its environment), pinned to the objects the region was made for."""
    try:
        meta = _marker(region)
        objects = objects_of(region)
    except (OSError, ValueError, KeyError, TypeError):
        return
    if start_pull(region, parse_model_uri(meta["uri"]), objects):
        logger.warning("The puller of %s is gone: this engine pulls the rest", region)


def sweep_regions(base: Path, *, keep: Path | None = None, warm_too: bool = False) -> list[Path]:
    """Retire the regions under ``base`` that no live process references and no one pulls
    into (left by a job whose keeper ended with it, or under an old Ray node id), except
    ``keep``: each is removed, or, whole and asked to be kept warm, kept from now on for its
    ``keep_warm_s`` (:func:`_retire`); with ``warm_too`` (room is needed) removed even then.
    The regions removed. Each is checked under its own lock, as its keeper would."""
    removed = []
    for region in sorted(base.glob("*/*")):
        if region == keep or not (region / ".lock").is_file():
            continue
        with _locked(region):
            if _live_refs(region) or not _pull_free(region):
                continue
            if warm_too:
                shutil.rmtree(region, ignore_errors=True)
                _remove_empty_parents(region)
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


def reap(region: Path, *, grace: float = 2.0, poll: float = 0.5) -> None:
    """Keep ``region`` until it is gone: retire it (:func:`_retire`) once no live process
    has held a reference or pulled into it for ``grace`` seconds, and, kept warm, remove it
    once its time is up and no job took it again. The keeper's loop."""
    idle_since: float | None = None
    while region.exists():
        if _live_refs(region) or not _pull_free(region):
            idle_since = None
        elif idle_since is None:
            idle_since = time.monotonic()
        elif time.monotonic() - idle_since >= grace:
            with _locked(region):
                if not _live_refs(region) and _pull_free(region) and _retire(region):
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


def retire(region: Path, wait: float = 0.0) -> bool:
    """Retire ``region`` as its keeper would once no live process holds it (waiting up to
    ``wait`` s for its holders to exit): removed, or kept warm. True when it is gone (or was
    already); False while it is held, pulled into or kept warm."""
    deadline = time.monotonic() + wait
    while region.exists():
        with _locked(region):
            if not _live_refs(region) and _pull_free(region):
                return _retire(region)
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)
    return True


def _remove_empty_parents(region: Path) -> None:
    for parent in (region.parent, region.parent.parent):
        with contextlib.suppress(OSError):
            parent.rmdir()  # only when empty
