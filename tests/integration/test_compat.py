"""The contract on every tested Ray (``make test`` on 2.60.0, ``make test-compat`` on the
others): the supported range, the builders, and drop-in fidelity (where the config does
not stream, the stage graph is Ray's own; the small-cluster defaults only where the
cluster cannot hold Ray's graph, and never in place of an accelerator request).

Each graph is built twice in one Ray cluster, by Ray's class and by the subclass, and
compared stage by stage: the UDF (ours subclasses Ray's), its constructor arguments
(ours adds ``stream``), and every ``map_batches`` argument (resources, placement,
concurrency, runtime_env).
"""

from __future__ import annotations

import functools
import inspect
import itertools
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest
import ray
import ray.data.llm
from ray.data.llm import vLLMEngineProcessorConfig

from ray_stream_llm import StreamingvLLMEngineProcessorConfig, build_llm_processor
from ray_stream_llm.errors import UnsupportedRayError
from ray_stream_llm.integrations.ray.version import SUPPORTED_RAY, check_ray_version

pytestmark = pytest.mark.e2e  # starts Ray (not vLLM)


@pytest.mark.parametrize("version", ["2.48.0", "2.54.1", "2.60.0", "2.60.1", "2.55.0rc1"])
def test_supported_range_admits(version):
    check_ray_version(version)


@pytest.mark.parametrize("version", ["2.47.1", "2.61.0", "3.0.0", "1.13.0"])
def test_outside_the_range_a_typed_error_names_the_range(version):
    with pytest.raises(UnsupportedRayError) as err:
        check_ray_version(version)
    assert f"ray {version} is not supported" in str(err.value)
    assert f"{SUPPORTED_RAY[0]} to {SUPPORTED_RAY[1]}" in str(err.value)


def test_the_installed_ray_is_in_the_range():
    check_ray_version()


@pytest.mark.s3
@pytest.mark.parametrize("builder", ["build_llm_processor", "ray.data.llm.build_processor"])
def test_a_ray_outside_the_range_is_refused_by_the_builder_before_ray_or_the_store(
    s3_server, no_aws_env, monkeypatch, builder
):
    """The builder's first check: with a Ray older than the range, building the streaming
    config raises UnsupportedRayError on the driver, naming that Ray and the range; Ray is
    not started and the store is not asked (its link carries no request). The version is
    the one the check reads, ``ray.__version__``: the builder takes none of its own."""
    from helpers.links import TappedLink

    from ray_stream_llm.stores.settings import ObjectStoreConfig

    build = getattr(ray.data.llm, "build_processor", None)
    if builder == "build_llm_processor":
        build = build_llm_processor
    elif build is None:  # Ray 2.48-2.52: its builder is ray.data.llm.build_llm_processor
        build = ray.data.llm.build_llm_processor
    assert not ray.is_initialized()
    with TappedLink(s3_server.port) as link:
        store = ObjectStoreConfig(
            endpoint_url=link.endpoint_url,
            aws_access_key_id=s3_server.access_key_id,
            aws_secret_access_key=s3_server.secret_access_key,
        )
        config = StreamingvLLMEngineProcessorConfig(
            model_source="s3://models/tiny/single/", object_store=store
        )
        monkeypatch.setattr(ray, "__version__", "2.47.1")
        with pytest.raises(UnsupportedRayError) as err:
            build(config)
        monkeypatch.undo()
        assert link.requests == []
    assert "ray 2.47.1 is not supported" in str(err.value)
    assert f"{SUPPORTED_RAY[0]} to {SUPPORTED_RAY[1]}" in str(err.value)
    assert "pip install" in str(err.value)
    assert not ray.is_initialized()


def test_map_kwargs_for_rays_own_config_on_a_ray_that_takes_none_are_refused(model_dir, request):
    """``build_llm_processor`` with Ray's own config and ``preprocess_map_kwargs``: a Ray
    without ``ray.data.llm.build_processor`` (2.48-2.52) has no way to apply them, and the
    builder refuses them with UnsupportedRayError naming them and the fix, before Ray
    starts; a Ray that has it (2.53 on) gets them."""
    config = vLLMEngineProcessorConfig(model_source=model_dir)
    maps = {"preprocess_map_kwargs": {"num_cpus": 0.25}}
    if not hasattr(ray.data.llm, "build_processor"):
        with pytest.raises(UnsupportedRayError) as err:
            build_llm_processor(config, preprocess=lambda row: row, **maps)
        message = str(err.value)
        assert f"preprocess_map_kwargs: ray {ray.__version__}" in message, message
        assert "StreamingvLLMEngineProcessorConfig" in message and "ray>=2.53" in message
        assert not ray.is_initialized()
        return
    request.getfixturevalue("small_cluster")
    processor = build_llm_processor(config, preprocess=lambda row: row, **maps)
    assert processor.preprocess_map_kwargs == maps["preprocess_map_kwargs"]


def _comparable(value: Any) -> Any:
    """A value's structure with objects replaced by their class and fields."""
    if isinstance(value, functools.partial):
        return (
            "partial",
            value.func.__qualname__,
            _comparable(value.args),
            _comparable(value.keywords),
        )
    if isinstance(value, dict):
        return {k: _comparable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_comparable(v) for v in value]
    if hasattr(value, "__dict__") and not isinstance(value, type):
        return (type(value).__qualname__, _comparable(vars(value)))
    return value


def _graph(processor: Any, env: dict[str, str] | None = None) -> dict[str, Any]:
    """The processor's stages, comparable; ``env`` added to each stage's runtime_env."""
    from ray_stream_llm.integrations.ray.runtime_env import with_defaults

    stages = {}
    for name, stage in processor.stages.items():
        ctor = dict(stage.fn_constructor_kwargs)
        kwargs = dict(stage.map_batches_kwargs)
        if env:
            kwargs["runtime_env"] = with_defaults(kwargs.get("runtime_env"), env)
        stages[name] = {
            "fn": next(c for c in stage.fn.__mro__ if c.__module__.startswith("ray.")),
            "ctor": _comparable(ctor),
            "map_batches_kwargs": _comparable(kwargs),
        }
    for attr in ("preprocess_map_kwargs", "postprocess_map_kwargs"):
        stages[attr] = _comparable(getattr(processor, attr, None) or {})
    return stages


def _build_both(
    model_dir: str, ours_only: dict | None = None, **fields: Any
) -> tuple[dict, dict, Any]:
    from ray_stream_llm.integrations.ray.compat import stage_env

    theirs = build_llm_processor(vLLMEngineProcessorConfig(model_source=model_dir, **fields))
    ours = build_llm_processor(
        StreamingvLLMEngineProcessorConfig(model_source=model_dir, **fields, **(ours_only or {}))
    )
    # Ray's graph, with the one difference the library makes where Ray's own stage workers
    # cannot make their event loop (compat.stage_env: none on most Rays)
    return _graph(theirs, stage_env()), _graph(ours), ours


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    from helpers.models import build_layout

    return str(build_layout("single", tmp_path_factory.mktemp("compat") / "model"))


@pytest.fixture(scope="module")
def _local_ray() -> Iterator[dict[str, Any]]:
    """The module's one local Ray at a time: a test that asks for a cluster of the shape
    already running gets it as it is (the tests here build graphs and run a task or two,
    and leave nothing in it), another shape stops it and starts that one; stopped after
    the module. Each start costs 5-18 s under CI's load and this file runs in each of the
    four environments: about 18 starts per run before, 3 now (the large cluster's tests stand
    together, between the first small-cluster test and the rest; the first runs before any
    Ray: on a Ray without ``build_processor`` it asserts that none was started). Fewer
    ``ray.init``/``ray.shutdown`` cycles in one process also means fewer chances of Ray's
    crash at exit after such cycles (ray-project/ray#31145)."""
    state: dict[str, Any] = {}
    yield state
    _stop(state)


def _stop(state: dict[str, Any]) -> None:
    if state.pop("shape", None) is not None:
        ray.shutdown()
        shutil.rmtree(state.pop("temp"), ignore_errors=True)


def _cluster(state: dict[str, Any], **resources: Any) -> None:
    if state.get("shape") == resources and ray.is_initialized():
        return
    _stop(state)
    assert not ray.is_initialized(), "a Ray this module did not start is running"
    temp = tempfile.mkdtemp(prefix="rsl-compat-", dir="/tmp")
    ray.init(include_dashboard=False, _temp_dir=temp, **resources)
    state.update(shape=resources, temp=temp)


@pytest.fixture
def large_cluster(_local_ray: dict[str, Any]) -> None:
    """Logical resources that hold Ray's default graph: 16 CPUs, 8 GPUs."""
    _cluster(_local_ray, num_cpus=16, num_gpus=8)


@pytest.fixture
def small_cluster(_local_ray: dict[str, Any]) -> None:
    """This machine as a laptop's Ray sees it: 2 CPUs, no GPU."""
    _cluster(_local_ray, num_cpus=2, num_gpus=0)


GRAPHS = {
    "default": {},
    "accelerator": {"accelerator_type": "L40S", "concurrency": 2},
    "tensor-parallel": {
        # the backend named: the CPU build's default for it stays out
        "engine_kwargs": {"tensor_parallel_size": 2, "distributed_executor_backend": "ray"},
        "batch_size": 16,
    },
    "streaming-format-local-dir": {"engine_kwargs": {"load_format": "runai_streamer"}},
}


@pytest.mark.parametrize("fields", GRAPHS.values(), ids=GRAPHS.keys())
def test_where_the_cluster_holds_rays_graph_the_graph_is_rays(large_cluster, model_dir, fields):
    theirs, ours, _ = _build_both(model_dir, **fields)
    assert ours == theirs


def _engine(processor: Any) -> dict[str, Any]:
    [engine] = [s for s in processor.stages.values() if "vLLMEngineStage" in type(s).__name__]
    return dict(engine.map_batches_kwargs)


def test_small_cluster_defaults_on_applies_them_on_a_large_cluster(large_cluster, model_dir):
    theirs, ours, processor = _build_both(model_dir, {"small_cluster_defaults": "on"})
    assert ours != theirs
    assert not _engine(processor).get("num_gpus")


def test_on_a_small_cpu_cluster_the_defaults_make_it_schedulable(small_cluster, model_dir):
    theirs, ours, processor = _build_both(model_dir)
    assert ours != theirs
    engine = _engine(processor)
    assert not engine.get("num_gpus")  # vLLM's CPU build, a cluster without GPUs
    cpu_stages = [
        s.map_batches_kwargs["num_cpus"]
        for s in processor.stages.values()
        if "vLLMEngineStage" not in type(s).__name__ and "num_cpus" in s.map_batches_kwargs
    ]
    assert cpu_stages and set(cpu_stages) == {0.25}


def test_on_a_small_cluster_rays_checkpoint_filter_and_the_read_keep_their_cpus(
    small_cluster, model_dir, tmp_path
):
    """Under Ray Data's job checkpointing, a re-run filters the read's rows in a
    CheckpointFilter actor (Ray 2.60: Ray Data's default 1 CPU; its config cannot change
    it). On 2 CPUs that actor and the file read take both: the CPU stage actors and the
    engine ask for none (else the read never runs: "3/2 CPU", issue 35). Ray 2.54 filters in
    the read task (the graph is the one without checkpointing); Ray 2.48 has no checkpointing."""
    from ray_stream_llm.integrations.ray.builder import checkpoint_filter_cpus

    _, plain, _ = _build_both(model_dir)
    try:
        from ray.data.checkpoint import CheckpointConfig
    except ImportError:  # Ray 2.48
        assert checkpoint_filter_cpus() == 0
        return
    context = ray.data.DataContext.get_current()
    before = context.checkpoint_config
    context.checkpoint_config = CheckpointConfig(id_column="id", checkpoint_path=str(tmp_path))
    try:
        filter_cpus = checkpoint_filter_cpus()
        _, ours, processor = _build_both(model_dir)
    finally:
        context.checkpoint_config = before
    if not hasattr(CheckpointConfig(id_column="id", checkpoint_path=str(tmp_path)),
                   "checkpoint_actor_pool_min_size"):  # fmt: skip
        assert filter_cpus == 0 and ours == plain  # Ray 2.54: no filter actor
        return
    assert filter_cpus == 1
    asked = {name: s.map_batches_kwargs.get("num_cpus") for name, s in processor.stages.items()}
    assert set(asked.values()) == {0}, asked
    assert _engine(processor)["num_cpus"] == 0


def test_tensor_parallel_on_vllms_cpu_build_runs_its_workers_as_processes(small_cluster, model_dir):
    """vLLM's CPU build has no Ray executor (which Ray picks for TP > 1): a TP=2 engine
    gets the 'mp' backend, unless the config names one. The thread binding is no stage
    setting: the engine actor decides it (tests/unit/integrations/vllm/test_cpu.py), so the
    stage's runtime_env is Ray's."""
    from ray_stream_llm.integrations.vllm import cpu

    assert cpu.is_cpu_build()
    _, _, processor = _build_both(model_dir, engine_kwargs={"tensor_parallel_size": 2})
    [engine] = [s for s in processor.stages.values() if "vLLMEngineStage" in type(s).__name__]
    assert engine.fn_constructor_kwargs["engine_kwargs"]["distributed_executor_backend"] == "mp"
    assert not any(
        name.startswith("VLLM_CPU_")
        for name in (engine.map_batches_kwargs.get("runtime_env") or {}).get("env_vars") or {}
    )
    _, _, processor = _build_both(
        model_dir,
        engine_kwargs={"tensor_parallel_size": 2, "distributed_executor_backend": "ray"},
    )
    [engine] = [s for s in processor.stages.values() if "vLLMEngineStage" in type(s).__name__]
    assert engine.fn_constructor_kwargs["engine_kwargs"]["distributed_executor_backend"] == "ray"


def test_an_accelerator_request_is_never_dropped(small_cluster, model_dir):
    _, _, processor = _build_both(model_dir, accelerator_type="L40S")
    engine = _engine(processor)
    # the engine's actors ask for that accelerator and a GPU, as Ray's own graph does
    assert engine["accelerator_type"] == "L40S"
    assert engine["num_gpus"] == 1


def test_small_cluster_defaults_off_gives_rays_graph_anywhere(small_cluster, model_dir):
    theirs, ours, _ = _build_both(model_dir, {"small_cluster_defaults": "off"})
    assert ours == theirs


def test_the_built_processor_waits_for_its_engines_an_hour_unless_the_user_set_a_wait(
    small_cluster, model_dir, monkeypatch
):
    """The builder's ENGINE_START_WAIT_S: a dataset left at Ray Data's default wait gets an
    hour for its initial engines (the rows wait for every engine the job starts with); a
    wait the user set, on the dataset's context or by Ray Data's variable, is left as set,
    and so is the process's own context, which Ray 2.48's Processor sets to 600 s."""
    from ray.data import DataContext, context

    from ray_stream_llm.integrations.ray.builder import ENGINE_START_WAIT_S
    from ray_stream_llm.integrations.ray.compat import WAIT_FOR_MIN_ACTORS_ENV

    default = context.DEFAULT_WAIT_FOR_MIN_ACTORS_S
    # whatever the processor sets, on this process's context too, is undone after the test
    monkeypatch.setattr(DataContext.get_current(), "wait_for_min_actors_s", default)
    monkeypatch.delenv(WAIT_FOR_MIN_ACTORS_ENV, raising=False)
    processor = build_llm_processor(StreamingvLLMEngineProcessorConfig(model_source=model_dir))
    # the process's context as it was: Ray 2.48's Processor sets it to 600 (ray#53124)
    assert DataContext.get_current().wait_for_min_actors_s == default

    def wait(user_wait: int | None = None) -> int:
        dataset = ray.data.from_items([{"prompt": "What is 2+2?"}])
        assert dataset.context.wait_for_min_actors_s == default  # Ray Data's, as it comes
        if user_wait is not None:
            monkeypatch.setattr(dataset.context, "wait_for_min_actors_s", user_wait)
        return int(processor(dataset).context.wait_for_min_actors_s)

    assert ENGINE_START_WAIT_S == 3600
    assert wait() == 3600
    assert wait(120) == 120  # the user's, on the dataset's context
    monkeypatch.setenv(WAIT_FOR_MIN_ACTORS_ENV, "600")  # the user's, by Ray Data's variable
    assert wait() == default  # left to Ray Data, which reads its variable itself


def test_a_store_budget_is_the_nodes_300_s_in_a_ray_worker_and_30_s_in_the_driver(
    small_cluster,
):
    """stores/base.py's default budget, decided by the process it runs in: a stage or engine
    actor (a Ray worker) gets NODE_TIMEOUT_S, its calls running beside engines compiling on
    the node; the driver, Ray initialised, keeps the preflight's DEFAULT_TIMEOUT_S."""
    from ray_stream_llm.stores.base import (
        DEFAULT_TIMEOUT_S,
        NODE_TIMEOUT_S,
        TIMEOUT_ENV,
        StoreDeadline,
    )

    def budget() -> tuple[float, str | None]:
        import os

        from ray_stream_llm.stores.base import StoreDeadline

        return StoreDeadline().total, os.environ.get("RAY_STREAM_LLM_STORE_TIMEOUT_S")

    @ray.remote(num_cpus=0)
    class Stage:
        def budget(self) -> tuple[float, str | None]:
            return budget()

    assert ray.get(ray.remote(num_cpus=0)(budget).remote()) == (NODE_TIMEOUT_S, None)
    assert ray.get(Stage.remote().budget.remote()) == (NODE_TIMEOUT_S, None)
    assert NODE_TIMEOUT_S == 300.0
    assert TIMEOUT_ENV == "RAY_STREAM_LLM_STORE_TIMEOUT_S"
    assert StoreDeadline().total == DEFAULT_TIMEOUT_S == 30.0


@pytest.mark.s3
def test_a_streamed_build_swaps_every_model_stage_and_delivers_the_settings(
    small_cluster, s3_server, tiny_models, monkeypatch, tmp_path
):
    """The streamed graph on this Ray: each stage that reads the model runs this library's
    subclass with the URI, the engine streams, and the store's settings reach every stage
    (secrets only in the UDFs' arguments)."""
    from ray_stream_llm.integrations.ray.compat import MODEL_FREE_UDFS
    from ray_stream_llm.stores.settings import ObjectStoreConfig

    monkeypatch.setenv("RAY_STREAM_LLM_CACHE", str(tmp_path / "cache"))
    uri = tiny_models["single"].uri
    store = ObjectStoreConfig(
        endpoint_url=s3_server.endpoint_url,
        aws_access_key_id=s3_server.access_key_id,
        aws_secret_access_key=s3_server.secret_access_key,
    )
    config = StreamingvLLMEngineProcessorConfig(
        model_source=uri, engine_kwargs={"load_format": "runai_streamer"}, object_store=store
    )
    builders = [build_llm_processor]
    if hasattr(ray.data.llm, "build_processor"):
        builders.append(ray.data.llm.build_processor)
    for build in builders:
        processor = build(config, preprocess=lambda row: row)
        model_stages = [s for s in processor.stages.values() if s.fn not in MODEL_FREE_UDFS]
        assert model_stages
        for stage in model_stages:
            assert stage.fn.__name__.startswith("Streaming"), stage.fn
            plan = stage.fn_constructor_kwargs["plan"]  # the driver's decisions, one argument
            assert plan.model.rstrip("/") == uri.rstrip("/")
            env = stage.map_batches_kwargs["runtime_env"]["env_vars"]
            assert env["AWS_ENDPOINT_URL"] == s3_server.endpoint_url
            assert s3_server.secret_access_key not in repr(stage.map_batches_kwargs)
        [engine] = [s for s in model_stages if "Engine" in s.fn.__name__]
        assert engine.fn_constructor_kwargs["model"].rstrip("/") == uri.rstrip("/")
        assert engine.fn_constructor_kwargs["engine_kwargs"]["load_format"] == "runai_streamer"


@ray.remote(num_cpus=0)
class _LoopProbe:
    """What Ray Data's async UDF constructor (the chat template's, the engine's) does first:
    ask Ray for an event loop, in a worker where Ray installed its event loop policy."""

    def __init__(self) -> None:
        from ray._common.utils import get_or_create_event_loop

        get_or_create_event_loop()

    def made(self) -> bool:
        return True


def _makes_a_loop(runtime_env: dict[str, Any] | None) -> bool:
    probe = _LoopProbe.options(runtime_env=runtime_env).remote()
    try:
        return ray.get(probe.made.remote(), timeout=120)
    except ray.exceptions.RayActorError as exc:
        assert "There is no current event loop" in str(exc), exc
        return False


@pytest.mark.s3
def test_every_stage_worker_gets_its_event_loop_on_this_ray(
    small_cluster, s3_server, tiny_models, monkeypatch, tmp_path
):
    """In a worker with the runtime_env of each stage this library builds, an async UDF's
    constructor gets its loop; in a plain worker it does not exactly where the library says
    its stages need uvloop off (``compat.stage_env``: Ray 2.54.1 with uvloop 0.23.0, where
    every job's chat template stage died in its constructor)."""
    from ray_stream_llm.integrations.ray.compat import stage_env

    monkeypatch.setenv("RAY_STREAM_LLM_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.endpoint_url)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3_server.access_key_id)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3_server.secret_access_key)
    config = StreamingvLLMEngineProcessorConfig(
        model_source=tiny_models["single"].uri, engine_kwargs={"load_format": "runai_streamer"}
    )
    processor = build_llm_processor(config, preprocess=lambda row: row)
    envs = {
        json.dumps(stage.map_batches_kwargs.get("runtime_env"), sort_keys=True)
        for stage in processor.stages.values()
    }
    assert [_makes_a_loop(json.loads(env)) for env in sorted(envs)] == [True] * len(envs), envs
    assert _makes_a_loop(None) == (stage_env() == {})


class _Recorder:
    """An engine that records what Ray's wrapper asks it for and finishes at once: what the
    test proves is the request the wrapper makes of this vLLM, not vLLM's answer."""

    def __init__(self) -> None:
        self.asked: list[dict[str, Any]] = []

    async def generate(self, **kwargs: Any) -> Any:
        import types

        self.asked.append(kwargs)
        yield types.SimpleNamespace(finished=True, prompt=None)


def test_the_engine_actors_wrapper_makes_prompts_this_vllm_takes():
    """Ray 2.54's engine wrapper built each prompt from ``vllm.inputs.data``, which vLLM 0.19
    removed: every request of every job failed ("module 'vllm.inputs' has no attribute
    'data'", Ray 2.54.1 with vLLM 0.29.0 here). Where that is so, the engine actor runs
    the library's wrapper, whose request to the engine carries vLLM's own prompt and the
    row's LoRA adapter (which Ray 2.54's dropped); Ray's own fails the same request (the
    control)."""
    import asyncio
    import importlib.util

    import vllm

    from ray_stream_llm.integrations.ray import engine_stage

    ray_stage = engine_stage._engine_stage
    asks_data = "vllm.inputs.data." in inspect.getsource(ray_stage.vLLMEngineWrapper)
    try:
        vllm_has_data = importlib.util.find_spec("vllm.inputs.data") is not None
    except ModuleNotFoundError:
        vllm_has_data = False
    wrapper = engine_stage._engine_wrapper()
    if not asks_data or vllm_has_data or engine_stage._needs_v1_wrapper():
        assert wrapper is not engine_stage._PromptsWrapper, wrapper  # Ray's prompts work here
        return
    assert wrapper is engine_stage._PromptsWrapper
    request = ray_stage.vLLMEngineRequest(
        request_id=7, idx_in_batch=0, prompt="hi", prompt_token_ids=[1, 2, 3], images=[],
        multimodal_data=None, mm_processor_kwargs=None, multimodal_uuids=None,
        params=vllm.SamplingParams(max_tokens=2), lora_request="the row's adapter",
    )  # fmt: skip
    for cls, works in ((wrapper, True), (ray_stage.vLLMEngineWrapper, False)):
        engine = cls.__new__(cls)
        engine.engine, engine.task_type = _Recorder(), ray_stage.vLLMTaskType.GENERATE
        if works:
            output = asyncio.run(engine._generate_async(request))
            [asked] = engine.engine.asked
            tokens_prompt, _ = engine_stage._prompt_classes()
            assert asked["prompt"] == tokens_prompt(
                prompt_token_ids=[1, 2, 3], multi_modal_data=None, mm_processor_kwargs=None,
                multi_modal_uuids=None,
            )  # fmt: skip
            assert asked["request_id"] == "7" and output.prompt == "hi"
            assert asked["lora_request"] == "the row's adapter"  # Ray 2.54's own dropped it
        else:
            with pytest.raises(AttributeError, match="has no attribute 'data'"):
                asyncio.run(engine._generate_async(request))


def test_the_installed_vllm_has_every_requirement_it_asks_for():
    """In each tested environment (vLLM 0.29 with Ray 2.48.0, 2.54.1 and 2.60; vLLM 0.32
    over Ray 2.60's), every requirement of the installed vLLM CPU build is installed at a
    version it admits, except the three it imports only for multimodal inputs, which
    ``make setup`` leaves out (requirements/vllm-cpu-deps.txt)."""
    from importlib.metadata import PackageNotFoundError, distribution, version

    from packaging.requirements import Requirement

    vllm = distribution("vllm-cpu")
    unmet = []
    for line in vllm.requires or []:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        if req.name in ("torchvision", "torchaudio", "torchcodec"):
            continue
        try:
            have = version(req.name)
        except PackageNotFoundError:
            unmet.append(f"{req} (not installed)")
            continue
        if not req.specifier.contains(have, prereleases=True):
            unmet.append(f"{req} ({have} installed)")
    assert unmet == [], f"vllm-cpu {vllm.version}: {unmet}"


def test_the_kv_cache_bound_counts_a_token_as_vllm_does(model_dir, tmp_path):
    """The CPU KV cache default is bounded by what an engine can hold
    (``memory.kv_cache_usable_bytes``): per token its keys and values in each layer for the
    rank's KV heads. The installed vLLM's own model config gives the same count, for the
    suite's tiny Llama and the bench model (its shape), whole and at TP=2."""
    import json
    from pathlib import Path

    from vllm.config import ModelConfig, ParallelConfig

    from ray_stream_llm.tools.bench import BENCH_MODEL_CONFIG
    from ray_stream_llm.weights import memory

    bench_dir = tmp_path / "bench"
    shutil.copytree(model_dir, bench_dir)
    (bench_dir / "config.json").write_text(
        json.dumps({**json.loads((bench_dir / "config.json").read_text()), **BENCH_MODEL_CONFIG})
    )
    for path, tp in itertools.product((Path(model_dir), bench_dir), (1, 2)):
        parallel = ParallelConfig(tensor_parallel_size=tp)
        theirs = ModelConfig(model=str(path))
        per_token = (
            2
            * theirs.get_num_layers(parallel)
            * theirs.get_num_kv_heads(parallel)
            * theirs.get_head_size()
            * theirs.dtype.itemsize
        )
        config = json.loads((path / "config.json").read_text())
        ours = memory.kv_cache_usable_bytes(config, {"tensor_parallel_size": tp, "max_num_seqs": 1})
        assert ours == int(theirs.max_model_len * per_token * memory.KV_CACHE_HEADROOM), (path, tp)


def test_ray_workers_import_the_package_the_driver_imports(small_cluster):
    """Ray puts the driver's working directory first on its workers' path: run from a
    checkout, a worker would import the checkout while the driver imports an installed wheel
    (make test-compat runs from build/on-wheel for this reason)."""
    import ray_stream_llm

    @ray.remote(num_cpus=0)
    def imported() -> str:
        import ray_stream_llm

        return ray_stream_llm.__file__

    assert ray.get(imported.remote()) == ray_stream_llm.__file__


def test_the_actor_table_says_when_a_holder_actor_died(small_cluster):
    """The node agent counts an actor as a region's holder while Ray's actor table has it
    alive (``agent.actor_alive``, a Ray internal read the same way across the range): an
    actor SIGKILLed, as Ray's memory monitor kills, is dead to it; an id Ray never made too."""
    import signal

    from helpers.waiting import wait_until

    from ray_stream_llm.integrations.ray.agent import actor_alive

    @ray.remote(num_cpus=0)
    class Holder:
        def who(self) -> tuple[str, int]:
            return ray.get_runtime_context().get_actor_id(), os.getpid()

    holder = Holder.remote()
    actor, pid = ray.get(holder.who.remote())
    assert actor_alive(actor)
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not actor_alive(actor), 30, "the actor table never said it died")
    assert not actor_alive("ff" * 16)


# --- what the library touches in vLLM and torch (docs/architecture.md) ----------------------
def _touch_point_ids() -> list[str]:
    from ray_stream_llm.integrations.vllm.touchpoints import TOUCHPOINTS

    return [p.qualname for p in TOUCHPOINTS]


def _is_instance_attribute(owner: type, name: str) -> bool:
    """``name`` annotated on ``owner`` or a base, or set as ``self.<name>`` in their code."""
    import inspect
    import re

    assigned = re.compile(rf"\bself\.{re.escape(name)}\s*(:[^=\n]+)?=(?!=)")
    for klass in owner.__mro__[:-1]:
        if name in vars(klass).get("__annotations__", {}):
            return True
        try:
            if assigned.search(inspect.getsource(klass)):
                return True
        except (OSError, TypeError):
            continue
    return False


def _installed_vllm_release() -> tuple[int, ...]:
    """The installed vLLM's release numbers (``0.29.0+cpu`` -> ``(0, 29, 0)``)."""
    import vllm
    from packaging.version import Version

    return Version(vllm.__version__).release


def _absent(point: Any) -> bool:
    """``point``'s module, or a part of its dotted name, is missing from the installed vLLM."""
    import importlib

    try:
        obj: Any = importlib.import_module(point.module)
    except ImportError:
        return True
    for part in point.name.split("."):
        if not hasattr(obj, part):
            return True
        obj = getattr(obj, part)
    return False


@pytest.mark.parametrize("qualname", _touch_point_ids())
def test_each_touch_point_is_in_the_installed_vllm_and_torch(qualname):
    """Each name of vLLM and torch the library relies on (touchpoints.TOUCHPOINTS, the table
    in docs/architecture.md) is in the installed vLLM and torch, imported as the library
    imports it: a callable with the parameter names the library passes or overrides
    (``inspect.signature``), a string the library matches still in its source. Runs in
    every environment: vLLM 0.29 (Ray 2.48.0, 2.54.1, 2.60) and vLLM 0.32."""
    import importlib
    import inspect

    from helpers.static_vllm import params_match

    from ray_stream_llm.integrations.vllm.touchpoints import TOUCHPOINTS

    [point] = [p for p in TOUCHPOINTS if p.qualname == qualname]
    if point.package == "vllm" and not point.applies_to(_installed_vllm_release()):
        # before its release the name is absent (the library does without it there)
        assert _absent(point), (
            f"{qualname}: in vLLM {_installed_vllm_release()}, before {point.since}"
        )
        return
    obj: Any = importlib.import_module(point.module)
    *path, last = point.name.split(".")
    for part in path:
        obj = getattr(obj, part)
    if point.instance:
        assert _is_instance_attribute(obj, last), f"{qualname}: no instance attribute {last!r}"
        return
    assert hasattr(obj, last), f"{qualname}: not in {point.module}"
    obj = getattr(obj, last)
    if point.params is not None:
        have = tuple(inspect.signature(obj).parameters)
        assert params_match(point, have), (qualname, have, point.params, point.exact)
    for wanted in point.contains:
        # vLLM's own source, under the library's wrapper where an earlier test installed it
        source = inspect.getsource(inspect.unwrap(obj))
        assert wanted in source, f"{qualname}: its source lacks {wanted!r}"


def _installed_sources() -> list[Any]:
    """The site-packages directories the installed vLLM and torch are in, vLLM's first."""
    from pathlib import Path

    import torch
    import vllm

    # vLLM's first: an environment over another's (.venvs/vllm-0.32.0 over .venv) sees an
    # older vLLM in the torch's directory too, which the static check must not read
    places = [Path(m.__file__).resolve().parent.parent for m in (vllm, torch)]
    return list(dict.fromkeys(places))


def test_the_static_check_agrees_with_the_installed_vllm_and_torch():
    """The check that reads a wheel it cannot run (tests/helpers/static_vllm.py, ``ast``
    only) finds every touch point in the installed vLLM's and torch's source files, where
    the test above found them by import; and it does fail: a parameter or a name the
    library would rely on that the installed vLLM lacks is reported by name."""
    import dataclasses

    from helpers.static_vllm import Checker, Sources, check

    from ray_stream_llm.integrations.vllm.touchpoints import TOUCHPOINTS

    places = _installed_sources()
    results = check(*places)
    assert set(results) == {p.qualname for p in TOUCHPOINTS}
    release = _installed_vllm_release()
    later = {p.qualname for p in TOUCHPOINTS if p.package == "vllm" and not p.applies_to(release)}
    wrong = {name: problems for name, problems in results.items() if problems}
    assert set(wrong) == later, wrong  # those of a later vLLM: not found, as by import
    checker = Checker(Sources(*places))
    [hook] = [p for p in TOUCHPOINTS if p.name == "_try_load_aot_compiled_fn"]
    more = dataclasses.replace(hook, params=(*(hook.params or ()), "tag"))
    assert checker.problems(more) == [
        f"{hook.qualname}: parameters {hook.params} (the library relies on {more.params})"
    ]
    gone = dataclasses.replace(hook, name="_try_load_aot_compiled_fn_v2")
    assert checker.problems(gone) == [f"{gone.qualname}: not defined in {hook.module}"]
    said = dataclasses.replace(hook, contains=("Compiling the model once more",))
    assert checker.problems(said) == [
        f"{hook.qualname}: its source no longer contains 'Compiling the model once more'"
    ]


# What a vLLM wheel that cannot run here changes in the touch points, as the static check
# finds it (the table in docs/architecture.md says what each means). vLLM 0.33.0 passes
# is_unused_weight as a third positional argument to _get_weights_iterator: found here, the
# override takes extra arguments since d7f341e, and the touch point now asks only for the
# leading three, so nothing is left changed. vLLM 0.34.0 (make test-wheel's,
# requirements/compat/vllm-wheel.txt): nothing changed either.
CHANGED_IN_WHEEL: dict[str, set[str]] = {"0.33.0": set(), "0.34.0": set()}


@pytest.mark.vllm_wheel
def test_a_vllm_wheel_has_each_touch_point(request):
    """``--vllm-wheel-dir DIR`` (``pip download vllm==X --no-deps -d DIR``): each vLLM touch
    point checked in the wheel's source, read in place, never installed or run; the touch
    points that changed are exactly those recorded for that version (none for a version
    not recorded). Torch's touch points need torch's wheel and are not checked here."""
    import zipfile
    from pathlib import Path

    from helpers.static_vllm import check
    from packaging.version import Version

    from ray_stream_llm.integrations.vllm.touchpoints import TOUCHPOINTS

    directory = Path(request.config.getoption("--vllm-wheel-dir"))
    [wheel] = sorted(directory.glob("vllm-*.whl"))
    version = wheel.name.split("-")[1]
    with zipfile.ZipFile(wheel) as z:
        assert any(n.startswith("vllm/") for n in z.namelist()), wheel
    results = check(directory, packages=("vllm",))
    assert len(results) > 40, results
    changed = {name for name, wrong in results.items() if wrong}
    release = Version(version).release
    later = {p.qualname for p in TOUCHPOINTS if p.package == "vllm" and not p.applies_to(release)}
    expected = CHANGED_IN_WHEEL.get(version, set()) | later
    assert changed == expected, {n: results[n] for n in changed ^ expected}


def test_settle_ray_data_waits_for_the_threads_a_finished_dataset_left_in_ray(
    small_cluster, monkeypatch
):
    """Ray Data tells its block prefetcher's thread to stop as a dataset's last batch is
    taken, but does not wait for it; a call into Ray that thread is in as the caller shuts
    Ray down ends the whole process (the README's ``run`` exited 1 that way on CI's loaded
    host). Here the thread's call is held until the test lets it go, 1 s later."""
    import threading

    from ray_stream_llm.integrations.ray.compat import settle_ray_data

    called, release, real_wait = threading.Event(), threading.Event(), ray.wait

    def wait(*args: Any, **kwargs: Any) -> Any:  # Ray's call, slow as on a loaded host
        if threading.current_thread().name == "Prefetcher":
            called.set()
            release.wait()
        return real_wait(*args, **kwargs)

    monkeypatch.setattr(ray, "wait", wait)
    batches = ray.data.range(8, override_num_blocks=4).iter_batches(batch_size=2)
    assert sum(len(batch["id"]) for batch in batches) == 8
    assert called.is_set()
    [left] = [t for t in threading.enumerate() if t.name == "Prefetcher" and t.is_alive()]
    threading.Timer(1.0, release.set).start()
    settle_ray_data()
    assert release.is_set() and not left.is_alive()


def test_an_engine_with_no_placement_needs_what_ray_data_gives_a_gpu_actor():
    """The resources the library expects of an engine with no placement given (a node
    without them pulls no weights) follow the Ray it runs on: Ray Data gives a GPU map
    actor that names no CPUs one CPU from Ray 2.60.0 on (ray-project/ray#66202; 2.59.0's
    wheel has not the rule), none before. Ray's own builder, on two nodes:
    tests/integration/test_engine_nodes.py."""
    from packaging.version import Version

    from ray_stream_llm.integrations.ray.compat import default_engine_resources

    since_2_60 = Version(ray.__version__) >= Version("2.60.0")
    assert default_engine_resources() == ({"GPU": 1.0, "CPU": 1.0} if since_2_60 else {"GPU": 1.0})
