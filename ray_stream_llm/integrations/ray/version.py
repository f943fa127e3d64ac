"""The Ray versions this library supports, checked before anything is built.

A leaf (imports only ``ray``), so that the check runs before Ray's stage modules
(and torch) are imported.
"""

from __future__ import annotations

import ray

from ray_stream_llm.errors import UnsupportedRayError

SUPPORTED_RAY = ("2.48.0", "2.60.0")  # both ends tested (docs/compatibility.md)
TESTED_RAY = ("2.48.0", "2.54.1", "2.60.0")


def _minor(text: str) -> tuple[int, int]:
    """``(2, 48)`` of ``2.48.0``: a minor's patch releases and dev builds are in its range."""
    major, minor = [*text.split("."), "0", "0"][:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


def check_ray_version(version: str | None = None) -> None:
    """Raise :class:`UnsupportedRayError` for a Ray outside the supported range."""
    version = version or ray.__version__
    low, high = SUPPORTED_RAY
    if not _minor(low) <= _minor(version) <= _minor(high):
        raise UnsupportedRayError(
            f"ray {version} is not supported: ray-stream-llm supports ray {low} to {high} "
            f"(tested: {', '.join(TESTED_RAY)}); install a Ray of that range, e.g. "
            f"pip install 'ray[data]=={high}'"
        )
