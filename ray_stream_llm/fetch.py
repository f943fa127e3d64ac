"""``fetch_model_metadata``: the metadata of a model, and never its weights, on local disk.

The destination directory is derived from the normalised URI alone, so every
process on a node, and every run, uses the same path (vLLM's torch.compile
cache is keyed on it). A fetch writes into a private temporary directory and
renames it into place only when complete, under a file lock: concurrent
callers on one node see either nothing or a complete directory, and only one
of them downloads. The lock is an ``fcntl`` lock on local disk; it does not
serialise processes on different hosts sharing the directory over NFS.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import json
import logging
import os
import posixpath
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from ray_stream_llm import _backends
from ray_stream_llm.errors import ModelNotFoundError, UnsafeObjectKeyError
from ray_stream_llm.patterns import REQUIRED_METADATA, FileRole, classify
from ray_stream_llm.store import ObjectStoreConfig
from ray_stream_llm.uri import ModelURI, parse_model_uri

logger = logging.getLogger(__name__)

CACHE_ENV = "RAY_STREAM_LLM_CACHE"
MARKER = ".ray_stream_llm.json"
_WORKERS = 8


@dataclasses.dataclass(frozen=True)
class FetchReport:
    """What one call of the fetch did."""

    uri: str
    path: Path
    files: int
    bytes: int
    seconds: float
    downloaded: bool  # False: the complete directory was already there
    skipped_weight_files: int
    skipped_weight_bytes: int
    streamable: dict[str, int]  # the *.safetensors among the skipped weights: URI -> size

    @property
    def streamable_bytes(self) -> int:
        """What the engines stream."""
        return sum(self.streamable.values())


def cache_root() -> Path:
    """``$RAY_STREAM_LLM_CACHE``, else ``$XDG_CACHE_HOME/ray_stream_llm``, else ``~/.cache/...``."""
    if root := os.environ.get(CACHE_ENV):
        return Path(root).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(xdg) / "ray_stream_llm"


def default_metadata_dir(uri: str | ModelURI) -> Path:
    """The deterministic local directory for the metadata of ``uri``.

    The same model written with or without a trailing slash maps to the same path.
    """
    normalized = str(uri if isinstance(uri, ModelURI) else parse_model_uri(uri))
    digest = hashlib.sha256(normalized.encode()).hexdigest()[:16]
    return cache_root() / "models" / digest


def _safe_relative(path: str, uri: ModelURI) -> str:
    """``path`` if it stays inside the destination, else an error naming it."""
    normalized = posixpath.normpath(path) if path else path
    if (
        not path
        or path.startswith("/")
        or "\\" in path
        or normalized != path
        or normalized.startswith("../")
        or normalized == ".."
        or "\x00" in path
    ):
        raise UnsafeObjectKeyError(
            f"object key {uri.key(path)!r} under {str(uri)!r} would be written outside the "
            "metadata directory (absolute path, '..', '.', '//' or '\\'); rename or delete "
            "that object in the store"
        )
    return path


def _fingerprint(objects: list[_backends.ObjectInfo]) -> dict[str, list[Any]]:
    return {o.path: [o.size, o.etag] for o in objects}


def _read_marker(dest: Path) -> dict[str, Any] | None:
    try:
        return json.loads((dest / MARKER).read_text())
    except (OSError, ValueError):
        return None


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
            the normalised URI.
        object_store: Endpoint, credentials and addressing of the store. Unset
            fields (or ``None``) leave the standard AWS environment in charge.

    Returns:
        The local directory: configs, generation config, tokenizer files, chat
        templates, preprocessor configs, the safetensors index and ``*.py`` files.

    Idempotent: when ``dest`` already holds a complete fetch of the same objects
    (same keys, sizes and ETags) nothing is downloaded. Safe when several
    processes on one node call it at once.
    """
    return _fetch(parse_model_uri(uri), dest, require=REQUIRED_METADATA, store=object_store).path


def _fetch(
    uri: ModelURI,
    dest: str | os.PathLike[str] | None,
    *,
    require: tuple[str, ...] = REQUIRED_METADATA,
    store: ObjectStoreConfig | None = None,
) -> FetchReport:
    from filelock import FileLock

    start = time.perf_counter()
    target = Path(dest).expanduser().absolute() if dest else default_metadata_dir(uri)
    client, listing = _backends.list_model(uri, store)
    roles = {o.path: classify(o.path) for o in listing}
    # An object named like our marker would be overwritten by it: never fetched.
    metadata = [o for o in listing if roles[o.path] is FileRole.METADATA and o.path != MARKER]
    weights = [o for o in listing if roles[o.path] in (FileRole.STREAMABLE_WEIGHTS, FileRole.OTHER_WEIGHTS)]
    for obj in metadata:
        _safe_relative(obj.path, uri)
    missing = [name for name in require if name not in {o.path for o in metadata}]
    if missing:
        raise ModelNotFoundError(
            f"{str(uri)!r} has no {', '.join(missing)}; point the URI at the model "
            "directory itself (the folder that holds config.json)"
        )
    fingerprint = _fingerprint(metadata)
    streamable = {f"{uri}{o.path}": o.size for o in weights
                  if roles[o.path] is FileRole.STREAMABLE_WEIGHTS}

    def report(downloaded: bool) -> FetchReport:
        return FetchReport(
            uri=str(uri),
            path=target,
            files=len(metadata),
            bytes=sum(o.size for o in metadata),
            seconds=time.perf_counter() - start,
            downloaded=downloaded,
            skipped_weight_files=len(weights),
            skipped_weight_bytes=sum(o.size for o in weights),
            streamable=streamable,
        )

    if (_read_marker(target) or {}).get("files") == fingerprint:
        return report(downloaded=False)
    _refuse_foreign_dir(target)  # before any download
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(_lock_path(target))):
        if (_read_marker(target) or {}).get("files") == fingerprint:
            return report(downloaded=False)  # another process fetched it meanwhile
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
        try:
            _download_all(client, uri, metadata, staging)
            marker = {"uri": str(uri), "files": fingerprint}
            (staging / MARKER).write_text(json.dumps(marker, indent=1, sort_keys=True))
            _replace_dir(staging, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    result = report(downloaded=True)
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


def _download_all(client: Any, uri: ModelURI, objects: list[_backends.ObjectInfo], into: Path) -> None:
    from ray_stream_llm._report import ByteProgress, progress_enabled

    for obj in objects:
        (into / obj.path).parent.mkdir(parents=True, exist_ok=True)
    bar = ByteProgress(f"Fetching metadata of {uri}", sum(o.size for o in objects)) if (
        progress_enabled()) else None
    done = 0
    with concurrent.futures.ThreadPoolExecutor(min(_WORKERS, len(objects))) as pool:
        futures = {pool.submit(_backends.download, client, uri, o, str(into / o.path)): o for o in objects}
        try:
            for future in concurrent.futures.as_completed(futures):
                future.result()
                done += futures[future].size
                if bar is not None:
                    bar.set(done)
        finally:
            if bar is not None:
                bar.close()


def _lock_path(target: Path) -> Path:
    """The lock for ``target``, kept in the cache root, never in a user's directory."""
    locks = cache_root() / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    return locks / (hashlib.sha256(str(target).encode()).hexdigest()[:16] + ".lock")


def _refuse_foreign_dir(target: Path) -> None:
    if target.is_dir() and not (target / MARKER).exists() and any(target.iterdir()):
        raise FileExistsError(
            f"destination {str(target)!r} exists, is not empty and was not written by "
            "fetch_model_metadata; give a new or empty directory"
        )


def _replace_dir(staging: Path, target: Path) -> None:
    """Move ``staging`` to ``target``; an older ``target`` is swapped out, then removed."""
    _refuse_foreign_dir(target)
    if target.is_dir() and not (target / MARKER).exists():
        target.rmdir()  # empty
    if target.exists():
        trash = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
        os.rename(target, trash / "old")
        os.rename(staging, target)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        os.rename(staging, target)
