"""The progress switch (integrations/ray/progress.py, docs/reports.md): the bars of bytes are
drawn unless the user turned them off, with ``RAY_STREAM_LLM_PROGRESS=0`` or Ray Data's
``enable_progress_bars=False``. No Ray started: in the driver the bar is plain tqdm."""

from __future__ import annotations

import pytest
from ray.data import DataContext

from ray_stream_llm.integrations.ray import progress
from ray_stream_llm.integrations.ray.progress import PROGRESS_ENV, ByteProgress, fetch_bar


def _bar() -> ByteProgress | None:
    """The metadata fetch's bar as the fetch gets it (closed again at once), or None."""
    bar = fetch_bar("Fetching metadata", 1 << 20)
    if bar is not None:
        bar.close()
    return bar


@pytest.fixture
def bars_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """Neither switch set: whatever this process was started with is taken away, for the
    test to set the one it is about (the switches are the feature under test)."""
    monkeypatch.delenv(PROGRESS_ENV, raising=False)
    monkeypatch.setattr(DataContext.get_current(), "enable_progress_bars", True)


def test_a_bar_is_drawn_unless_switched_off(bars_on, monkeypatch):
    assert progress.progress_enabled() is True
    assert isinstance(_bar(), ByteProgress)
    for on in ("1", "yes", "true"):
        monkeypatch.setenv(PROGRESS_ENV, on)
        assert progress.progress_enabled() is True, on
        assert isinstance(_bar(), ByteProgress), on


@pytest.mark.parametrize("off", ["0", "false", "no", "off", " OFF "])
def test_the_variable_switches_the_bars_off(bars_on, monkeypatch, off):
    monkeypatch.setenv(PROGRESS_ENV, off)
    assert progress.progress_enabled() is False
    assert _bar() is None


def test_ray_datas_switch_turns_the_bars_off(bars_on, monkeypatch):
    monkeypatch.setattr(DataContext.get_current(), "enable_progress_bars", False)
    assert progress.progress_enabled() is False
    assert _bar() is None
