"""Load reports (ray_stream_llm/reports.py): the arithmetic of the report, its line and
round trip. The streamer measured in-process: tests/integration/test_loader_report.py;
the end-to-end check (log line, metrics, reports from a real Ray job):
tests/e2e/test_streamed_jobs.py."""

from __future__ import annotations

import json

import pytest
from helpers.reports import a_load_report

from ray_stream_llm.reports import LoadReport, stream_figures


def test_stream_figures_span_parallel_sessions():
    """Two worker processes streaming halves at once: seconds from the first start to the
    last end, bytes summed, each file counted once."""
    sessions = [
        {
            "done": True,
            "files": ["s3://b/m/a.safetensors"],
            "planned_bytes": 90,
            "delivered_bytes": 90,
            "started": 100.0,
            "seconds": 4.0,
        },
        {
            "done": True,
            "files": ["s3://b/m/b.safetensors"],
            "planned_bytes": 80,
            "delivered_bytes": 80,
            "started": 101.0,
            "seconds": 5.0,
        },
        {
            "done": False,
            "files": ["s3://b/m/c.safetensors"],
            "planned_bytes": 10,
            "delivered_bytes": 3,
            "started": 99.0,
            "seconds": 1.0,
        },  # a failed attempt's leftover
    ]
    sizes = {
        "s3://b/m/a.safetensors": 100,
        "s3://b/m/b.safetensors": 90,
        "s3://b/m/c.safetensors": 11,
    }
    assert stream_figures(sessions, sizes) == {
        "weight_files": 2,
        "weight_bytes": 190,
        "streamed_tensor_bytes": 170,
        "stream_seconds": 6.0,
    }
    assert stream_figures([], sizes)["stream_seconds"] is None


def test_report_line_and_round_trip():
    report = a_load_report()
    assert report.gib_per_s == 0.5
    line = report.log_line()
    assert "in 30.0s (attempt 1)" in line and "6 files, 3524725 bytes in 0.50s (downloaded)" in line
    assert (
        f"{2 * 1024**3} bytes streamed in 4.00s (0.500 GiB/s)" in line and "concurrency=16" in line
    )
    assert LoadReport.from_dict(json.loads(json.dumps(report.to_dict()))) == report
    unmeasured = a_load_report(
        weight_files=None, weight_bytes=None, streamed_tensor_bytes=None, stream_seconds=None
    )
    assert unmeasured.gib_per_s is None and "stream figures not measured" in unmeasured.log_line()
    assert "(not streamed)" in a_load_report(streamed=False).log_line()


def test_load_reports_needs_ray():
    import ray

    from ray_stream_llm import load_reports

    assert not ray.is_initialized()
    with pytest.raises(RuntimeError, match="before ray.shutdown"):
        load_reports()
