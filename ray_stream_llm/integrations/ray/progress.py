"""Progress bars of bytes: Ray's distributed tqdm in a Ray worker (the driver draws it,
as it draws Ray Data's bars), plain tqdm on stderr in the driver."""

from __future__ import annotations

import os

PROGRESS_ENV = "RAY_STREAM_LLM_PROGRESS"


def progress_enabled() -> bool:
    """Progress bars unless ``RAY_STREAM_LLM_PROGRESS=0`` or Ray Data's are switched off."""
    if os.environ.get(PROGRESS_ENV, "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    try:
        from ray.data import DataContext

        return bool(DataContext.get_current().enable_progress_bars)
    except Exception:
        return True


class ByteProgress:
    """A progress bar of bytes: Ray's distributed tqdm in a Ray worker (the driver draws
    it, as it draws Ray Data's bars), plain tqdm on stderr in the driver."""

    def __init__(self, desc: str, total: int = 0):
        self._remote = _in_ray_worker()
        if self._remote:
            from ray.experimental.tqdm_ray import tqdm as ray_tqdm

            self._bar = ray_tqdm(desc=desc, total=_mib(total), unit="MiB")
        else:
            from tqdm.auto import tqdm

            self._bar = tqdm(
                desc=desc,
                total=total,
                unit="B",
                unit_scale=True,
                unit_divisor=1024,
                mininterval=0.5,
                leave=True,
            )

    def set(self, done: int, total: int | None = None) -> None:
        scale = _mib if self._remote else int
        if total is not None:
            self._bar.total = scale(total)
        self._bar.n = scale(done)
        self._bar.refresh()

    def close(self) -> None:
        self._bar.close()


def fetch_bar(desc: str, total: int) -> ByteProgress | None:
    """The metadata fetch's bar (:func:`ray_stream_llm.fetch.register_progress`), or None
    when progress bars are switched off."""
    return ByteProgress(desc, total) if progress_enabled() else None


def _in_ray_worker() -> bool:
    try:
        import ray

        return bool(
            ray.is_initialized() and ray._private.worker.global_worker.mode == ray.WORKER_MODE
        )
    except Exception:  # Ray missing or half torn down: not a worker
        return False


def _mib(n: int) -> float:
    return round(n / (1 << 20), 1)
