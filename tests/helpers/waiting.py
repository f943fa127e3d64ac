"""Waiting on a real condition, never on a sleep: the suite's one deadline loop."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(
    predicate: Callable[[], T],
    timeout: float,
    message: str | Callable[[], str],
    poll: float = 0.05,
) -> T:
    """Call ``predicate`` until it returns something truthy, and return that; after
    ``timeout`` s an AssertionError with ``message`` (a string, or a function called then,
    for a message that shows the state at the deadline). The predicate is tried once more
    at the deadline, so a condition met while the loop slept is not missed."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() >= deadline:
            result = predicate()
            if result:
                return result
            text = message() if callable(message) else message
            raise AssertionError(f"not reached within {timeout:g} s: {text}")
        time.sleep(poll)
