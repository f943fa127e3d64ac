"""A holder of a region asks its puller again while the region fills
(``weights.region.NodeWeights.tend``): a real region directory, a puller that records its
calls; no Ray, no store."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.waiting import wait_until

from ray_stream_llm.errors import WeightSharingError
from ray_stream_llm.stores import ObjectInfo
from ray_stream_llm.uri import parse_model_uri
from ray_stream_llm.weights import region as region_module
from ray_stream_llm.weights.marks import FAILED
from ray_stream_llm.weights.pull import pull_error
from ray_stream_llm.weights.region import Holder, NodeWeights, Sharing

OBJECTS = (ObjectInfo(path="model.safetensors", key="m/model.safetensors", size=4, etag="e"),)


@pytest.fixture
def weights(tmp_path, monkeypatch):
    monkeypatch.setattr(region_module, "TEND_S", 0.05)
    calls: list[Path] = []
    failing: list[Exception] = []

    def puller(region: Path) -> None:
        calls.append(region)
        if failing:
            raise failing[0]

    held = NodeWeights(
        parse_model_uri("s3://models/m/"),
        OBJECTS,
        Sharing("node", base=str(tmp_path / "base")),
        Holder(keeper=lambda region: None, puller=puller),
    )
    held.calls, held.failing = calls, failing  # type: ignore[attr-defined]
    yield held
    held.release()


def test_a_holder_asks_again_while_the_region_fills_and_stops_when_it_is_whole(weights):
    region = Path(weights.acquire())
    wait_until(lambda: len(weights.calls) >= 3, 10, "the puller was not asked again")
    (region / "model.safetensors").write_bytes(b"1234")  # whole (the pull renames it so)
    wait_until(lambda: weights._tending is None, 10, "the holder still asks")
    asked = len(weights.calls)
    weights.tend()  # an engine's next start attempt: asked once more, then settled
    wait_until(lambda: weights._tending is None, 10, "the holder still asks")
    assert len(weights.calls) == asked + 1


def test_a_puller_that_raises_fails_the_pull_with_a_typed_error_until_asked_again(weights):
    weights.failing.append(RuntimeError("the node agent of node n1 did not take pull"))
    region = Path(weights.acquire())
    wait_until(lambda: pull_error(region) is not None, 10, "no failure mark")
    error = pull_error(region)
    assert isinstance(error, WeightSharingError)
    assert "did not take pull" in str(error) and str(region) in str(error)
    assert "weight_sharing='off'" in str(error)
    wait_until(lambda: weights._tending is None, 10, "the holder asks on after a failure")
    asked = len(weights.calls)
    weights.failing.clear()
    weights.tend()  # the engine's next attempt asks again despite the failure mark
    wait_until(lambda: len(weights.calls) > asked, 10, "not asked again")


def test_a_released_holder_stops_asking(weights):
    weights.acquire()
    wait_until(lambda: len(weights.calls) >= 1, 10, "the puller was never asked")
    weights.release()
    wait_until(lambda: weights._tending is None, 10, "the released holder still asks")


def test_an_attempt_after_a_failed_pull_asks_before_it_returns(weights):
    """An engine's start attempt after a failed pull (``tend(now=True)``) asks its puller in
    its own thread: when it returns, the puller has cleared the failure mark (as the agent's
    ``start_pull`` does when it claims the pull), before vLLM's processes could read it."""
    region = Path(weights.acquire())
    wait_until(lambda: weights.calls, 10, "the puller was never asked")
    (region / FAILED).write_text("{}")  # the attempt before failed
    wait_until(lambda: weights._tending is None, 10, "the holder asks on after a failure")
    weights.puller = lambda r: (weights.calls.append(r), (r / FAILED).unlink())
    asked = len(weights.calls)
    weights.tend(now=True)
    assert len(weights.calls) > asked and not (region / FAILED).exists()
