"""The node's one pull of the weights into its region, and how its waiters learn its end.

In a Ray job the node's agent pulls (:func:`pull_with`, asked by the node's stage actors and
engines with their store settings by value: ``integrations/ray/agent.py``); elsewhere the
process that holds the region does (:func:`start_pull`). The puller takes ``.pull.lock`` and
reads each object from the store (or from a peer node's region: the ``peers`` handed in,
``integrations/ray/peers.py``) with parallel ranged GETs, file by file, writing the ranges
into ``.partial/<name>``; once every byte is in and its size (and MD5, where the ETag is
one) checked, the file is renamed to ``<name>``, so no reader ever sees a file under its
name that is still being written. A pull that fails writes ``.failed`` (the error's class
and message), which fails every waiting engine with that typed error (:func:`pull_error`). A
puller that dies releases its lock, and the region's holders, which ask for the pull again
while it fills (``weights.region.NodeWeights.tend``), have it taken up again (by the
restarted agent), each partial file resumed from its recorded prefix; the engines' vLLM
processes only wait. The lock is :func:`ray_stream_llm.files.try_locked` (its limits are
stated there): it says that a pull runs, for whoever would retire the region.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import hashlib
import itertools
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from ray_stream_llm import errors
from ray_stream_llm.errors import (
    ModelNotFoundError,
    ObjectChangedError,
    RayStreamLLMError,
    WeightSharingError,
)
from ray_stream_llm.files import HeldLock, try_locked, write_whole
from ray_stream_llm.stores import ObjectInfo, StoreDeadline
from ray_stream_llm.uri import ModelURI, parse_model_uri
from ray_stream_llm.weights import memory
from ray_stream_llm.weights.marks import (
    FAILED,
    PULL_LOCK,
    UNSHARED,
    PullRecord,
    PullSource,
    budget,
    done,
    failure,
    fanout,
    kv_cache_engines,
    marker,
    objects_of,
    partial,
    progress,
    pull_record,
    record_digest,
    record_failure,
    record_progress,
    record_pull,
    required,
)

logger = logging.getLogger(__name__)

CHUNK = 8 << 20  # bytes per ranged GET


WORKERS = 16  # parallel ranged GETs, each on a connection of its own


MIN_PULL_RATE = 1 << 20  # bytes/s: a pull slower than this over its whole size is stuck


def pull_timeout(weight_bytes: int, store_timeout_s: float | None = None) -> float:
    """Seconds a pull of ``weight_bytes`` may take before its waiters give up: the store's
    budget for one call (``RAY_STREAM_LLM_STORE_TIMEOUT_S``, ObjectStoreConfig.timeout_s)
    plus the size at :data:`MIN_PULL_RATE`."""
    budget = store_timeout_s if store_timeout_s is not None else StoreDeadline().total
    return budget + weight_bytes / MIN_PULL_RATE


def pull_free(region: Path) -> bool:
    """Whether no process is pulling into ``region`` (its pull lock is free)."""
    try:
        held = try_locked(region / PULL_LOCK)
    except OSError:
        return True
    if held is None:
        return False
    held.release()
    return True


def start_pull(
    region: Path,
    uri: ModelURI,
    objects: tuple[ObjectInfo, ...],
    env: Mapping[str, str] | None = None,
    peers: Peers | None = None,
) -> threading.Thread | None:
    """Claim the pull of what is missing of ``region`` now (its lock taken, an earlier
    attempt's failure mark cleared: a waiter that starts after this returns never sees it)
    and run it in a thread, started and returned; None where all is there or another thread
    or process pulls. ``env``: the store variables the store's clients are made under
    (``stores.settings.applied``; None: this process's own). ``peers``: the node's peers,
    where the region's marker asks for them (none: the store). A whole region serves the
    nodes that join later (kept warm from an earlier Ray session, its peer actors gone with
    that session: ``peers.serve``)."""
    if all(done(region, o.path) for o in objects):
        if peers is not None and (peers_served := fanout(region)):
            peers.serve(region, peers_served)
        return None
    held = try_locked(region / PULL_LOCK)
    if held is None:
        return None
    (region / FAILED).unlink(missing_ok=True)  # a new attempt
    thread = threading.Thread(
        target=_pull,
        args=(region, uri, objects, held, env, peers),
        daemon=True,
        name="rsl-pull",
    )
    thread.start()
    return thread


def pull_with(
    region: Path, env: Mapping[str, str], peers: Peers | None = None
) -> threading.Thread | None:
    """In the node's agent: :func:`start_pull` of ``region`` pinned to the objects its
    marker names, the store's clients made under ``env``, the store variables of the actor
    that asked; None also where the region is gone."""
    try:
        uri, objects = parse_model_uri(marker(region)["uri"]), objects_of(region)
    except (OSError, ValueError, KeyError, TypeError):  # removed meanwhile
        return None
    return start_pull(region, uri, objects, env, peers)


def _md5_of(etag: str) -> str | None:
    """The object's MD5 when its ETag is one (a single-part S3 upload: 32 hex digits)."""
    hexdigits = len(etag) == 32 and all(c in "0123456789abcdefABCDEF" for c in etag)
    return etag.lower() if hexdigits else None


Read = Callable[[str, int, int], bytes]  # (object path, first byte, last byte) -> bytes


class PeerReads(Protocol):
    """A node's reads of its region's files from a peer node (or the store, where it has
    none), as :class:`Peers` joins them."""

    def __call__(self, name: str, start: int, end: int) -> bytes: ...

    def digest(self, name: str) -> tuple[str, str] | None:
        """The sha256 of ``name`` as the serving peer recorded it, and that peer; None
        where this node reads the store."""
        ...

    def status(self) -> PullSource:
        """Where it read from, and how many bytes from each (for the pull's record)."""
        ...


class Peers(Protocol):
    """The node's peers (``integrations/ray/peers.py``): regions served to other nodes and
    filled from them."""

    def join(self, region: Path, store_read: Read, fanout: int) -> PeerReads | None:
        """The reads to pull ``region`` with, this node serving it meanwhile; None: the
        store."""
        ...

    def serve(self, region: Path, fanout: int) -> None:
        """Serve the whole ``region`` to the nodes that join later."""
        ...


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


def _pull(
    region: Path,
    uri: ModelURI,
    objects: tuple[ObjectInfo, ...],
    lock: HeldLock,
    env: Mapping[str, str] | None = None,
    peers: Peers | None = None,
) -> None:
    from ray_stream_llm import stores
    from ray_stream_llm.stores.settings import applied

    started = time.time()
    pulled = 0
    size = sum(o.size for o in objects)
    try:
        if problem := memory.memory_problem(
            region.parent.parent,
            size,
            region=region,
            kv_cache_engines=kv_cache_engines(region),
        ):
            message = f"{str(uri)!r} not pulled into {region}: {problem}"
            if not required(region):  # 'auto': the engines stream from the store instead
                write_whole(region / UNSHARED, message)
                logger.warning("%s; its engines stream from the store", message)
                return
            raise WeightSharingError(message)
        deadline = StoreDeadline(  # a store down between ranges is waited out, then resumed
            pull_timeout(size, budget(region)), wait_out_outages=True
        )
        client = None
        if env is not None:  # the asking actor's store settings, while the client is made
            with applied(env):
                client = stores.backend(uri.scheme).make_client(
                    None, deadline, max_pool_connections=WORKERS
                )
        client, listing = stores.list_model(uri, None, deadline, connections=WORKERS, client=client)
        listed = {o.path: o for o in listing}
        gone = [o.path for o in objects if o.path not in listed]
        if gone:
            raise ModelNotFoundError(
                f"{', '.join(repr(p) for p in gone[:5])} of {str(uri)!r} is no longer in the "
                "store (it was when this job listed the model); upload it again, or run the "
                "job on the model as it is now"
            )
        changed = [
            o.path
            for o in objects
            if (listed[o.path].size, listed[o.path].etag) != (o.size, o.etag)
        ]
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

        peer = None
        if missing and peers is not None and (peers_served := fanout(region)):
            peer = peers.join(region, store_read, peers_served)
        read: Read = peer or store_read
        expected = peer.digest if peer else None
        with concurrent.futures.ThreadPoolExecutor(WORKERS) as pool:
            for obj in missing:  # file by file, its ranges in parallel
                pulled += _pull_file(uri, obj, region, read, pool, expected)
        status = PullRecord(
            started, time.time(), pulled, os.getpid(), peer.status() if peer else PullSource()
        )
        record_pull(region, status)
        logger.info(
            "Pulled %d bytes of %s into %s in %.2fs from %s (shared by this node's engines)",
            pulled,
            uri,
            region,
            time.time() - started,
            status.read.source,
        )
    except Exception as exc:  # every waiting engine fails with it
        if _exiting(exc):  # this process is going away, not the store: a holder asks again
            logger.warning("The shared pull of %s stops with its process: %s", uri, exc)
            return
        fail(region, exc)
        logger.warning("The shared pull of %s failed: %s: %s", uri, type(exc).__name__, exc)
    finally:
        lock.release()


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


def fail(region: Path, error: BaseException) -> None:
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


def finished_pull(region: str | Path, timeout: float = 30.0) -> PullRecord | None:
    """The pull's record (``marks.pull_record``) once the pull has ended: a reader that saw
    the last file whole can come before the record; it waits while the pull still holds its
    lock (up to ``timeout`` s). None where no pull ended with a record (it failed, or never
    ran)."""
    deadline = time.monotonic() + timeout
    while (status := pull_record(region)) is None and time.monotonic() < deadline:
        if pull_free(Path(region)):
            return pull_record(region)  # ended meanwhile, or no pull holds it
        time.sleep(0.05)
    return status
