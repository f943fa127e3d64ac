"""The one helper that changes this process's environment for a block: the variables a
library reads from ``os.environ`` as it makes a client or starts a process (the store's SDKs,
the streamer, vLLM's processes), set for that moment and restored after."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping


@contextlib.contextmanager
def scoped(env: Mapping[str, str | None]) -> Iterator[None]:
    """Set ``env`` in this process for the block (a value of None unsets that variable),
    then restore each variable it names as it was. Not thread-safe: callers that may run
    side by side hold a lock of their own."""
    saved = {name: os.environ.get(name) for name in env}
    try:
        for name, value in env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
