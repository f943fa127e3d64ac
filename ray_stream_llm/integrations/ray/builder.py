"""The builder registered for ``StreamingvLLMEngineProcessorConfig``.

Imported at build time only: Ray's stage modules import torch.

The streamed build checks the model on the driver (``inspect_model``), fetches its
metadata there, reuses Ray's own builder for the stage graph over the local
directory, then swaps each stage's UDF for its streaming subclass
(:mod:`ray_stream_llm.integrations.ray.udfs`; the engine's in
:mod:`~ray_stream_llm.integrations.ray.engine_udf`), which fetches the same metadata on its
own node (deterministic directory, one download per node). The store's settings
reach every stage through its runtime_env (:mod:`.runtime_env`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

import ray

from ray_stream_llm.config import StreamingvLLMEngineProcessorConfig, streaming_load_format
from ray_stream_llm.env import scoped
from ray_stream_llm.errors import InvalidSettingError, UnsupportedRayError
from ray_stream_llm.integrations.ray.agent import finish_at_exit_of_this_process
from ray_stream_llm.integrations.ray.compat import (
    HAS_PLACEMENT_GROUP_CONFIG,
    MODEL_FREE_UDFS,
    SUPPORTED_RAY,
    ChatTemplateUDF,
    DetokenizeUDF,
    Processor,
    TokenizeUDF,
    default_engine_resources,
    ray_builds_with,
    stage_env,
    wait_for_initial_actors,
)
from ray_stream_llm.integrations.ray.engine_stage import vLLMEngineStageUDF
from ray_stream_llm.integrations.ray.engine_udf import StreamingvLLMEngineStageUDF
from ray_stream_llm.integrations.ray.runtime_env import (
    deliver_env,
    job_runtime_env,
    store_updates,
    with_defaults,
)
from ray_stream_llm.integrations.ray.udfs import (
    PrepareMultimodalUDF,
    SecretEnv,
    StreamingChatTemplateUDF,
    StreamingDetokenizeUDF,
    StreamingPrepareMultimodalUDF,
    StreamingTokenizeUDF,
)
from ray_stream_llm.integrations.vllm import cpu
from ray_stream_llm.plan import Plan
from ray_stream_llm.stores.settings import StoreSettings
from ray_stream_llm.uri import parse_model_uri
from ray_stream_llm.weights.region import DEFAULT_BASE, Sharing

logger = logging.getLogger(__name__)

# Ray's stage UDF -> this library's subclass (pickled by reference: the tokenizer-side
# ones from udfs, which imports no vLLM; the engine's from engine_udf)
STREAMING_UDFS: dict[type, type] = {
    ChatTemplateUDF: StreamingChatTemplateUDF,
    TokenizeUDF: StreamingTokenizeUDF,
    DetokenizeUDF: StreamingDetokenizeUDF,
    vLLMEngineStageUDF: StreamingvLLMEngineStageUDF,
}
if PrepareMultimodalUDF is not None:  # Ray >= 2.53
    STREAMING_UDFS[PrepareMultimodalUDF] = StreamingPrepareMultimodalUDF

CPU_STAGE_NUM_CPUS = 0.25
MAP_NUM_CPUS = 0.1
_RAY_STAGE_CPUS = 1.0  # what Ray Data reserves for a map actor or task that names none
# A file read or write task around the processor (read_json, write_parquet: Ray Data's
# default CPU). The actors a small cluster holds leave room for one, else the job stalls
# before its first row
FILE_TASK_CPUS = _RAY_STAGE_CPUS
# How long the rows wait for the engines a job starts with (Ray Data's wait_for_min_actors_s,
# where the user left it unset): as long as engine starts take (metadata, the node's pull,
# vLLM's compile; minutes each), bounded so that a cluster that never places them fails
ENGINE_START_WAIT_S = 3600


def _workers(config: StreamingvLLMEngineProcessorConfig) -> int:
    """The engine's workers: tensor_parallel_size x pipeline_parallel_size."""
    kwargs = config.engine_kwargs
    return int(kwargs.get("tensor_parallel_size", 1)) * int(kwargs.get("pipeline_parallel_size", 1))


def _engines(config: StreamingvLLMEngineProcessorConfig, *, least: bool = False) -> int:
    """The most engines the config can run (concurrency, or its range's top); ``least``:
    the fewest it starts with."""
    concurrency = config.concurrency
    if isinstance(concurrency, (tuple, list)):
        return int(min(concurrency) if least else max(concurrency))
    return int(concurrency)


def _user_placed_engine(config: StreamingvLLMEngineProcessorConfig) -> bool:
    """The config says where its engines run: kept as Ray builds it, never replaced."""
    return bool(
        config.accelerator_type
        or getattr(config, "placement_group_config", None)
        or getattr(config, "resources_per_bundle", None)
    )


def cluster_resources(config: StreamingvLLMEngineProcessorConfig) -> dict[str, float]:
    """The cluster's resources; Ray is started as Ray's builder starts it (its first step)."""
    ray.init(runtime_env=config.runtime_env, ignore_reinit_error=True)
    return {name: float(value) for name, value in ray.cluster_resources().items()}


def cpu_engines(config: StreamingvLLMEngineProcessorConfig, cluster: dict[str, float]) -> bool:
    """Whether each engine asks for CPUs only: the CPU build of vLLM, and its rule
    (:func:`ray_stream_llm.integrations.vllm.cpu.engines_on_cpus`)."""
    if not cpu.is_cpu_build():
        return False
    return cpu.engines_on_cpus(
        setting=config.small_cluster_defaults,
        user_placed=_user_placed_engine(config),
        gpus=cluster.get("GPU", 0.0),
        gpus_needed=_workers(config) * _engines(config, least=True),
    )


def resource_defaults(
    config: StreamingvLLMEngineProcessorConfig, cluster: dict[str, float] | None = None
) -> dict[str, Any]:
    """Config updates made before Ray's builder runs: CPU-only engine bundles where
    :func:`cpu_engines` says so (Ray >= 2.5x; on Ray 2.48 see :func:`_place_engines`)."""
    if cluster is None or not cpu_engines(config, cluster) or not HAS_PLACEMENT_GROUP_CONFIG:
        return {}
    return {"placement_group_config": {"bundles": cpu.cpu_bundles(_workers(config))}}


def checkpoint_filter_cpus() -> float:
    """CPUs of the actors that Ray Data's job checkpointing adds to the job's graph, where
    the current DataContext has a ``checkpoint_config`` when the processor is built: from
    Ray 2.60 a re-run (a checkpoint holding rows) filters the read's rows in a
    ``CheckpointFilter`` actor pool of ``checkpoint_actor_pool_min_size`` actors that ask
    for Ray Data's default CPU each (its config sets only their memory, 1 GiB; a job that
    does not leave room for them stalls). Counted whether or
    not the checkpoint holds rows yet (a first run then reserves less). Ray 2.54 filters in
    the read task itself (no actor, nothing counted); 0 without checkpointing."""
    checkpoint = getattr(ray.data.DataContext.get_current(), "checkpoint_config", None)
    actors = getattr(checkpoint, "checkpoint_actor_pool_min_size", 0) if checkpoint else 0
    return _RAY_STAGE_CPUS * int(actors or 0)


def _cpu_stage_cpus(processor: Processor) -> float:
    """CPUs the CPU stage actors reserve (one actor each; Ray Data's default where unset)."""
    stages = (stage for stage in processor.stages.values() if not _is_engine(stage))
    return sum(
        float(stage.map_batches_kwargs.get("num_cpus") or _RAY_STAGE_CPUS) for stage in stages
    )


def _cpu_stage_needs(processor: Processor, engine_cpus: float, engines: int) -> float:
    """CPUs Ray's stage graph reserves before its first row: one actor per CPU stage,
    the engines it starts with, one map task, one file read or write task and the
    checkpoint filter actors (:func:`checkpoint_filter_cpus`)."""
    total = _RAY_STAGE_CPUS + FILE_TASK_CPUS + checkpoint_filter_cpus() + engine_cpus * engines
    return total + _cpu_stage_cpus(processor)


def _is_engine(stage: Any) -> bool:
    return issubclass(stage.fn, vLLMEngineStageUDF)


def _update_engine_map_kwargs(
    processor: Processor, change: Callable[[dict[str, Any]], dict[str, Any]]
) -> None:
    """The engine stage's ``map_batches`` kwargs replaced by ``change`` of a copy of them
    (``model_copy``: assignment would re-run Ray's validator, see :func:`_swap_udfs`)."""
    for name, stage in list(processor.stages.items()):
        if _is_engine(stage):
            kwargs = change(dict(stage.map_batches_kwargs))
            processor.stages[name] = stage.model_copy(update={"map_batches_kwargs": kwargs})


def small_cluster(
    config: StreamingvLLMEngineProcessorConfig,
    processor: Processor,
    cluster: dict[str, float],
    engine_on_cpu: bool,
) -> bool:
    """Whether the CPU stages and maps get the small defaults: asked for, or the cluster's
    CPUs cannot hold Ray's graph (a deadlock: the engines wait for rows the tokenizer never
    gets a CPU to make)."""
    if config.small_cluster_defaults != "auto":
        return config.small_cluster_defaults == "on"
    engine_cpus = float(_workers(config)) if engine_on_cpu else 1.0
    needs = _cpu_stage_needs(processor, engine_cpus, _engines(config, least=True))
    return cluster.get("CPU", 0.0) < needs


def _apply_small_defaults(processor: Processor) -> set[str]:
    """0.25 CPU for each CPU stage actor, 0.1 for the pre/postprocess maps, where unset;
    the CPU stages it set."""
    done = set()
    for name, stage in list(processor.stages.items()):
        kwargs = stage.map_batches_kwargs
        if _is_engine(stage) or kwargs.get("num_cpus") is not None:
            continue
        processor.stages[name] = stage.model_copy(
            update={"map_batches_kwargs": {**kwargs, "num_cpus": CPU_STAGE_NUM_CPUS}}
        )
        done.add(name)
    for attr in ("preprocess_map_kwargs", "postprocess_map_kwargs"):  # Ray >= 2.5x
        given = getattr(processor, attr, None)
        if isinstance(given, dict) and given.get("num_cpus") is None:
            setattr(processor, attr, {**given, "num_cpus": MAP_NUM_CPUS})
    return done


def _no_cpu_actors(processor: Processor, stages: set[str]) -> None:
    """The CPU stage actors named (those the small defaults set) and the engine actor ask
    for no CPU: where the file task and Ray's checkpoint filter leave none for them."""
    for name in stages:
        stage = processor.stages[name]
        kwargs = {**stage.map_batches_kwargs, "num_cpus": 0}
        processor.stages[name] = stage.model_copy(update={"map_batches_kwargs": kwargs})
    _update_engine_map_kwargs(processor, lambda kwargs: {**kwargs, "num_cpus": 0})


def _engine_cpus_left(
    config: StreamingvLLMEngineProcessorConfig, processor: Processor, cluster: dict[str, float]
) -> float | None:
    """The CPUs each engine worker may ask for, when less than one: what the cluster has
    after the CPU stage actors, one file read or write task (:data:`FILE_TASK_CPUS`) and
    Ray's checkpoint filter actors (:func:`checkpoint_filter_cpus`), shared by the workers
    of the engines the job starts with (rounded down to 0.05); None when a whole CPU each
    fits, or when nothing is left to share without checkpointing (a 1-CPU cluster); 0.0
    when the checkpoint filter leaves nothing (2 CPUs: the read and the filter take both):
    then the CPU stage actors and the engines ask for no CPU."""
    stages = _cpu_stage_cpus(processor)
    workers = _workers(config) * _engines(config, least=True)
    checkpoint = checkpoint_filter_cpus()
    left = (cluster.get("CPU", 0.0) - FILE_TASK_CPUS - checkpoint - stages) / workers
    share = int(left * 20) / 20
    if share <= 0 and checkpoint:
        return 0.0
    return share if 0 < share < 1 else None


def _place_engines(
    config: StreamingvLLMEngineProcessorConfig, processor: Processor, cpus: float = 1
) -> None:
    """Ray 2.48 (no ``placement_group_config``): each engine asks for its workers' CPUs
    (``cpus`` each) instead of GPUs."""
    workers = _workers(config)

    def on_cpus(kwargs: dict[str, Any]) -> dict[str, Any]:
        kwargs.pop("num_gpus", None)
        return {**kwargs, "num_cpus": workers * cpus}

    _update_engine_map_kwargs(processor, on_cpus)


def _engine_bundle(
    config: StreamingvLLMEngineProcessorConfig,
    updates: dict[str, Any],
    engine_on_cpu: bool = False,
) -> dict[str, float]:
    """The resources one single-worker engine asks Ray for, as Ray's vLLM stage asks them
    (``vllm_engine_stage``): the placement group's bundle (``placement_group_config``,
    from the updates or the config; its ``bundle_per_worker`` or first bundle); Ray 2.48's
    ``resources_per_bundle``; the CPUs of an engine placed on CPUs; else what Ray's engine
    actor asks (``compat.default_engine_resources``: ``num_gpus=1``, and Ray Data's
    default CPU on Ray 2.60). An ``accelerator_type`` adds Ray's
    ``accelerator_type:<type>`` resource, as Ray does. Never empty: a node that lacks
    any of it cannot host an engine, and its stage actors do not pull the weights."""
    bundle: dict[str, float] = {}
    pg = updates.get("placement_group_config") or getattr(config, "placement_group_config", None)
    resources = getattr(config, "resources_per_bundle", None)  # Ray 2.48
    if isinstance(pg, dict) and (pg.get("bundle_per_worker") or pg.get("bundles")):
        bundle = dict(pg.get("bundle_per_worker") or pg["bundles"][0])
    elif isinstance(resources, dict) and resources:
        bundle = dict(resources)
    elif engine_on_cpu:
        bundle = {"CPU": float(_workers(config))}
    else:
        bundle = default_engine_resources()
    if config.accelerator_type:
        bundle[f"accelerator_type:{config.accelerator_type}"] = 0.001
    return {k: float(v) for k, v in bundle.items() if v}


def resolve_sharing(
    config: StreamingvLLMEngineProcessorConfig, updates: dict[str, Any], engine_on_cpu: bool
) -> Sharing:
    """The driver's decision on node weight sharing (the node's memory is checked where
    the weights are pulled, on each node, again before each pull; only nodes with the
    resources of an engine, :func:`_engine_bundle`, pull)."""
    workers = _workers(config)
    base = config.weight_sharing_dir or DEFAULT_BASE
    engine_kwargs = updates.get("engine_kwargs") or config.engine_kwargs
    backend = engine_kwargs.get("distributed_executor_backend")
    # every worker reads the node's region only where every worker is a process of the
    # engine actor ('mp'); Ray's executor may place them on other nodes
    if config.weight_sharing == "node" and workers > 1 and backend != "mp":
        raise InvalidSettingError(
            f"weight_sharing='node' needs every worker of an engine on its node, but "
            f"tensor_parallel_size x pipeline_parallel_size is {workers} with "
            f"distributed_executor_backend={backend!r}; set "
            "engine_kwargs['distributed_executor_backend']='mp' (the workers are processes "
            "of the engine actor) or use weight_sharing='off' (or 'auto')"
        )
    # rank files (runai_streamer_sharded) are read once per engine already: nothing to share
    sharded = streaming_load_format(engine_kwargs) == "runai_streamer_sharded"
    if config.weight_sharing == "off" or (workers > 1 and (backend != "mp" or sharded)):
        return Sharing("off")
    return Sharing(
        "node",
        base=base,
        required=config.weight_sharing == "node",
        engine_resources=_engine_bundle(config, updates, engine_on_cpu),
        pull_timeout_s=_store_budget(config),
        keep_warm_s=config.keep_warm_s,
        peers=config.weight_peers,
        kv_cache_engines=_kv_cache_engines(config),
    )


def _store_budget(config: StreamingvLLMEngineProcessorConfig) -> float | None:
    """The store budget the user set (``object_store.timeout_s``), else None: the nodes'
    default (:data:`ray_stream_llm.stores.base.NODE_TIMEOUT_S`)."""
    store = config.object_store
    return store.timeout_s if store is not None and "timeout_s" in store.model_fields_set else None


def _kv_cache_engines(config: StreamingvLLMEngineProcessorConfig) -> int:
    """With vLLM's CPU build, the engines whose KV cache a node's shared weights leave room
    for (:func:`ray_stream_llm.integrations.vllm.cpu.kv_cache_engines`, in the environment
    the engines get: the driver's and the job's runtime_env); else none."""
    if not cpu.is_cpu_build():
        return 0
    env_vars = (config.runtime_env or {}).get("env_vars") or {}
    return cpu.kv_cache_engines({**os.environ, **env_vars})


def _build_ray_graph(
    config: StreamingvLLMEngineProcessorConfig,
    cluster: dict[str, float],
    updates: dict[str, Any],
    **kwargs: Any,
) -> tuple[Processor, bool]:
    """Ray's own stage graph for ``config`` with ``updates``; the resource defaults applied
    only where the cluster needs them. Returns it and whether the engines run on CPUs."""
    engine_on_cpu = cpu_engines(config, cluster)
    if cpu.is_cpu_build():  # TP/PP > 1: the workers are processes of the engine actor
        engine_kwargs = updates.get("engine_kwargs") or config.engine_kwargs
        updates["engine_kwargs"] = cpu.parallel_engine_kwargs(engine_kwargs, _workers(config))
    processor = ray_builds_with(config.model_copy(update=updates), **kwargs)
    if engine_on_cpu and not HAS_PLACEMENT_GROUP_CONFIG:
        _place_engines(config, processor)
    if small_cluster(config, processor, cluster, engine_on_cpu):
        logger.info(
            "Small cluster (%s CPUs, %s GPUs): stage actors reserve %s CPU, maps %s CPU, "
            "engines %s (small_cluster_defaults=%r)",
            cluster.get("CPU", 0),
            cluster.get("GPU", 0),
            CPU_STAGE_NUM_CPUS,
            MAP_NUM_CPUS,
            "CPUs only" if engine_on_cpu else "as Ray asks",
            config.small_cluster_defaults,
        )
        defaulted = _apply_small_defaults(processor)
        share = _engine_cpus_left(config, processor, cluster) if engine_on_cpu else None
        # not with Ray's executor ('ray'): it places the workers in a placement group, whose
        # bundles cannot be empty
        engine_kwargs = updates.get("engine_kwargs") or config.engine_kwargs
        if share == 0 and engine_kwargs.get("distributed_executor_backend") != "ray":
            logger.info(
                "Small cluster: the file read or write task and Ray's checkpoint filter "
                "actors (%s CPU) leave no CPU: the CPU stage actors and the engines reserve "
                "none",
                checkpoint_filter_cpus(),
            )
            _no_cpu_actors(processor, defaulted)
        elif share:  # the engines' bundles shrink to leave the file task a CPU
            logger.info("Small cluster: each engine worker reserves %s CPU", share)
            if HAS_PLACEMENT_GROUP_CONFIG:
                updates["placement_group_config"] = {
                    "bundles": cpu.cpu_bundles(_workers(config), share)
                }
                processor = ray_builds_with(config.model_copy(update=updates), **kwargs)
                _apply_small_defaults(processor)
            else:
                _place_engines(config, processor, share)
    return processor, engine_on_cpu


def build_streaming_processor(
    config: StreamingvLLMEngineProcessorConfig,
    settings: StoreSettings,
    *,
    driver_dir: str | None = None,
    **kwargs: Any,
) -> Processor:
    """The registered builder of ``StreamingvLLMEngineProcessorConfig``, called by
    :func:`ray_stream_llm.integrations.ray.registry._build` once it checked the Ray version
    and the config, derived the store's ``settings`` and, for a streamed model, ran the
    preflight (``driver_dir``: the metadata it fetched and checked)."""
    # what the engines' processes leave when this driver's own Ray ends is cleaned after it
    finish_at_exit_of_this_process()
    secrets = {name: settings.env[name] for name in settings.secret_env}
    secret_env = SecretEnv(secrets) if secrets else None
    if not config.streams_from_object_store:
        # Ray's own path; its downloader runs here in the driver and reads os.environ.
        with scoped(settings.env):
            cluster = cluster_resources(config)
            updates = resource_defaults(config, cluster)
            updates.update(store_updates(config, settings, updates))
            processor, _ = _build_ray_graph(config, cluster, updates, **kwargs)
        # The only changes to Ray's UDFs: the secrets delivered, the engine's load reported.
        _swap_udfs(processor, secret_env=secret_env)
        _deliver_env(processor, settings, config)
        wait_for_initial_actors(processor, ENGINE_START_WAIT_S)
        processor.config = config
        return processor

    if driver_dir is None:
        raise ValueError("a streamed build needs the preflight's metadata directory")
    uri = parse_model_uri(config.model_source)
    cluster = cluster_resources(config)
    updates = resource_defaults(config, cluster)
    updates.update(store_updates(config, settings, updates))
    updates["model_source"] = driver_dir
    processor, engine_on_cpu = _build_ray_graph(config, cluster, updates, **kwargs)
    plan = Plan(
        uri=uri,
        sharing=resolve_sharing(config, updates, engine_on_cpu),
        load_retries=config.load_retries,
        load_retry_backoff_s=config.load_retry_backoff_s,
        compile_cache_uri=config.compile_cache_uri,
        weight_checksums=config.weight_checksums,
    )
    _swap_udfs(processor, secret_env=secret_env, plan=plan, driver_dir=driver_dir)
    _deliver_env(processor, settings, config)
    wait_for_initial_actors(processor, ENGINE_START_WAIT_S)
    processor.config = config
    logger.info("Built a streaming processor for %s: stages %s", uri, list(processor.stages))
    return processor


def _deliver_env(
    processor: Processor, settings: StoreSettings, config: StreamingvLLMEngineProcessorConfig
) -> None:
    """The non-secret settings into every stage's own runtime_env, and what this Ray's stage
    workers need (``compat.stage_env``) where the user did not choose it."""
    needed = stage_env(config.runtime_env, job_runtime_env())
    for name, stage in list(processor.stages.items()):
        kwargs = deliver_env(stage.map_batches_kwargs, settings, name)
        if needed:
            kwargs["runtime_env"] = with_defaults(kwargs.get("runtime_env"), needed)
        processor.stages[name] = stage.model_copy(update={"map_batches_kwargs": kwargs})


def _swap_udfs(
    processor: Processor,
    *,
    secret_env: SecretEnv | None,
    plan: Plan | None = None,
    driver_dir: str | None = None,
) -> None:
    """Replace each stage's UDF by its subclass here; with a ``plan`` (streamed) hand every
    stage the plan, and the URI in place of the driver's local directory."""
    for name, stage in list(processor.stages.items()):
        if stage.fn in MODEL_FREE_UDFS:
            continue  # reads no model: nothing to fetch or stream
        replacement = STREAMING_UDFS.get(stage.fn)
        if replacement is None:
            raise UnsupportedRayError(
                f"stage {name!r} runs {stage.fn.__name__}, which ray-stream-llm does not know "
                f"how to stream on ray {ray.__version__}; supported: ray "
                f"{SUPPORTED_RAY[0]} to {SUPPORTED_RAY[1]}"
            )
        ctor = dict(stage.fn_constructor_kwargs)
        if plan is not None:
            if ctor.get("model") == driver_dir:
                ctor["model"] = plan.model
            model_config_kwargs = ctor.get("model_config_kwargs")
            if (
                isinstance(model_config_kwargs, dict)
                and model_config_kwargs.get("model") == driver_dir
            ):
                ctor["model_config_kwargs"] = {**model_config_kwargs, "model": plan.model}
            ctor["plan"] = plan
        if secret_env is not None:
            ctor["secret_env"] = secret_env
        # model_copy, not assignment: Ray's stages validate on assignment, which
        # re-runs the engine stage's root validator and loses its placement group.
        processor.stages[name] = stage.model_copy(
            update={"fn": replacement, "fn_constructor_kwargs": ctor}
        )
