"""A load report as an engine of a 2 GiB model streamed from the store writes it, for tests
of what reads one (the report's own logic, the metrics)."""

from __future__ import annotations

from typing import Any

from ray_stream_llm.reports import LoadReport


def a_load_report(**changes: Any) -> LoadReport:
    """The report, with ``changes`` to its fields."""
    base: dict[str, Any] = dict(
        model="s3://bucket/m/",
        streamed=True,
        job_id="01000000",
        node_ip="127.0.0.1",
        pid=1,
        attempt=1,
        ready_seconds=30.0,
        metadata_files=6,
        metadata_bytes=3_524_725,
        metadata_seconds=0.5,
        metadata_downloaded=True,
        weight_files=1,
        weight_bytes=2 * 1024**3,
        streamed_tensor_bytes=2 * 1024**3 - 100,
        stream_seconds=4.0,
        streamer_settings={"concurrency": "16"},
        finished_at=1.0,
    )
    return LoadReport(**{**base, **changes})
