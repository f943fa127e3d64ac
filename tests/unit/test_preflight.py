"""The driver's checks before any actor starts (ray_stream_llm/preflight.py): what it asks
of the store for each load format, and its typed errors. The store reads (the metadata fetch,
the model's inspection) are the edges replaced here; they record what they were asked."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from ray_stream_llm import preflight as module
from ray_stream_llm.config import StreamingvLLMEngineProcessorConfig
from ray_stream_llm.errors import ModelNotFoundError, NotStreamableError


@dataclass
class _Fetched:
    path: Path


class _Inspected:
    def __init__(self, problem: str | None):
        self.problem = problem

    def raise_if_not_streamable(self) -> None:
        if self.problem:
            raise NotStreamableError(self.problem)


@pytest.fixture
def store(monkeypatch, tmp_path):
    asked: dict[str, list] = {"fetch": [], "inspect": []}
    problems: list[str] = []

    def fetch(uri, object_store=None):
        asked["fetch"].append(str(uri))
        return _Fetched(tmp_path / "meta")

    def inspect(uri, **kwargs):
        asked["inspect"].append((uri, kwargs))
        return _Inspected(problems[0] if problems else None)

    monkeypatch.setattr(module, "fetch_metadata_report", fetch)
    monkeypatch.setattr(module, "inspect_model", inspect)
    asked["problems"] = problems
    return asked


def _config(**engine_kwargs) -> StreamingvLLMEngineProcessorConfig:
    return StreamingvLLMEngineProcessorConfig(
        model_source="s3://bucket/m/",
        engine_kwargs={"load_format": "runai_streamer", **engine_kwargs},
    )


def test_the_metadata_directory_is_returned_and_inspected(store, tmp_path):
    assert module.preflight(_config(tensor_parallel_size=4)) == str(tmp_path / "meta")
    ((uri, kwargs),) = store["inspect"]
    assert uri.startswith("s3://bucket/m")
    assert kwargs["metadata_dir"] == tmp_path / "meta"
    assert kwargs["tensor_parallel_size"] is None  # unsharded files fit any tp
    assert kwargs["shard_pattern"] is None


def test_a_sharded_checkpoint_is_checked_for_the_engines_ranks_and_pattern(store):
    module.preflight(
        _config(
            load_format="runai_streamer_sharded",
            tensor_parallel_size=2,
            model_loader_extra_config={"pattern": "rank-{rank}-{part}.safetensors"},
        )
    )
    ((_, kwargs),) = store["inspect"]
    assert kwargs["tensor_parallel_size"] == 2
    assert kwargs["shard_pattern"] == "rank-{rank}-{part}.safetensors"


def test_a_tokenizer_in_the_store_is_fetched_too_and_a_local_one_is_not(store):
    module.preflight(_config(tokenizer="s3://bucket/tok/"))
    module.preflight(_config(tokenizer="org/tokenizer"))
    assert store["fetch"][1] == "s3://bucket/tok/"
    assert len(store["fetch"]) == 3


def test_a_model_the_engines_would_fail_on_is_a_typed_error(store):
    store["problems"].append("model.safetensors holds int4 tensors the engine cannot load")
    with pytest.raises(NotStreamableError, match="int4"):
        module.preflight(_config())


def test_a_missing_model_is_the_stores_typed_error_before_any_inspection(store, monkeypatch):
    def missing(uri, object_store=None):
        raise ModelNotFoundError(f"not found: {str(uri)!r}; check the path")

    monkeypatch.setattr(module, "fetch_metadata_report", missing)
    with pytest.raises(ModelNotFoundError, match="check the path"):
        module.preflight(_config())
    assert store["inspect"] == []
