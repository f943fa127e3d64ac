"""The engine actor's side of the load report: it collects what the vLLM plugin writes
in the engine's processes, and shows the streamed bytes as a progress bar."""

from __future__ import annotations

import shutil
import tempfile
import threading
from typing import Any

from ray_stream_llm.env import scoped
from ray_stream_llm.integrations.ray.progress import ByteProgress
from ray_stream_llm.integrations.vllm.checksums import PREFIX as CHECKSUM
from ray_stream_llm.integrations.vllm.compile_cache import REPORT_DIR_ENV, read_reports

_KINDS = ("failure-", CHECKSUM)  # the other files' prefixes; the sessions have none


class StreamWatcher:
    """In the engine actor, around one engine start: points the engine's processes at a
    private report directory, turns their reports into one progress bar (closed at 100%),
    and collects the streaming sessions and the failures vLLM logged."""

    def __init__(self, model: str, *, progress: bool = True):
        self.model = model
        self.progress = progress
        self.sessions: list[dict[str, Any]] = []
        self.failures: list[dict[str, Any]] = []
        self.checksums: list[dict[str, Any]] = []  # weight_checksums=True: one per rank
        self._stop = threading.Event()

    def __enter__(self) -> StreamWatcher:
        self._dir = tempfile.mkdtemp(prefix="rsl-load-")
        self._env = scoped({REPORT_DIR_ENV: self._dir})  # vLLM's processes inherit it
        self._env.__enter__()
        self._thread = threading.Thread(target=self._watch, name="rsl-stream-progress", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sessions = self._read("")
        self.failures = sorted(self._read("failure-"), key=lambda f: f.get("time", 0.0))
        self.checksums = sorted(self._read(CHECKSUM), key=lambda c: (c["rank"] or 0, c["pid"]))
        self._env.__exit__(None, None, None)
        shutil.rmtree(self._dir, ignore_errors=True)

    @property
    def streaming_interrupted(self) -> bool:
        """Whether a streaming session started and did not finish: the weights stopped
        arriving (the store, or the link to it, is the usual cause)."""
        return any(not s.get("done") for s in self.sessions)

    def _read(self, prefix: str) -> list[dict[str, Any]]:
        """The JSON files of the directory: failures with ``prefix='failure-'``, the
        weight checksums with ``prefix='checksum-'``, the streaming sessions with
        ``prefix=''``."""

        def kind(name: str) -> str:
            return next((p for p in _KINDS if name.startswith(p)), "")

        return read_reports(self._dir, lambda name: kind(name) == prefix)

    def _watch(self) -> None:
        bar = None
        finished = False
        try:
            while not self._stop.wait(0.5) and not finished:
                sessions = self._read("")
                if not sessions or not self.progress:
                    continue
                if bar is None:
                    bar = ByteProgress(f"Streaming weights of {self.model}")
                bar.set(
                    sum(s["delivered_bytes"] for s in sessions),
                    sum(s["planned_bytes"] for s in sessions),
                )
                finished = all(s.get("done") for s in sessions)  # 100%: stop redrawing
        finally:
            if bar is not None:
                bar.set(sum(s["delivered_bytes"] for s in self._read("")))
                bar.close()


def root_cause(failures: list[dict[str, Any]]) -> str | None:
    """The first exception vLLM logged while the engine started, as ``Type: message``
    (its innermost cause that is not vLLM's generic wrapper), or None."""
    generic = ("Engine core initialization failed", "WorkerProc initialization failed")
    for failure in failures:
        for exc in reversed(failure.get("chain") or []):
            message = str(exc.get("message", "")).strip()
            if message and not message.startswith(generic):
                return f"{exc.get('type')}: {message}"
    return None


def from_streamer(failures: list[dict[str, Any]]) -> bool:
    """Whether an exception vLLM logged came from the Run:ai streamer."""
    return any(
        str(exc.get("module", "")).startswith("runai_model_streamer")
        for failure in failures
        for exc in failure.get("chain") or []
    )
