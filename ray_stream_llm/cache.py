"""Where this library keeps files on a node, and how a directory appears there whole.

:func:`cache_root` is the one rule for the cache location. :func:`publishing` is the
one way a directory is written: under a per-target file lock, into a staging
directory next to the target, renamed into place only when complete (so readers see
nothing or everything, and a process killed at any point leaves no half directory in
its place). Staging and swapped-out directories left by a killed process are removed
by the next publisher of the same target, under the same lock. Directories are made
readable by every user of the node (0755), files keep the umask's mode.

The lock is :func:`ray_stream_llm.files.locked` (its limits are stated there): it does
not serialise processes on different hosts that share the directory over NFS.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from ray_stream_llm.errors import CacheNotWritableError
from ray_stream_llm.files import locked, try_locked

CACHE_ENV = "RAY_STREAM_LLM_CACHE"
DIR_MODE = 0o755


def cache_root() -> Path:
    """``$RAY_STREAM_LLM_CACHE``, else ``$XDG_CACHE_HOME/ray_stream_llm``, else
    ``~/.cache/ray_stream_llm``; ``~`` expanded in each."""
    if root := os.environ.get(CACHE_ENV):
        return Path(root).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or "~/.cache"
    return Path(xdg).expanduser() / "ray_stream_llm"


def make_dirs(path: Path, *, setting: str) -> Path:
    """``path`` and its parents, created readable by all; a typed error naming ``setting``
    (the variable or argument that chose the path) when it cannot be written."""
    try:
        path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
        if not os.access(path, os.W_OK | os.X_OK):
            raise PermissionError(f"{path} is not writable")
    except OSError as exc:
        raise CacheNotWritableError(
            f"cannot write to {str(path)!r} ({exc.strerror or exc}); set {setting} to a "
            "writable directory"
        ) from None
    return path


def _staging_prefixes(target: Path) -> tuple[str, str]:
    return f".{target.name}.tmp-", f".{target.name}.old-"


def _lock_path(target: Path, lock_dir: Path | None) -> Path:
    locks = make_dirs(lock_dir or cache_root() / "locks", setting=CACHE_ENV)
    return locks / (hashlib.sha256(str(target).encode()).hexdigest()[:16] + ".lock")


def _remove_stale(target: Path) -> None:
    for prefix in _staging_prefixes(target):
        for stale in target.parent.glob(prefix + "*"):
            shutil.rmtree(stale, ignore_errors=True)


def sweep(target: Path, *, lock_dir: Path | None = None) -> None:
    """Remove what a killed publisher of ``target`` left next to it, if any, when its lock
    is free (a publisher holding it is still at work: its staging directory is left alone)."""
    prefixes = _staging_prefixes(target)
    if not any(any(target.parent.glob(p + "*")) for p in prefixes):
        return
    if (held := try_locked(_lock_path(target, lock_dir))) is not None:
        with held:
            _remove_stale(target)


@contextlib.contextmanager
def publishing(
    target: Path, *, lock_dir: Path | None = None, setting: str = CACHE_ENV
) -> Iterator[Path]:
    """Hold ``target``'s lock and yield a fresh staging directory for it. On a normal exit
    the caller has either moved the staging directory into place with :func:`replace`
    or left it to be removed. Stale staging directories of ``target`` are removed first."""
    make_dirs(target.parent, setting=setting)
    with locked(_lock_path(target, lock_dir)):
        _remove_stale(target)
        try:
            staging = Path(tempfile.mkdtemp(prefix=_staging_prefixes(target)[0], dir=target.parent))
        except OSError as exc:
            raise CacheNotWritableError(
                f"cannot write to {str(target.parent)!r} ({exc.strerror or exc}); set "
                f"{setting} to a writable directory"
            ) from None
        try:
            os.chmod(staging, DIR_MODE)  # mkdtemp makes it private; the cache is shared
            yield staging
        finally:
            shutil.rmtree(staging, ignore_errors=True)


def replace(staging: Path, target: Path) -> None:
    """Move ``staging`` to ``target``; an older ``target`` (the caller checked it is ours)
    is swapped out first, then removed. Call inside :func:`publishing`."""
    if target.is_dir() and not any(target.iterdir()):
        target.rmdir()
    if not target.exists():
        os.rename(staging, target)
        return
    trash = Path(tempfile.mkdtemp(prefix=_staging_prefixes(target)[1], dir=target.parent))
    os.rename(target, trash / "old")
    os.rename(staging, target)
    shutil.rmtree(trash, ignore_errors=True)
