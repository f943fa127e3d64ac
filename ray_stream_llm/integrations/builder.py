"""The builder registered for ``StreamingvLLMEngineProcessorConfig``.

Imported at build time only: Ray's stage modules import torch.

The streamed build checks the model on the driver (``inspect_model``), fetches its
metadata there, reuses Ray's own builder for the stage graph over the local
directory, then swaps each stage's UDF for its streaming subclass
(:mod:`ray_stream_llm.integrations.udfs`), which fetches the same metadata on its
own node (deterministic directory, one download per node). The store's settings
reach every stage through its runtime_env (:mod:`.runtime_env`).
"""

from __future__ import annotations

import logging
from typing import Any

from ray_stream_llm.config import StreamingvLLMEngineProcessorConfig
from ray_stream_llm.errors import InvalidSettingError
from ray_stream_llm.integrations.compat import (
    TESTED_RAY,
    Processor,
    build_vllm_engine_processor,
    vllm_is_cpu_build,
)
from ray_stream_llm.integrations.node_weights import DEFAULT_BASE, Sharing
from ray_stream_llm.integrations.runtime_env import deliver_env, scoped_env, store_updates
from ray_stream_llm.integrations.udfs import (
    STREAMING_UDFS,
    SecretEnv,
    StreamingvLLMEngineStageUDF,
)
from ray_stream_llm.preflight import preflight
from ray_stream_llm.stores.settings import StoreSettings, derive_settings
from ray_stream_llm.uri import parse_model_uri

logger = logging.getLogger(__name__)

CPU_STAGE_NUM_CPUS = 0.25
MAP_NUM_CPUS = 0.1
_CPU_STAGES = ("chat_template_stage", "tokenize_stage", "detokenize_stage")


def _with_cpu_default(value: Any) -> Any:
    """A stage config value (bool | dict | typed config) with ``num_cpus`` defaulted."""
    if value is True:
        return {"num_cpus": CPU_STAGE_NUM_CPUS}
    if isinstance(value, dict):
        return (
            value
            if value.get("num_cpus") is not None
            else {**value, "num_cpus": CPU_STAGE_NUM_CPUS}
        )
    if hasattr(value, "num_cpus") and value.num_cpus is None:
        return value.model_copy(update={"num_cpus": CPU_STAGE_NUM_CPUS})
    return value


def resource_defaults(config: StreamingvLLMEngineProcessorConfig) -> dict[str, Any]:
    """Config updates that let the job schedule on a small CPU-only cluster."""
    updates = {name: _with_cpu_default(getattr(config, name)) for name in _CPU_STAGES}
    if config.placement_group_config is None and vllm_is_cpu_build():
        workers = int(config.engine_kwargs.get("tensor_parallel_size", 1)) * int(
            config.engine_kwargs.get("pipeline_parallel_size", 1)
        )
        updates["placement_group_config"] = {"bundles": [{"CPU": 1}] * workers}
    return updates


def _map_kwargs_defaults(kwargs: dict[str, Any]) -> dict[str, Any]:
    kwargs = dict(kwargs)
    for name in ("preprocess_map_kwargs", "postprocess_map_kwargs"):
        given = kwargs.get(name) or {}
        kwargs[name] = (
            given if given.get("num_cpus") is not None else {**given, "num_cpus": MAP_NUM_CPUS}
        )
    return kwargs


def _engines(config: StreamingvLLMEngineProcessorConfig) -> int:
    """The most engines the config can run (concurrency, or the top of its range)."""
    concurrency = config.concurrency
    return int(max(concurrency) if isinstance(concurrency, (tuple, list)) else concurrency)


def resolve_sharing(config: StreamingvLLMEngineProcessorConfig, updates: dict[str, Any]) -> Sharing:
    """The driver's decision on node weight sharing (the node's memory is checked there)."""
    workers = int(config.engine_kwargs.get("tensor_parallel_size", 1)) * int(
        config.engine_kwargs.get("pipeline_parallel_size", 1)
    )
    base = config.weight_sharing_dir or DEFAULT_BASE
    if config.weight_sharing == "node" and workers > 1:
        raise InvalidSettingError(
            f"weight_sharing='node' needs engines of one worker, but tensor_parallel_size x "
            f"pipeline_parallel_size is {workers}; use weight_sharing='off' (or 'auto')"
        )
    if config.weight_sharing == "off" or workers > 1:
        return Sharing("off")
    if config.weight_sharing == "auto" and _engines(config) <= 1:
        return Sharing("off")
    pg = updates.get("placement_group_config") or config.placement_group_config
    bundle = dict((pg or {}).get("bundles", [{}])[0]) if isinstance(pg, dict) else {}
    return Sharing(
        "node", base=base, required=config.weight_sharing == "node", engine_resources=bundle
    )


def build_streaming_processor(
    config: StreamingvLLMEngineProcessorConfig, *, driver_dir: str | None = None, **kwargs: Any
) -> Processor:
    """The registered builder of ``StreamingvLLMEngineProcessorConfig``; ``driver_dir`` is
    what :func:`ray_stream_llm.preflight.preflight` returned, when it already ran."""
    settings = derive_settings(config.object_store)
    updates = resource_defaults(config)
    updates.update(store_updates(config, settings, updates))
    kwargs = _map_kwargs_defaults(kwargs)
    secrets = {name: settings.env[name] for name in settings.secret_env}
    secret_env = SecretEnv(secrets) if secrets else None
    if not config.streams_from_object_store:
        # Ray's own path; its downloader runs here in the driver and reads os.environ.
        with scoped_env(settings.env):
            processor = build_vllm_engine_processor(config.model_copy(update=updates), **kwargs)
        # The only changes to Ray's UDFs: the secrets delivered, the engine's load reported.
        _swap_udfs(processor, secret_env=secret_env, stream=False)
        _deliver_env(processor, settings)
        processor.config = config
        return processor

    uri = parse_model_uri(config.model_source)
    driver_dir = driver_dir or preflight(config)
    processor = build_vllm_engine_processor(
        config.model_copy(update={**updates, "model_source": driver_dir}), **kwargs
    )
    _swap_udfs(
        processor,
        secret_env=secret_env,
        stream=True,
        driver_dir=driver_dir,
        uri=str(uri),
        load_retries=config.load_retries,
        load_retry_backoff_s=config.load_retry_backoff_s,
        sharing=resolve_sharing(config, updates),
    )
    _deliver_env(processor, settings)
    processor.config = config
    logger.info("Built a streaming processor for %s: stages %s", uri, list(processor.stages))
    return processor


def _deliver_env(processor: Processor, settings: StoreSettings) -> None:
    """The non-secret settings into every stage's own runtime_env."""
    for name, stage in list(processor.stages.items()):
        kwargs = deliver_env(stage.map_batches_kwargs, settings, name)
        processor.stages[name] = stage.model_copy(update={"map_batches_kwargs": kwargs})


def _swap_udfs(
    processor: Processor,
    *,
    secret_env: SecretEnv | None,
    stream: bool,
    driver_dir: str | None = None,
    uri: str | None = None,
    load_retries: int = 0,
    load_retry_backoff_s: float = 0.0,
    sharing: Sharing | None = None,
) -> None:
    """Replace each stage's UDF by its subclass here; with ``stream`` hand every stage the
    URI in place of the driver's local directory."""
    for name, stage in list(processor.stages.items()):
        replacement = STREAMING_UDFS.get(stage.fn)
        if replacement is None:
            raise TypeError(
                f"stage {name!r} runs {stage.fn.__name__}, which ray-stream-llm does not know "
                f"how to stream; this Ray version is not supported (tested: ray {TESTED_RAY})"
            )
        ctor = dict(stage.fn_constructor_kwargs)
        if stream and ctor.get("model") == driver_dir:
            ctor["model"] = uri
        model_config_kwargs = ctor.get("model_config_kwargs")
        if (
            stream
            and isinstance(model_config_kwargs, dict)
            and model_config_kwargs.get("model") == driver_dir
        ):
            ctor["model_config_kwargs"] = {**model_config_kwargs, "model": uri}
        ctor["stream"] = stream
        if stream and sharing is not None and sharing.mode == "node":
            ctor["sharing"] = sharing
        if replacement is StreamingvLLMEngineStageUDF and stream:
            ctor["load_retries"] = load_retries
            ctor["load_retry_backoff_s"] = load_retry_backoff_s
        if secret_env is not None:
            ctor["secret_env"] = secret_env
        # model_copy, not assignment: Ray's stages validate on assignment, which
        # re-runs the engine stage's root validator and loses its placement group.
        processor.stages[name] = stage.model_copy(
            update={"fn": replacement, "fn_constructor_kwargs": ctor}
        )
