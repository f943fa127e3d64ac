"""``fetch_model_metadata``: the metadata of a model, and never its weights, on local disk.

The destination directory is derived from the normalised URI alone, so every
process on a node, and every run, uses the same path (vLLM's torch.compile
cache is keyed on it). The directory is written whole or not at all
(:func:`ray_stream_llm.cache.publishing`): concurrent callers on one node see
either nothing or a complete directory, and only one of them downloads.

A marker file records each file's size, ETag and CRC-32. Reuse checks the
store's listing against it and every local file against it: a file deleted,
truncated or changed on disk is fetched again, the rest is kept. The library
never deletes or overwrites what it did not write: a ``dest`` that is a file, or
a directory holding files it did not write, is refused with
:class:`~ray_stream_llm.errors.ForeignFilesError`.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import json
import logging
import os
import shutil
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from ray_stream_llm import stores
from ray_stream_llm.cache import CACHE_ENV, cache_root, publishing, replace, sweep
from ray_stream_llm.errors import ForeignFilesError
from ray_stream_llm.patterns import REQUIRED_METADATA, FileRole, classify, require_metadata
from ray_stream_llm.stores import ObjectInfo, StoreDeadline
from ray_stream_llm.stores.base import Client
from ray_stream_llm.stores.settings import ObjectStoreConfig
from ray_stream_llm.uri import ModelURI, parse_model_uri

logger = logging.getLogger(__name__)

MARKER = ".ray_stream_llm.json"
_MARKER_VERSION = 2
_WORKERS = 8


@dataclasses.dataclass(frozen=True)
class FetchReport:
    """What one metadata fetch did (:func:`fetch_metadata_report`)."""

    uri: str
    path: Path
    files: int
    bytes: int
    seconds: float
    downloaded: bool  # False: the complete directory was already there
    refetched: tuple[str, ...]  # local files found damaged or missing and fetched again
    skipped_weight_files: int
    skipped_weight_bytes: int
    streamable: dict[str, int]  # the *.safetensors among the skipped weights: URI -> size
    weight_objects: tuple[ObjectInfo, ...] = ()  # those *.safetensors, as the store listed them

    @property
    def streamable_bytes(self) -> int:
        """What the engines stream."""
        return sum(self.streamable.values())


def default_metadata_dir(uri: str | ModelURI) -> Path:
    """The deterministic local directory for the metadata of ``uri``.

    The same model written with or without a trailing slash maps to the same path.
    """
    normalized = str(uri if isinstance(uri, ModelURI) else parse_model_uri(uri))
    digest = hashlib.sha256(normalized.encode()).hexdigest()[:16]
    return cache_root() / "models" / digest


def metadata_digest(directory: str | Path) -> str | None:
    """A digest of what the marker of a metadata directory this library fetched records of
    each file (name, size, CRC32 of the bytes): the same for the same metadata under any
    URI; None for any other directory."""
    try:
        files = json.loads((Path(directory).expanduser() / MARKER).read_text())["files"]
        recorded = sorted((str(n), v["size"], v["crc32"]) for n, v in files.items())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return hashlib.sha256(json.dumps(recorded).encode()).hexdigest()[:32]


# Where the content-named links live: one fixed path per user on every node, whatever HOME
# or the library's cache is, since vLLM hashes the path into its compile cache key
CONTENT_BASE = Path(f"/tmp/ray_stream_llm-{os.getuid()}/models")


def content_dir(directory: Path, base: Path = CONTENT_BASE) -> Path:
    """The path of the fetched metadata ``directory`` that names its content, not its URI
    nor where the library's cache is: ``<base>/<digest>``, a link to ``directory`` made (or
    pointed there again) now; ``directory`` itself where it has no marker. The same model
    under another URI, in another HOME or on another node is the same path. Any directory
    the link may point to holds the same files."""
    digest = metadata_digest(directory)
    if digest is None:
        return directory
    link = base / digest
    base.mkdir(parents=True, exist_ok=True)
    staging = base / f".{digest}.{os.getpid()}.tmp"
    staging.unlink(missing_ok=True)
    staging.symlink_to(directory.resolve(), target_is_directory=True)
    os.replace(staging, link)  # whole: a reader sees the old link or the new one
    return link


def _crc32(path: Path) -> int:
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            crc = zlib.crc32(chunk, crc)
    return crc


def _read_marker(dest: Path) -> dict[str, Any] | None:
    try:
        marker = json.loads((dest / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) else None


def _stale(
    dest: Path, marker: dict[str, Any] | None, objects: list[ObjectInfo]
) -> tuple[list[str], list[str]]:
    """(changed, damaged): the objects the store changed since the marker was written (or
    that it does not record), and those whose local copy is missing or differs from what
    the marker recorded (size and CRC-32)."""
    recorded = (
        (marker or {}).get("files") if (marker or {}).get("version") == _MARKER_VERSION else None
    )
    if not isinstance(recorded, dict):
        return [o.path for o in objects], []
    changed, damaged = [], []
    for obj in objects:
        entry = recorded.get(obj.path)
        if not (
            isinstance(entry, dict)
            and entry.get("size") == obj.size
            and entry.get("etag") == obj.etag
        ):
            changed.append(obj.path)
            continue
        local = dest / obj.path
        try:
            intact = local.stat().st_size == obj.size and entry.get("crc32") == _crc32(local)
        except OSError:
            intact = False
        if not intact:
            damaged.append(obj.path)
    return changed, damaged


def _first_foreign(dest: Path, marker: dict[str, Any] | None) -> str | None:
    """The first path under ``dest`` this library did not write (relative), ``dest`` itself
    when a file or link stands in its place, or None. Stops at the first one found."""
    if dest.is_symlink() or (dest.exists() and not dest.is_dir()):
        return str(dest)
    if not dest.is_dir():
        return None
    recorded = set((marker or {}).get("files") or ()) | {MARKER}
    for dirpath, _, names in os.walk(dest):
        for name in names:
            rel = os.path.relpath(os.path.join(dirpath, name), dest)
            if rel not in recorded:
                return rel
    return None


def _refuse_foreign(dest: Path, marker: dict[str, Any] | None) -> None:
    """A user's ``dest`` holding what this library did not write is refused, untouched."""
    foreign = _first_foreign(dest, marker)
    if foreign is None:
        return
    if foreign == str(dest):
        raise ForeignFilesError(
            f"destination {str(dest)!r} exists and is not a directory; nothing was changed: "
            "give the path of a new or empty directory"
        )
    raise ForeignFilesError(
        f"destination {str(dest)!r} holds files that fetch_model_metadata did not write "
        f"(first found: {foreign!r}); nothing was changed: move them away or give another "
        "directory"
    )


def fetch_model_metadata(
    uri: str,
    dest: str | os.PathLike[str] | None = None,
    *,
    object_store: ObjectStoreConfig | None = None,
) -> Path:
    """Fetch the metadata files of the model at ``uri`` (never a weight file) to local disk.

    Args:
        uri: The model directory in object storage, e.g. ``s3://bucket/llama-3/``.
            A trailing slash is optional.
        dest: Where to put the files. By default a directory under
            ``$RAY_STREAM_LLM_CACHE`` (or ``~/.cache/ray_stream_llm``) derived from
            the normalised URI. An existing ``dest`` must be empty or an earlier
            fetch's directory holding nothing else.
        object_store: Endpoint, credentials and addressing of the store. Unset
            fields (or ``None``) leave the standard environment in charge.

    Returns:
        The local directory: configs, generation config, tokenizer files, chat
        templates, preprocessor configs, the safetensors index and ``*.py`` files.

    Idempotent: when ``dest`` already holds a complete, undamaged fetch of the same
    objects (same keys, sizes and ETags) nothing is downloaded. Safe when several
    processes on one node call it at once, and when one is killed.

    >>> fetch_model_metadata("s3://models/SmolLM2-135M-Instruct/")  # doctest: +SKIP
    PosixPath('/home/me/.cache/ray_stream_llm/models/6f1c0e5d2a9b3c47')
    """
    return fetch_metadata_report(uri, dest, object_store=object_store).path


def fetch_metadata_report(
    uri: str | ModelURI,
    dest: str | os.PathLike[str] | None = None,
    *,
    object_store: ObjectStoreConfig | None = None,
    require: tuple[str, ...] = REQUIRED_METADATA,
    wait_out_outages: bool = False,
) -> FetchReport:
    """:func:`fetch_model_metadata`, returning what it did: files, bytes, seconds, whether
    it downloaded, and the streamable weights it left in the store. ``wait_out_outages``
    (the job's actors): a store that cannot be reached is called again until the budget
    is spent (:class:`~ray_stream_llm.stores.StoreDeadline`), not failed at once."""
    start = time.perf_counter()
    model = uri if isinstance(uri, ModelURI) else parse_model_uri(uri)
    target = Path(dest).expanduser().absolute() if dest else default_metadata_dir(model)
    setting = f"dest ({str(target)!r})" if dest else f"{CACHE_ENV} (the metadata cache)"
    deadline = StoreDeadline(
        object_store.timeout_s if object_store is not None else None,
        wait_out_outages=wait_out_outages,
    )
    client, listing = stores.list_model(model, object_store, deadline)
    roles = {o.path: classify(o.path) for o in listing}
    # An object named like our marker would be overwritten by it: never fetched.
    metadata = [o for o in listing if roles[o.path] is FileRole.METADATA and o.path != MARKER]
    weights = [
        o for o in listing if roles[o.path] in (FileRole.STREAMABLE_WEIGHTS, FileRole.OTHER_WEIGHTS)
    ]
    for obj in metadata:
        model.safe_relative(obj.path)
    require_metadata(str(model), (o.path for o in metadata), require)
    streamable = {
        f"{model}{o.path}": o.size for o in weights if roles[o.path] is FileRole.STREAMABLE_WEIGHTS
    }

    def report(downloaded: bool, refetched: list[str]) -> FetchReport:
        return FetchReport(
            uri=str(model),
            path=target,
            files=len(metadata),
            bytes=sum(o.size for o in metadata),
            seconds=time.perf_counter() - start,
            downloaded=downloaded,
            refetched=tuple(refetched),
            skipped_weight_files=len(weights),
            skipped_weight_bytes=sum(o.size for o in weights),
            streamable=streamable,
            weight_objects=tuple(
                o for o in weights if roles[o.path] is FileRole.STREAMABLE_WEIGHTS
            ),
        )

    def current(marker: dict[str, Any] | None) -> tuple[list[str], list[str]] | None:
        """None when ``target`` holds exactly this listing, undamaged; else what to fetch."""
        changed, damaged = _stale(target, marker, metadata)
        if not changed and not damaged and set((marker or {}).get("files") or ()) == listed:
            return None
        return changed, damaged

    listed = {o.path for o in metadata}
    marker = _read_marker(target)
    # A user's dest is refused when it holds what we did not write. The cache root is the
    # library's own: a directory there whose marker is damaged or missing is fetched again
    # and swapped in whole, never a lock-out.
    guard = _refuse_foreign if dest else lambda target, marker: None
    guard(target, marker)  # before any download or lock
    if current(marker) is None:
        sweep(target)  # what a fetch killed mid-way left next to it
        return report(downloaded=False, refetched=[])
    with publishing(target, setting=setting) as staging:
        marker = _read_marker(target)  # another process may have fetched it meanwhile
        guard(target, marker)
        stale = current(marker)
        if stale is None:
            return report(downloaded=False, refetched=[])
        changed, refetched = stale
        fetch = [o for o in metadata if o.path in {*changed, *refetched}]
        for obj in metadata:  # the intact files are kept: copied, not fetched again
            if obj not in fetch:
                (staging / obj.path).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(target / obj.path, staging / obj.path)
        _download_all(client, model, fetch, staging, deadline)
        files = {
            o.path: {"size": o.size, "etag": o.etag, "crc32": _crc32(staging / o.path)}
            for o in metadata
        }
        (staging / MARKER).write_text(
            json.dumps(
                {"version": _MARKER_VERSION, "uri": str(model), "files": files},
                indent=1,
                sort_keys=True,
            )
        )
        replace(staging, target)
    result = report(downloaded=True, refetched=refetched)
    if refetched:
        logger.warning(
            "Metadata of %s in %s was damaged on disk (%s); fetched it again",
            result.uri,
            result.path,
            ", ".join(refetched),
        )
    logger.info(
        "Fetched %d metadata files (%d bytes) of %s in %.2fs into %s; skipped %d weight files "
        "(%d bytes)",
        result.files,
        result.bytes,
        result.uri,
        result.seconds,
        result.path,
        result.skipped_weight_files,
        result.skipped_weight_bytes,
    )
    return result


class ProgressBar(Protocol):
    def set(self, done: int) -> None: ...

    def close(self) -> None: ...


# What draws the fetch's progress bar, (description, total bytes) -> a bar or None (bars
# switched off): registered by ray_stream_llm.integrations, whose bar a Ray worker has the
# driver draw; empty, no bar.
_progress: list[Callable[[str, int], ProgressBar | None]] = []


def register_progress(factory: Callable[[str, int], ProgressBar | None] | None) -> None:
    """Set what draws the fetch's progress bars (``ray_stream_llm.integrations`` does, on
    import); None for none."""
    _progress[:] = [factory] if factory is not None else []


def _download_all(
    client: Client, uri: ModelURI, objects: list[ObjectInfo], into: Path, deadline: StoreDeadline
) -> None:
    if not objects:
        return
    for obj in objects:
        (into / obj.path).parent.mkdir(parents=True, exist_ok=True)
    bar = (
        _progress[0](f"Fetching metadata of {uri}", sum(o.size for o in objects))
        if _progress
        else None
    )
    done = 0
    with concurrent.futures.ThreadPoolExecutor(min(_WORKERS, len(objects))) as pool:
        futures = {
            pool.submit(stores.download, client, uri, o, str(into / o.path), deadline): o
            for o in objects
        }
        try:
            for future in concurrent.futures.as_completed(futures):
                future.result()
                done += futures[future].size
                if bar is not None:
                    bar.set(done)
        finally:
            if bar is not None:
                bar.close()
