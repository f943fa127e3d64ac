"""Publishing load reports: one INFO line, Ray metrics (``ray.util.metrics``; Prometheus
sees them with Ray's ``ray_`` prefix) and a JSON entry in the cluster's internal KV,
read back by :func:`load_reports`; the failures engines record, raised again as typed
errors by :func:`typed_errors`. Both are public (``ray_stream_llm.load_reports``,
``ray_stream_llm.typed_errors``) and live here because they read Ray's cluster."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Iterator
from typing import Any

from ray_stream_llm import errors
from ray_stream_llm.reports import LoadReport

logger = logging.getLogger(__name__)

KV_NAMESPACE = "ray_stream_llm"
_KV_PREFIX = "load_report"
_FAILURE_PREFIX = "load_failure"


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
            engines=Counter(
                "stream_llm_engines_ready", "vLLM engines started by ray-stream-llm", tags
            ),
            ready=Gauge(
                "stream_llm_engine_ready_seconds",
                "Seconds from the engine actor's start to a ready engine",
                tags,
            ),
            metadata_bytes=Counter(
                "stream_llm_metadata_bytes",
                "Bytes of metadata files on local disk for an engine (fetched or reused)",
                tags,
            ),
            metadata_files=Counter(
                "stream_llm_metadata_files",
                "Metadata files on local disk for an engine (fetched or reused)",
                tags,
            ),
            metadata_seconds=Gauge(
                "stream_llm_metadata_seconds",
                "Seconds the engine actor spent on the metadata fetch",
                tags,
            ),
            weight_bytes=Counter(
                "stream_llm_weight_bytes_streamed",
                "Bytes of safetensors objects streamed from the object store",
                tags,
            ),
            stream_seconds=Gauge(
                "stream_llm_weight_stream_seconds",
                "Seconds from the streamer's first request to its last tensor",
                tags,
            ),
            gib_per_s=Gauge(
                "stream_llm_weight_stream_gib_per_s",
                "Streaming throughput of the engine's last load, GiB/s",
                tags,
            ),
            rank_bytes=Counter(
                "stream_llm_weight_bytes_streamed_by_rank",
                "Bytes of safetensors objects one tensor-parallel rank streamed from the store",
                (*tags, "rank"),
            ),
            rank_seconds=Gauge(
                "stream_llm_weight_stream_seconds_by_rank",
                "Seconds one tensor-parallel rank streamed, first request to last tensor",
                (*tags, "rank"),
            ),
        )
    values = {"model": report.model, "streamed": str(report.streamed).lower()}
    m = _metrics
    m["engines"].inc(1, values)
    m["ready"].set(report.ready_seconds, values)
    if report.streamed:
        m["metadata_seconds"].set(report.metadata_seconds, values)
        if report.metadata_bytes:
            m["metadata_bytes"].inc(report.metadata_bytes, values)
            m["metadata_files"].inc(report.metadata_files, values)
    if report.weight_bytes:
        m["weight_bytes"].inc(report.weight_bytes, values)
    if report.stream_seconds is not None:
        m["stream_seconds"].set(report.stream_seconds, values)
    if report.gib_per_s is not None:
        m["gib_per_s"].set(report.gib_per_s, values)
    for entry in report.ranks or ():
        tagged = {**values, "rank": str(entry.get("rank"))}
        if entry.get("weight_bytes"):
            m["rank_bytes"].inc(entry["weight_bytes"], tagged)
        m["rank_seconds"].set(float(entry.get("seconds") or 0.0), tagged)


def _put(kind: str, job: str, node: str, pid: int, at: float, entry: dict[str, Any]) -> None:
    from ray.experimental.internal_kv import _internal_kv_initialized, _internal_kv_put

    if not _internal_kv_initialized():
        return
    key = f"{kind}:{job}:{node}:{pid}:{at:.6f}"
    _internal_kv_put(key, json.dumps(entry), namespace=KV_NAMESPACE)


def _store(report: LoadReport) -> None:
    _put(
        _KV_PREFIX, report.job_id, report.node_ip, report.pid, report.finished_at, report.to_dict()
    )


def store_failure(error: BaseException) -> None:
    """Record the typed error an engine actor is about to fail with, so that the driver's
    :func:`ray_stream_llm.typed_errors` can raise it in place of Ray's wrapper; never raises."""
    now = time.time()
    entry = {"class": type(error).__name__, "message": str(error), "time": now}
    try:
        _put(_FAILURE_PREFIX, job_id(), node_ip(), os.getpid(), now, entry)
    except Exception:  # the actor fails with the error anyway
        logger.warning("could not record the engine's failure", exc_info=True)


def _entries(kind: str, job: str | None, what: str) -> list[dict[str, Any]]:
    import ray
    from ray.experimental.internal_kv import _internal_kv_get, _internal_kv_list

    if not ray.is_initialized():
        raise RuntimeError(
            f"{what} reads from the Ray cluster: call it after the dataset ran and before "
            "ray.shutdown()"
        )
    job = job or ray.get_runtime_context().get_job_id()
    entries = []
    for key in _internal_kv_list(f"{kind}:{job}:", namespace=KV_NAMESPACE):
        value = _internal_kv_get(key, namespace=KV_NAMESPACE)
        if value is not None:
            entries.append(json.loads(value))
    return entries


def node_ip() -> str:
    try:
        import ray

        return ray.util.get_node_ip_address()
    except Exception:
        return "unknown"


def job_id() -> str:
    try:
        import ray

        return ray.get_runtime_context().get_job_id() or "unknown"
    except Exception:
        return "unknown"


def load_reports(job_id: str | None = None) -> list[LoadReport]:
    """The load reports of the engines of a Ray job, oldest first.

    Args:
        job_id: The Ray job's ID (hex). By default the current driver's job: call it
            after the dataset has run, in the same process, before ``ray.shutdown()``.

    Raises:
        RuntimeError: Ray is not initialised in this process.

    >>> ds.materialize()  # doctest: +SKIP
    >>> [r.weight_bytes for r in load_reports()]  # doctest: +SKIP
    [269060552]
    """
    entries = _entries(_KV_PREFIX, job_id, "load_reports()")
    return sorted((LoadReport.from_dict(entry) for entry in entries), key=lambda r: r.finished_at)


@contextlib.contextmanager
def typed_errors(job_id: str | None = None) -> Iterator[None]:
    """Run a Ray Data job so that an engine's load failure raises this library's typed
    error, not Ray's wrapper.

    When an engine actor cannot start, Ray Data raises ``ray.exceptions.ActorDiedError``
    (or a ``RayTaskError``), which ``except WeightLoadError`` does not catch. Inside this
    block, such a failure is raised again as the error the engine failed with
    (:class:`~ray_stream_llm.errors.WeightLoadError`,
    :class:`~ray_stream_llm.errors.EngineStartError`, the typed store error, or
    :class:`~ray_stream_llm.errors.ObjectChangedError` where the node's shared pull saw an
    object change), with Ray's exception as ``__cause__``. Other failures pass through unchanged.

    >>> from ray_stream_llm.errors import WeightLoadError
    >>> try:  # doctest: +SKIP
    ...     with typed_errors():
    ...         processor(ds).materialize()
    ... except WeightLoadError as exc:
    ...     print("the store failed:", exc)
    """
    try:
        yield
    except errors.RayStreamLLMError:
        raise
    except Exception as exc:
        try:
            failures = _entries(_FAILURE_PREFIX, job_id, "typed_errors()")
        except Exception:  # Ray already shut down: nothing recorded to find
            failures = []
        if not failures:
            raise
        last = sorted(failures, key=lambda e: e["time"])[-1]  # the newest
        cls = getattr(errors, str(last.get("class")), None)
        if not (isinstance(cls, type) and issubclass(cls, errors.RayStreamLLMError)):
            cls = errors.RayStreamLLMError
        raise cls(str(last.get("message"))) from exc
