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
import itertools
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


def _graph(processor: Any) -> dict[str, Any]:
    stages = {}
    for name, stage in processor.stages.items():
        ctor = dict(stage.fn_constructor_kwargs)
        stages[name] = {
            "fn": next(c for c in stage.fn.__mro__ if c.__module__.startswith("ray.")),
            "ctor": _comparable(ctor),
            "map_batches_kwargs": _comparable(stage.map_batches_kwargs),
        }
    for attr in ("preprocess_map_kwargs", "postprocess_map_kwargs"):
        stages[attr] = _comparable(getattr(processor, attr, None) or {})
    return stages


def _build_both(
    model_dir: str, ours_only: dict | None = None, **fields: Any
) -> tuple[dict, dict, Any]:
    theirs = build_llm_processor(vLLMEngineProcessorConfig(model_source=model_dir, **fields))
    ours = build_llm_processor(
        StreamingvLLMEngineProcessorConfig(model_source=model_dir, **fields, **(ours_only or {}))
    )
    return _graph(theirs), _graph(ours), ours


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    from helpers.models import build_layout

    return str(build_layout("single", tmp_path_factory.mktemp("compat") / "model"))


def _cluster(**resources: Any) -> Iterator[None]:
    temp = tempfile.mkdtemp(prefix="rsl-compat-", dir="/tmp")
    ray.init(include_dashboard=False, _temp_dir=temp, **resources)
    try:
        yield
    finally:
        ray.shutdown()
        shutil.rmtree(temp, ignore_errors=True)


@pytest.fixture
def large_cluster() -> Iterator[None]:
    """Logical resources that hold Ray's default graph: 16 CPUs, 8 GPUs."""
    yield from _cluster(num_cpus=16, num_gpus=8)


@pytest.fixture
def small_cluster() -> Iterator[None]:
    """This machine as a laptop's Ray sees it: 2 CPUs, no GPU."""
    yield from _cluster(num_cpus=2, num_gpus=0)


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


def test_tensor_parallel_on_vllms_cpu_build_runs_its_workers_as_processes(small_cluster, model_dir):
    """vLLM's CPU build has no Ray executor (which Ray picks for TP > 1): a TP=2 engine
    gets the 'mp' backend, unless the config names one. The thread binding is no stage
    setting: the engine actor decides it (tests/test_cpu.py), so the stage's runtime_env
    is Ray's."""
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


def test_small_cluster_defaults_on_applies_them_on_a_large_cluster(large_cluster, model_dir):
    theirs, ours, processor = _build_both(model_dir, {"small_cluster_defaults": "on"})
    assert ours != theirs
    assert not _engine(processor).get("num_gpus")


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
