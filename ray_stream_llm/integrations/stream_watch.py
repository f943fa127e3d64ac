"""The engine actor's side of the load report: it collects what the vLLM plugin writes
in the engine's processes, and shows the streamed bytes as a progress bar."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
from typing import Any

from ray_stream_llm.integrations.progress import ByteProgress
from ray_stream_llm.integrations.vllm_plugin import REPORT_DIR_ENV


class StreamWatcher:
    """In the engine actor, around one engine start: points the engine's processes at a
    private report directory, turns their reports into a progress bar, and sums them."""

    def __init__(self, model: str, *, progress: bool = True):
        self.model = model
        self.progress = progress
        self.sessions: list[dict[str, Any]] = []
        self._stop = threading.Event()

    def __enter__(self) -> StreamWatcher:
        self._dir = tempfile.mkdtemp(prefix="rsl-load-")
        self._previous = os.environ.get(REPORT_DIR_ENV)
        os.environ[REPORT_DIR_ENV] = self._dir
        self._thread = threading.Thread(target=self._watch, name="rsl-stream-progress", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self.sessions = self._read()
        if self._previous is None:
            os.environ.pop(REPORT_DIR_ENV, None)
        else:
            os.environ[REPORT_DIR_ENV] = self._previous
        shutil.rmtree(self._dir, ignore_errors=True)

    def _read(self) -> list[dict[str, Any]]:
        sessions = []
        for name in sorted(os.listdir(self._dir)):
            if name.endswith(".json"):
                try:
                    with open(os.path.join(self._dir, name)) as f:
                        sessions.append(json.load(f))
                except (OSError, ValueError):  # replaced while being read: next poll
                    continue
        return sessions

    def _watch(self) -> None:
        bar = None
        try:
            while not self._stop.wait(0.5):
                sessions = self._read()
                if not sessions or not self.progress:
                    continue
                if bar is None:
                    bar = ByteProgress(f"Streaming weights of {self.model}")
                bar.set(
                    sum(s["delivered_bytes"] for s in sessions),
                    sum(s["planned_bytes"] for s in sessions),
                )
        finally:
            if bar is not None:
                bar.set(sum(s["delivered_bytes"] for s in self._read()))
                bar.close()
