"""ray-stream-llm: Ray Data LLM batch inference that streams vLLM weights from object storage.

>>> from ray_stream_llm import StreamingvLLMEngineProcessorConfig, build_llm_processor

Importing this package imports neither torch, vLLM nor the Run:ai streamer.
"""

from ray_stream_llm._report import LoadReport, load_reports
from ray_stream_llm.errors import (
    AccessDeniedError,
    InvalidModelURIError,
    InvalidSettingError,
    MissingBackendError,
    ModelNotFoundError,
    NotStreamableError,
    RayStreamLLMError,
    SettingsConflictError,
    StoreTimeoutError,
    StoreUnreachableError,
    UnsafeObjectKeyError,
    UnsupportedLoadFormatError,
    WeightLoadError,
)
from ray_stream_llm.fetch import fetch_model_metadata
from ray_stream_llm.manifest import ModelFile, ModelManifest, inspect_model
from ray_stream_llm.processor import StreamingvLLMEngineProcessorConfig, build_llm_processor
from ray_stream_llm.store import ObjectStoreConfig

__version__ = "0.1.0"

__all__ = [
    "AccessDeniedError",
    "InvalidModelURIError",
    "InvalidSettingError",
    "LoadReport",
    "MissingBackendError",
    "ModelFile",
    "ModelManifest",
    "ModelNotFoundError",
    "NotStreamableError",
    "ObjectStoreConfig",
    "RayStreamLLMError",
    "SettingsConflictError",
    "StoreTimeoutError",
    "StoreUnreachableError",
    "StreamingvLLMEngineProcessorConfig",
    "UnsafeObjectKeyError",
    "UnsupportedLoadFormatError",
    "WeightLoadError",
    "build_llm_processor",
    "fetch_model_metadata",
    "inspect_model",
    "load_reports",
]
