"""Load reports: where each engine's start-up seconds and bytes went.

Each engine actor builds one :class:`LoadReport` when its engine is ready and
publishes it three ways: one INFO log line, Ray metrics
(``ray.util.metrics``; Prometheus sees them with Ray's ``ray_`` prefix), and
a JSON entry in the Ray cluster's internal key-value store, from which
:func:`load_reports` returns a finished job's reports as data.

The streaming figures come from the engine's own processes
(:mod:`ray_stream_llm._vllm_plugin`); :class:`StreamWatcher` collects them in
the actor and shows the bytes as a Ray progress bar while they arrive.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import tempfile
import threading
import time
from typing import Any

from ray_stream_llm._vllm_plugin import REPORT_DIR_ENV, streamer_settings

logger = logging.getLogger(__name__)

KV_NAMESPACE = "ray_stream_llm"
_KV_PREFIX = "load_report"
GIB = 1 << 30


@dataclasses.dataclass(frozen=True)
class LoadReport:
    """The start of one vLLM engine in one Ray actor.

    ``weight_bytes`` is the size of the safetensors objects the engine's streamer
    read from the store (what the store served); ``streamed_tensor_bytes`` the
    tensor bytes the streamer delivered to vLLM (the objects less their JSON
    headers). The stream figures are ``None`` when they could not be measured:
    the engine did not stream, its workers are other Ray actors (Ray executor,
    tensor or pipeline parallel), or ``VLLM_PLUGINS`` excludes this library's plugin.
    """

    model: str
    streamed: bool
    job_id: str
    node_ip: str
    pid: int
    attempt: int
    ready_seconds: float
    metadata_files: int
    metadata_bytes: int
    metadata_seconds: float
    metadata_downloaded: bool
    weight_files: int | None
    weight_bytes: int | None
    streamed_tensor_bytes: int | None
    stream_seconds: float | None
    streamer_settings: dict[str, str]
    finished_at: float

    @property
    def gib_per_s(self) -> float | None:
        if not self.weight_bytes or not self.stream_seconds:
            return None
        return self.weight_bytes / GIB / self.stream_seconds

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "gib_per_s": self.gib_per_s}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LoadReport:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    def log_line(self) -> str:
        settings = " ".join(f"{k}={v}" for k, v in self.streamer_settings.items())
        if not self.streamed:
            return f"Engine ready for {self.model} in {self.ready_seconds:.1f}s (not streamed)"
        stream = (
            f"{self.weight_files} safetensors files, {self.weight_bytes} bytes streamed in "
            f"{self.stream_seconds:.2f}s ({self.gib_per_s:.3f} GiB/s)"
            if self.stream_seconds is not None
            else "stream figures not measured"
        )
        return (
            f"Engine ready for {self.model} in {self.ready_seconds:.1f}s (attempt {self.attempt}): "
            f"metadata {self.metadata_files} files, {self.metadata_bytes} bytes in "
            f"{self.metadata_seconds:.2f}s ({'downloaded' if self.metadata_downloaded else 'already on this node'}); "
            f"weights {stream}; streamer {settings}"
        )


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
                bar.set(sum(s["delivered_bytes"] for s in sessions),
                        sum(s["planned_bytes"] for s in sessions))
        finally:
            if bar is not None:
                bar.set(sum(s["delivered_bytes"] for s in self._read()))
                bar.close()


def stream_figures(sessions: list[dict[str, Any]], sizes: dict[str, int]) -> dict[str, Any]:
    """Files, object bytes, tensor bytes and seconds of the finished streaming sessions;
    ``sizes`` maps each object's URI to its size in the store."""
    done = [s for s in sessions if s.get("done")]
    if not done:
        return {"weight_files": None, "weight_bytes": None, "streamed_tensor_bytes": None,
                "stream_seconds": None}
    files = sorted({f for s in done for f in s["files"]})
    start = min(s["started"] for s in done)
    end = max(s["started"] + s["seconds"] for s in done)
    return {
        "weight_files": len(files),
        "weight_bytes": sum(sizes.get(f, 0) for f in files),
        "streamed_tensor_bytes": sum(s["delivered_bytes"] for s in done),
        "stream_seconds": end - start,
    }


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

            self._bar = tqdm(desc=desc, total=total, unit="B", unit_scale=True, unit_divisor=1024,
                             mininterval=0.5, leave=True)

    def set(self, done: int, total: int | None = None) -> None:
        scale = _mib if self._remote else int
        if total is not None:
            self._bar.total = scale(total)
        self._bar.n = scale(done)
        self._bar.refresh()

    def close(self) -> None:
        self._bar.close()


def _in_ray_worker() -> bool:
    try:
        import ray

        return ray.is_initialized() and ray._private.worker.global_worker.mode == ray.WORKER_MODE
    except Exception:
        return False


def _mib(n: int) -> float:
    return round(n / (1 << 20), 1)


def publish(report: LoadReport) -> None:
    """The log line, the metrics and the stored copy of one report; never raises."""
    logger.info("%s", report.log_line())
    for step in (_record_metrics, _store):
        try:
            step(report)
        except Exception:  # a report must never fail an engine that is ready
            logger.warning("could not %s the load report", step.__name__.strip("_"), exc_info=True)


_metrics: dict[str, Any] = {}


def _record_metrics(report: LoadReport) -> None:
    from ray.util.metrics import Counter, Gauge

    if not _metrics:
        tags = ("model", "streamed")
        _metrics.update(
            engines=Counter("stream_llm_engines_ready", "vLLM engines started by ray-stream-llm", tags),
            ready=Gauge("stream_llm_engine_ready_seconds", "Seconds from the engine actor's start to a ready engine", tags),
            metadata_bytes=Counter("stream_llm_metadata_bytes", "Bytes of metadata files on local disk for an engine (fetched or reused)", tags),
            metadata_files=Counter("stream_llm_metadata_files", "Metadata files on local disk for an engine (fetched or reused)", tags),
            metadata_seconds=Gauge("stream_llm_metadata_seconds", "Seconds the engine actor spent on the metadata fetch", tags),
            weight_bytes=Counter("stream_llm_weight_bytes_streamed", "Bytes of safetensors objects streamed from the object store", tags),
            stream_seconds=Gauge("stream_llm_weight_stream_seconds", "Seconds from the streamer's first request to its last tensor", tags),
            gib_per_s=Gauge("stream_llm_weight_stream_gib_per_s", "Streaming throughput of the engine's last load, GiB/s", tags),
        )
    tags = {"model": report.model, "streamed": str(report.streamed).lower()}
    m = _metrics
    m["engines"].inc(1, tags)
    m["ready"].set(report.ready_seconds, tags)
    if report.streamed:
        m["metadata_seconds"].set(report.metadata_seconds, tags)
        if report.metadata_bytes:
            m["metadata_bytes"].inc(report.metadata_bytes, tags)
            m["metadata_files"].inc(report.metadata_files, tags)
    if report.weight_bytes:
        m["weight_bytes"].inc(report.weight_bytes, tags)
    if report.stream_seconds is not None:
        m["stream_seconds"].set(report.stream_seconds, tags)
    if report.gib_per_s is not None:
        m["gib_per_s"].set(report.gib_per_s, tags)


def _store(report: LoadReport) -> None:
    from ray.experimental.internal_kv import _internal_kv_initialized, _internal_kv_put

    if not _internal_kv_initialized():
        return
    key = f"{_KV_PREFIX}:{report.job_id}:{report.node_ip}:{report.pid}:{report.finished_at:.6f}"
    _internal_kv_put(key, json.dumps(report.to_dict()), namespace=KV_NAMESPACE)


def load_reports(job_id: str | None = None) -> list[LoadReport]:
    """The load reports of the engines of a Ray job, oldest first.

    Args:
        job_id: The Ray job's ID (hex). By default the current driver's job: call it
            after the dataset has run, in the same process, before ``ray.shutdown()``.

    Raises:
        RuntimeError: Ray is not initialised in this process.
    """
    import ray
    from ray.experimental.internal_kv import _internal_kv_get, _internal_kv_list

    if not ray.is_initialized():
        raise RuntimeError(
            "load_reports() reads the reports from the Ray cluster: call it after the "
            "dataset ran and before ray.shutdown()"
        )
    job_id = job_id or ray.get_runtime_context().get_job_id()
    keys = _internal_kv_list(f"{_KV_PREFIX}:{job_id}:", namespace=KV_NAMESPACE)
    reports = []
    for key in keys:
        value = _internal_kv_get(key, namespace=KV_NAMESPACE)
        if value is not None:
            reports.append(LoadReport.from_dict(json.loads(value)))
    return sorted(reports, key=lambda r: r.finished_at)


def _node_ip() -> str:
    try:
        import ray

        return ray.util.get_node_ip_address()
    except Exception:
        return "unknown"


def _job_id() -> str:
    try:
        import ray

        return ray.get_runtime_context().get_job_id() or "unknown"
    except Exception:
        return "unknown"


def build_report(*, model: str, streamed: bool, attempt: int, ready_seconds: float,
                 fetched: Any | None, sessions: list[dict[str, Any]],
                 sizes: dict[str, int]) -> LoadReport:
    """The report of an engine that is ready; ``fetched`` is the actor's metadata fetch."""
    return LoadReport(
        model=model,
        streamed=streamed,
        job_id=_job_id(),
        node_ip=_node_ip(),
        pid=os.getpid(),
        attempt=attempt,
        ready_seconds=ready_seconds,
        metadata_files=fetched.files if fetched else 0,
        metadata_bytes=fetched.bytes if fetched else 0,
        metadata_seconds=fetched.seconds if fetched else 0.0,
        metadata_downloaded=bool(fetched and fetched.downloaded),
        # as the streaming process saw them; this actor's environment when nothing streamed
        streamer_settings=next((x["settings"] for x in sessions if x.get("done") and "settings" in x),
                               streamer_settings()) if streamed else {},
        finished_at=time.time(),
        **stream_figures(sessions, sizes),
    )
