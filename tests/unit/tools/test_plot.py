"""`ray-stream-llm bench --plot`: the segments of each path's cold start add up to its
first row, and the picture is a PNG."""

from __future__ import annotations

import pytest

from ray_stream_llm.tools.plot import _bars, plot

RUN = {
    "sharing": {
        "streamed.2": {
            "build_seconds": 10.0,
            "metadata_seconds": 0.5,
            "slowest_weight_seconds": 20.0,
            "slowest_ready_seconds": 60.0,
            "first_row_seconds": 80.0,
        },
        "downloaded.2": {
            "build_seconds": 12.0,
            "metadata_seconds": 0.0,
            "slowest_weight_seconds": float("nan"),
            "slowest_ready_seconds": 70.0,
            "first_row_seconds": 90.0,
        },
    }
}


def test_segments_add_up_to_the_first_row():
    bars = _bars([RUN, RUN])
    assert bars["streamed, 2 engines"] == pytest.approx([10.0, 0.5, 20.0, 39.5, 10.0])
    assert bars["downloaded, 2 engines"] == pytest.approx([12.0, 0.0, 0.0, 70.0, 8.0])
    assert sum(bars["streamed, 2 engines"]) == pytest.approx(80.0)


def test_plot_writes_a_png(tmp_path):
    out = plot([RUN], tmp_path / "cold-start.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 5000
    with pytest.raises(ValueError, match="no cold-start or node-sharing results"):
        plot([{}], tmp_path / "empty.png")
