"""ray-stream-llm: Ray Data LLM batch inference that streams vLLM weights from object storage.

>>> import ray
>>> from ray.data.llm import build_processor
>>> from ray_stream_llm import ObjectStoreConfig, StreamingvLLMEngineProcessorConfig
>>> config = StreamingvLLMEngineProcessorConfig(  # doctest: +SKIP
...     model_source="s3://models/SmolLM2-135M-Instruct/",
...     engine_kwargs={"load_format": "runai_streamer"},
...     object_store=ObjectStoreConfig(endpoint_url="http://127.0.0.1:9000"),
... )
>>> processor = build_processor(config, preprocess=..., postprocess=...)  # doctest: +SKIP

The names below are imported when first taken from the package (PEP 562), so that
``import ray_stream_llm`` (and the console script) imports no Ray Data LLM: on Ray 2.54
``ray.data.llm`` imports vLLM, whose import logs to stdout. Taking
:class:`StreamingvLLMEngineProcessorConfig` or :func:`build_llm_processor` registers the
config with Ray's processor builder, so that ``ray.data.llm.build_processor(config)``
builds ours. Taking the config imports ``ray.data.llm``: on Ray 2.60 neither torch, vLLM
nor the Run:ai streamer; on older Rays torch (2.48) or torch and vLLM (2.54).
The error classes live in :mod:`ray_stream_llm.errors`.
"""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ray_stream_llm.config import StreamingvLLMEngineProcessorConfig
    from ray_stream_llm.errors import RayStreamLLMError
    from ray_stream_llm.fetch import fetch_model_metadata
    from ray_stream_llm.integrations.ray.registry import build_llm_processor
    from ray_stream_llm.integrations.ray.telemetry import load_reports, typed_errors
    from ray_stream_llm.manifest import ModelFile, ModelManifest, inspect_model
    from ray_stream_llm.patterns import FileRole
    from ray_stream_llm.reports import LoadReport
    from ray_stream_llm.stores.settings import ObjectStoreConfig

try:
    __version__ = version("ray-stream-llm")
except PackageNotFoundError:  # a source tree that is not installed
    __version__ = "0+unknown"

# each public name, by the module it is defined in
_HOMES = {
    "FileRole": "patterns",
    "LoadReport": "reports",
    "ModelFile": "manifest",
    "ModelManifest": "manifest",
    "ObjectStoreConfig": "stores.settings",
    "RayStreamLLMError": "errors",
    "StreamingvLLMEngineProcessorConfig": "config",
    "build_llm_processor": "integrations.ray.registry",
    "fetch_model_metadata": "fetch",
    "inspect_model": "manifest",
    "load_reports": "integrations.ray.telemetry",
    "typed_errors": "integrations.ray.telemetry",
}
__all__ = [
    "FileRole",
    "LoadReport",
    "ModelFile",
    "ModelManifest",
    "ObjectStoreConfig",
    "RayStreamLLMError",
    "StreamingvLLMEngineProcessorConfig",
    "build_llm_processor",
    "fetch_model_metadata",
    "inspect_model",
    "load_reports",
    "typed_errors",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'ray_stream_llm' has no attribute {name!r}")
    if name in ("StreamingvLLMEngineProcessorConfig", "build_llm_processor"):
        from ray_stream_llm.integrations.ray.registry import register

        register()  # ray.data.llm.build_processor(StreamingvLLMEngineProcessorConfig(...))
    value = getattr(importlib.import_module(f"ray_stream_llm.{home}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
