"""An engine's weights streamed from the store (ray_stream_llm/weights/store.py)."""

from __future__ import annotations

from pathlib import Path

from ray_stream_llm.fetch import FetchReport
from ray_stream_llm.uri import parse_model_uri
from ray_stream_llm.weights.store import StoreWeights


def fetched(streamable: dict[str, int]) -> FetchReport:
    return FetchReport(
        uri="s3://bucket/m/",
        path=Path("/nonexistent"),
        files=2,
        bytes=10,
        seconds=0.1,
        downloaded=True,
        refetched=(),
        skipped_weight_files=len(streamable),
        skipped_weight_bytes=sum(streamable.values()),
        streamable=streamable,
    )


def test_vllm_is_given_the_uri_and_each_streamed_file_with_its_size():
    uri = parse_model_uri("s3://bucket/m/")
    sizes = {"s3://bucket/m/a.safetensors": 7, "s3://bucket/m/b.safetensors": 9}
    source = StoreWeights(uri, fetched(sizes))
    assert source.model_weights == str(uri)
    assert source.sizes() == sizes
    source.sizes()["x"] = 1  # the caller's copy: the report's sizes stay
    assert source.sizes() == sizes
    assert source.prepare() is source and source.pull() is None and source.sharing == "off"
    source.release()
    source.release()  # idempotent


def test_the_report_says_why_the_store_was_read():
    source = StoreWeights(parse_model_uri("s3://bucket/m/"), fetched({}), "off: no room")
    assert source.sharing == "off: no room"
