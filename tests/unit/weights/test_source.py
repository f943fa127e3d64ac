"""Which source an engine's weights come from (``acquire``: ray_stream_llm/weights/source.py):
a region in tmp_path filled by a puller that writes it, no Ray, no store."""

from __future__ import annotations

from pathlib import Path

from ray_stream_llm.fetch import FetchReport
from ray_stream_llm.stores import ObjectInfo
from ray_stream_llm.uri import parse_model_uri
from ray_stream_llm.weights.region import Holder, RegionWeights, Sharing
from ray_stream_llm.weights.source import acquire
from ray_stream_llm.weights.store import StoreWeights

URI = parse_model_uri("s3://bucket/m/")
OBJECTS = (ObjectInfo(path="model.safetensors", key="m/model.safetensors", size=4, etag="e"),)
FETCHED = FetchReport(
    uri=str(URI),
    path=Path("/nonexistent"),
    files=1,
    bytes=1,
    seconds=0.0,
    downloaded=True,
    refetched=(),
    skipped_weight_files=1,
    skipped_weight_bytes=4,
    streamable={f"{URI}model.safetensors": 4},
    weight_objects=OBJECTS,
)


def test_without_node_sharing_the_engine_streams_the_store():
    for sharing in (None, Sharing("off")):
        source = acquire(URI, FETCHED, sharing)
        assert isinstance(source, StoreWeights) and source.sharing == "off"


def test_node_sharing_gives_the_nodes_region(tmp_path):
    pulled: list[Path] = []
    source = acquire(
        URI,
        FETCHED,
        Sharing("node", base=str(tmp_path / "base")),
        Holder(keeper=lambda region: None, puller=pulled.append),
    )
    try:
        assert isinstance(source, RegionWeights) and source.sharing == "node"
        region = Path(source.region)
        assert region.is_relative_to(tmp_path / "base") and region.is_dir()
        assert source.model_weights == str(URI)  # vLLM's compile key: the same on every node
    finally:
        source.release()
