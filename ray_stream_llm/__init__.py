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

The error classes live in :mod:`ray_stream_llm.errors`. On Ray 2.60, importing this
package imports neither torch, vLLM nor the Run:ai streamer; on older Rays
``ray.data.llm``, which it imports, imports torch (2.48) or torch and vLLM (2.54).
"""

from importlib.metadata import PackageNotFoundError, version

from ray_stream_llm.config import StreamingvLLMEngineProcessorConfig
from ray_stream_llm.errors import RayStreamLLMError
from ray_stream_llm.fetch import fetch_model_metadata
from ray_stream_llm.integrations.ray.registry import build_llm_processor, register
from ray_stream_llm.integrations.ray.telemetry import load_reports, typed_errors
from ray_stream_llm.manifest import ModelFile, ModelManifest, inspect_model
from ray_stream_llm.patterns import FileRole
from ray_stream_llm.reports import LoadReport
from ray_stream_llm.stores.settings import ObjectStoreConfig

register()  # ray.data.llm.build_processor(StreamingvLLMEngineProcessorConfig(...)) builds ours

try:
    __version__ = version("ray-stream-llm")
except PackageNotFoundError:  # a source tree that is not installed
    __version__ = "0+unknown"

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
