"""Errors raised by ray-stream-llm.

Each class also subclasses the builtin that fits, so callers may catch either:
``except ModelNotFoundError`` or ``except FileNotFoundError``. Every message
names the bad value and says how to fix it.
"""

from __future__ import annotations


class RayStreamLLMError(Exception):
    """Base class of every error this library raises on purpose."""


class InvalidModelURIError(RayStreamLLMError, ValueError):
    """The model URI is malformed or uses a scheme the streamer cannot read."""


class UnsupportedLoadFormatError(RayStreamLLMError, ValueError):
    """``engine_kwargs['load_format']`` looks like a streaming format but is not one."""


class UnsafeObjectKeyError(RayStreamLLMError, ValueError):
    """An object key would be written outside the destination directory."""


class ModelNotFoundError(RayStreamLLMError, FileNotFoundError):
    """The bucket, the prefix or a file the model needs does not exist."""


class AccessDeniedError(RayStreamLLMError, PermissionError):
    """The object store refused the credentials (or their absence)."""


class StoreUnreachableError(RayStreamLLMError, ConnectionError):
    """The object store endpoint could not be reached or does not speak S3."""


class StoreTimeoutError(RayStreamLLMError, TimeoutError):
    """The object store did not answer in time."""


class MissingBackendError(RayStreamLLMError, ImportError):
    """A package needed for this URI scheme is not installed."""


class SettingsConflictError(RayStreamLLMError, ValueError):
    """object_store derives a value that the user's own settings contradict."""


class NotStreamableError(RayStreamLLMError, ValueError):
    """The model's files cannot be streamed (no safetensors, broken shards, bad index)."""


class InvalidSettingError(RayStreamLLMError, ValueError):
    """A streamer setting is outside what vLLM's runai loader accepts."""


class WeightLoadError(RayStreamLLMError, ConnectionError):
    """An engine could not load the weights within the retry policy."""


class ObjectChangedError(RayStreamLLMError, RuntimeError):
    """An object of the model changed in the store while it was being read (its ETag or
    size is not the one listed); nothing of the new version was mixed into the old."""


class ForeignFilesError(RayStreamLLMError, FileExistsError):
    """The destination holds files this library did not write; nothing was changed."""


class CacheNotWritableError(RayStreamLLMError, PermissionError):
    """A directory this library must write to (the cache, a ``dest``) is not writable."""


class EngineStartError(RayStreamLLMError, RuntimeError):
    """A vLLM engine failed to start for a reason that is not the object store (a setting,
    memory, the model itself): not retried; the message quotes vLLM's root cause."""


class UnsupportedRayError(RayStreamLLMError, ImportError):
    """The installed Ray is outside the supported range, or lacks what a setting needs;
    the message names the range (or the setting) and the fix."""


class PluginNotActiveError(RayStreamLLMError, ImportError):
    """vLLM's processes would not run this library's vLLM plugin: the package was shipped
    without its metadata (runtime_env ``py_modules``, a copied directory), so its entry point
    is missing, or ``VLLM_PLUGINS`` leaves it out; the message names which and the fix."""


class WeightSharingError(RayStreamLLMError, MemoryError):
    """``weight_sharing='node'`` was asked for, and the weights cannot be shared on a node
    (not enough memory, or no memory-backed directory); the message names the sizes."""


class TensorParallelMismatchError(NotStreamableError):
    """A pre-sharded checkpoint (``runai_streamer_sharded``) holds files for other ranks than
    ``tensor_parallel_size`` needs; the message names the ranks found and the size asked."""


class IncompleteShardedCheckpointError(NotStreamableError):
    """A pre-sharded checkpoint written by ``ray-stream-llm shard`` is not complete: the
    writer stopped before its completion marker, or a file the marker lists is missing or
    changed; the message names the objects and the command that resumes it."""


class ShardOutputConflictError(RayStreamLLMError, FileExistsError):
    """The output prefix of ``ray-stream-llm shard`` holds objects it did not write, or a
    checkpoint of another model or tensor-parallel size; nothing was written there."""


class ShardWriteError(RayStreamLLMError, RuntimeError):
    """The engine of ``ray-stream-llm shard`` saved rank files that cannot be the model
    (other ranks than asked, or far fewer bytes than the source's weights); nothing was
    marked complete. The message names the sizes."""


class AdapterNotFoundError(ModelNotFoundError):
    """``dynamic_lora_loading_path`` holds no adapter sub-folders (a wrong prefix, or the
    prefix of one adapter instead of their parent), or a row names an adapter not there."""


class InvalidAdapterError(RayStreamLLMError, ValueError):
    """A LoRA adapter under ``dynamic_lora_loading_path`` cannot be served: no or broken
    ``adapter_config.json``, no weights, or a rank above the engine's ``max_lora_rank``."""


class AdapterBaseMismatchError(InvalidAdapterError):
    """A LoRA adapter records another base model (``base_model_name_or_path``) than the
    model the processor serves."""
