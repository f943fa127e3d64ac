"""The config's registration with Ray's ``ProcessorBuilder`` and the build's first checks
(ray_stream_llm/integrations/ray/registry.py): what is refused before any store call. The
preflight (which reads the store) is the edge replaced here: it records that it was reached."""

from __future__ import annotations

import pytest
import ray
from ray.llm._internal.batch.processor.base import ProcessorBuilder

from ray_stream_llm.config import StreamingvLLMEngineProcessorConfig
from ray_stream_llm.errors import InvalidModelURIError, UnsupportedRayError
from ray_stream_llm.integrations.ray import registry


@pytest.fixture
def preflights(monkeypatch):
    calls: list[object] = []
    monkeypatch.setattr(registry, "preflight", calls.append)
    return calls


def test_register_adds_the_config_once(monkeypatch):
    monkeypatch.setattr(ProcessorBuilder, "_registry", dict(ProcessorBuilder._registry))
    ProcessorBuilder._registry.pop(StreamingvLLMEngineProcessorConfig.__name__, None)
    registry.register()
    registry.register()  # Ray's register refuses a second entry: this one asks first
    assert ProcessorBuilder._registry[StreamingvLLMEngineProcessorConfig.__name__] is (
        registry._build
    )
    assert "vLLMEngineProcessorConfig" in ProcessorBuilder._registry  # Ray's own stays


def _config(model: str = "s3://bucket/m/") -> StreamingvLLMEngineProcessorConfig:
    return StreamingvLLMEngineProcessorConfig(
        model_source=model, engine_kwargs={"load_format": "runai_streamer"}
    )


def test_an_unsupported_ray_is_refused_before_the_store_is_read(monkeypatch, preflights):
    monkeypatch.setattr(ray, "__version__", "2.47.0")
    with pytest.raises(UnsupportedRayError, match=r"ray 2\.47\.0 is not supported"):
        registry._build(_config())
    assert preflights == []


def test_a_malformed_uri_is_refused_before_the_store_is_read(preflights):
    with pytest.raises(InvalidModelURIError, match="'b' is not a valid bucket name"):
        registry._build(_config("s3://b/m/"))
    assert preflights == []
