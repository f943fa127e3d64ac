"""Files other processes of the node may see: written whole or not at all
(:func:`write_whole`), the library's one file lock (:func:`locked`, :func:`try_locked`),
and a file's SHA-256 (:func:`sha256_of`)."""

from __future__ import annotations

import fcntl
import hashlib
import os
import threading
from pathlib import Path


def write_whole(path: str | os.PathLike[str], text: str) -> None:
    """``path`` holding ``text``, or as it was: written beside it under a hidden name of
    this process and thread, then renamed over it (a reader sees the old file or the new
    one, never a part; two writers never share a temporary file)."""
    target = Path(path)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def sha256_of(path: str | os.PathLike[str]) -> str:
    """The hex SHA-256 of the file at ``path``, read in chunks."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


class HeldLock:
    """An exclusive lock this process holds on a lock file, until :meth:`release`, the end
    of its ``with`` block or the end of the process."""

    def __init__(self, fd: int, path: Path) -> None:
        self.path = path
        self._fd: int | None = fd

    def release(self) -> None:
        """Let go (for a child forked while it was held too); a second call does nothing."""
        fd, self._fd = self._fd, None
        if fd is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)

    def __enter__(self) -> HeldLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def locked(path: str | os.PathLike[str]) -> HeldLock:
    """Wait until this process holds the exclusive lock on the file at ``path`` (made,
    empty, if missing; its directory must exist), and return it: ``with locked(p): ...``.

    What it is: an ``flock(2)`` on an open file, so it is
    - advisory: it holds back only processes that take the same lock, never a reader or
      writer of the files it guards;
    - of this node only: on a network filesystem it may serialise nothing between hosts
      (NFS, Lustre and GPFS differ), and on some it fails with ``OSError``;
    - released by the kernel when its holder releases it or its process ends, however it
      ends (SIGKILL included), so a dead holder never blocks anyone, and a lock that is free
      never says that what its holder was doing finished: check the work, not the lock. A
      child forked while it is held shares it: a holder that ends without
      :meth:`HeldLock.release` leaves it held until that child ends too;
    - not reentrant: taken again in the same process, even the same thread, it waits for
      the first hold;
    - on the file at ``path`` when granted: one removed or replaced while this process
      waited is opened again. The lock file itself is never removed here.

    What correctness depends on it for: only that two holders of one lock never run at
    once on this node (a region's reference count and removal, and its one pull, all on a
    local tmpfs). Whether a reader sees a whole file never depends on it: the library
    renames every file a reader may see into place whole (:func:`write_whole`,
    :func:`ray_stream_llm.cache.publishing`, a region's files), so a lock that fails to
    exclude (a cache on a network filesystem) costs repeated work, not a damaged file."""
    held = _lock(Path(path), blocking=True)
    assert held is not None
    return held


def try_locked(path: str | os.PathLike[str]) -> HeldLock | None:
    """:func:`locked` without waiting: the lock, or None when another holds it."""
    return _lock(Path(path), blocking=False)


def _lock(path: Path, *, blocking: bool) -> HeldLock | None:
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if blocking else fcntl.LOCK_EX | fcntl.LOCK_NB)
            now, ours = os.stat(path), os.fstat(fd)
            if (now.st_dev, now.st_ino) == (ours.st_dev, ours.st_ino):
                held, fd = HeldLock(fd, path), -1
                return held
        except BlockingIOError:
            return None
        except FileNotFoundError:  # removed while this process waited: the new one
            pass
        finally:
            if fd >= 0:
                os.close(fd)
