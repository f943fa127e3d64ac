"""A file written whole or not at all: what a reader polling for it may see."""

from __future__ import annotations

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
