"""The scale suite's own logic (ray_stream_llm/tools/bench_scale.py): its summary and table
from runs, and its /dev/shm peak from a real tmpfs. The suite itself runs engines and a
store: ``ray-stream-llm bench --suite scale`` (docs/benchmarks.md)."""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

from ray_stream_llm.tools import bench_scale

MiB = 1 << 20


def _run(model: str, **figures: float) -> dict:
    return {"model": model, "where": "measured on test, 2 CPUs", **figures}


def test_the_summary_is_the_median_and_the_spread_per_model_and_figure():
    runs = [
        _run("2GiB/1", pull_seconds=3.0, pull_peak_rss_bytes=100 * MiB),
        _run("2GiB/1", pull_seconds=1.0, pull_peak_rss_bytes=300 * MiB),
        _run("2GiB/1", pull_seconds=2.0, pull_peak_rss_bytes=200 * MiB),
        _run("2GiB/32", pull_seconds=5.0),
    ]
    table = bench_scale.summary(runs)
    assert table["2GiB/1"]["pull_seconds"] == [2.0, 1.0, 3.0]
    assert table["2GiB/32"] == {"pull_seconds": [5.0, 5.0, 5.0]}  # no figure it lacks
    text = bench_scale.format_scale(runs)
    [rss] = [line for line in text.splitlines() if line.startswith("pull_peak_rss_bytes")]
    assert "(MiB)" in rss and "200.00 (100.00-300.00)" in rss and rss.rstrip().endswith("-")
    assert "runs per model: {'2GiB/1': 3, '2GiB/32': 1}" in text


def test_the_shm_peak_sees_a_file_written_and_removed_meanwhile():
    path = Path("/dev/shm") / f"rsl-test-peak-{uuid.uuid4().hex}"
    with bench_scale._shm_peak() as seen:
        path.write_bytes(os.urandom(8 * MiB))
        deadline = time.monotonic() + 10
        while seen["peak"] < 8 * MiB and time.monotonic() < deadline:
            time.sleep(0.01)
        path.unlink()
    assert seen["peak"] >= 8 * MiB


def test_every_model_is_named_by_its_size_and_files():
    for label, (layers, files, _) in bench_scale.MODELS.items():
        size, count = label.split("/")
        assert int(count) == files and layers > 0 and size.endswith("GiB")
