"""Every name of vLLM and torch this library relies on, in one table of data.

Each :class:`TouchPoint` is a module, a dotted name inside it and, for a callable, the
parameter names the library relies on. ``docs/architecture.md`` ("What the library touches
in vLLM and torch") explains each one (why, the versions, how it is detected, whether a
global is assigned, what upstream change it waits for) and lists exactly these names
(``tests/integration/test_compat.py`` checks both: every name against the installed vLLM and torch,
with ``inspect``, and against their source files, with ``ast``; and the table against
this list). ``tests/helpers/static_vllm.py`` checks the same data against a vLLM wheel that
cannot run here (``--vllm-wheel-dir``).

Plain data: importing this module imports neither vLLM nor torch.
"""

from __future__ import annotations

import dataclasses

# the file names vLLM's ShardedStateLoader saves a TP-only engine's ranks under
from ray_stream_llm.patterns import SHARD_PATTERN


@dataclasses.dataclass(frozen=True)
class TouchPoint:
    """``module.name`` (``name`` may be dotted: ``Class.method``, ``Class.attribute``).

    ``params``: the parameter names (``inspect.signature`` order, ``self`` included for a
    method) the library relies on; None for a name only read or wrapped whatever its
    signature. ``exact``: the library's override or replacement takes exactly these (any
    change in vLLM breaks it); otherwise they are the leading parameters it passes.
    ``instance``: ``name``'s last part is an instance attribute (set on ``self`` in a
    method, or annotated on the class), not a class attribute. ``contains``: strings the
    library matches that vLLM's source of ``name`` must contain (a log message, a call).
    ``since``: the first vLLM release that has it (None: every vLLM in range); before it
    the library does without, and the checks expect it absent. ``used_by``: the library's
    module that touches it."""

    module: str
    name: str
    used_by: str
    params: tuple[str, ...] | None = None
    exact: bool = False
    instance: bool = False
    contains: tuple[str, ...] = ()
    since: tuple[int, ...] | None = None

    def applies_to(self, release: tuple[int, ...]) -> bool:
        """Whether a vLLM of ``release`` (``(0, 32, 0)``) has it."""
        return self.since is None or release >= self.since

    @property
    def qualname(self) -> str:
        return f"{self.module}.{self.name}"

    @property
    def package(self) -> str:
        """``vllm`` or ``torch``."""
        return self.module.split(".", 1)[0]


_LOADER = "integrations/vllm/loader.py"
_PLUGIN = "integrations/vllm/plugin.py"
_CACHE = "integrations/vllm/compile_cache.py"
_AOT = "integrations/vllm/aot_fix.py"
_STORE = "integrations/vllm/compile_store.py"
_TARGET = "integrations/vllm/compile_target.py"
_CPU = "integrations/vllm/cpu.py"
_STAGE = "integrations/ray/engine_stage.py"
_WATCH = "integrations/ray/stream_watch.py"

_ML = "vllm.model_executor.model_loader"
_DECORATORS = "vllm.compilation.decorators"
# vLLM's warning when a saved AOT artifact does not load (compile_cache.LOAD_FAILURE)
LOAD_FAILURE = "Compiling model again due to a load failure"

TOUCHPOINTS: tuple[TouchPoint, ...] = (
    # the weight seam: vLLM's Run:ai loaders, subclassed and registered again
    TouchPoint(_ML, "register_model_loader", _LOADER, ("load_format",), exact=True),
    TouchPoint(
        _ML,
        "RunaiModelStreamerLoader._prepare_weights",
        _LOADER,
        ("self", "model_name_or_path", "revision"),
        exact=True,
    ),
    TouchPoint(
        _ML,
        "RunaiModelStreamerLoader._get_weights_iterator",
        _LOADER,
        ("self", "model_or_path", "revision"),  # the override takes more (*args, **kwargs)
    ),
    # vLLM's reload (reload_weights, no iterator given) asks the registered loader for
    # get_all_weights, which reaches the overridden _get_weights_iterator (0.32 on)
    TouchPoint(
        _ML,
        "RunaiModelStreamerLoader.get_all_weights",
        _LOADER,
        ("self", "model_config", "model"),
        exact=True,
        contains=("self._get_weights_iterator(",),
        since=(0, 32),
    ),
    TouchPoint(
        f"{_ML}.reload.inplace",
        "reload_weights",
        _LOADER,
        contains=("get_model_loader(load_config)", ".get_all_weights(model_config, model)"),
        since=(0, 32),
    ),
    TouchPoint(_ML, "RunaiModelStreamerLoader._is_distributed", _LOADER, instance=True),
    TouchPoint(
        _ML, "ShardedStateLoader.iterate_over_files", _LOADER, ("self", "paths"), exact=True
    ),
    # overridden: a store URI the loader cannot list is refused before vLLM >= 0.34 hands it
    # to a Hugging Face Hub download
    TouchPoint(
        _ML,
        "ShardedStateLoader._prepare_weights",
        _LOADER,
        ("self", "model_name_or_path", "revision"),
        exact=True,
    ),
    # overridden: on a region, the files are awaited before vLLM's glob lists the directory
    TouchPoint(
        _ML,
        "ShardedStateLoader.load_weights",
        _LOADER,
        ("self", "model", "model_config"),
        exact=True,
    ),
    TouchPoint(_ML, "ShardedStateLoader.load_config", _LOADER, instance=True),
    # overridden on both loaders (weight_checksums): vLLM's model, once loaded
    TouchPoint(_ML, "BaseModelLoader.load_model", _LOADER, ("self",)),
    TouchPoint("vllm.plugins", "load_general_plugins", _PLUGIN, contains=("general_plugins",)),
    TouchPoint("vllm.platforms", "current_platform", _LOADER),
    TouchPoint("vllm.platforms.interface", "Platform.is_cuda_alike", _LOADER, ("self",)),
    # current_platform.current_device(): forwarded to torch.<device_type>
    TouchPoint(
        "vllm.platforms.interface",
        "Platform.__getattr__",
        _LOADER,
        contains=("getattr(torch, self.device_type",),
    ),
    # the shard writer (ray-stream-llm shard)
    TouchPoint("vllm", "LLM", _PLUGIN),
    TouchPoint("vllm.entrypoints.llm", "LLM.llm_engine", _PLUGIN, instance=True),
    TouchPoint("vllm.v1.engine.llm_engine", "LLMEngine.engine_core", _PLUGIN, instance=True),
    TouchPoint(
        "vllm.v1.engine.core_client",
        "EngineCoreClient.save_sharded_state",
        _PLUGIN,
        ("self", "path", "pattern", "max_size"),
    ),
    TouchPoint("vllm.v1.engine.core_client", "EngineCoreClient.shutdown", _PLUGIN, ("self",)),
    TouchPoint(
        "vllm.model_executor.model_loader.sharded_state_loader",
        "ShardedStateLoader",
        _PLUGIN,
        contains=(SHARD_PATTERN,),
    ),
    TouchPoint(
        "vllm.model_executor.layers.linear",
        "UnquantizedLinearMethod.process_weights_after_loading",
        _CPU,
        ("self", "layer"),
        exact=True,
        contains=("_cpu_skip_gemm_dispatch",),
    ),
    # the compile cache: one compile per node, the load fix, the figures
    TouchPoint(
        _DECORATORS,
        "_try_load_aot_compiled_fn",
        _CACHE,
        ("model", "aot_compilation_path"),
        exact=True,
        contains=("compiled_fn.finalize_loading(", LOAD_FAILURE),
    ),
    TouchPoint(_DECORATORS, "monitor_torch_compile", _CACHE),
    TouchPoint("vllm.compilation.counter", "compilation_counter", _CACHE),
    TouchPoint("vllm.compilation.counter", "CompilationCounter.num_aot_artifacts_loaded", _CACHE),
    TouchPoint("vllm.compilation.counter", "CompilationCounter.num_aot_compiles", _CACHE),
    TouchPoint("vllm.compilation.counter", "CompilationCounter.num_aot_artifacts_saved", _CACHE),
    TouchPoint("vllm.distributed.parallel_state", "_TP", _CACHE),
    TouchPoint("vllm.distributed.parallel_state", "get_tensor_model_parallel_rank", _CACHE, ()),
    TouchPoint("torch._dynamo.aot_compile_types", "BundledAOTAutogradSerializableCallable", _AOT),
    TouchPoint("torch._dynamo.utils", "counters", _CACHE),
    # what compiled code is built for
    TouchPoint("torch._inductor.cpu_vec_isa", "pick_vec_isa", _TARGET, ()),
    TouchPoint("torch._inductor.cpu_vec_isa", "VecISA.build_arch_flags", _TARGET, ("self",)),
    TouchPoint("torch.backends.cpu", "get_cpu_capability", _TARGET, ()),
    TouchPoint("vllm.platforms.interface", "Platform.device_type", _TARGET, instance=True),
    TouchPoint("vllm.platforms.interface", "Platform.get_device_capability", _TARGET),
    TouchPoint("vllm", "__version__", _TARGET),
    # vLLM's settings the library reads or sets
    TouchPoint("vllm.envs", "VLLM_USE_AOT_COMPILE", _CACHE),
    TouchPoint("vllm.envs", "VLLM_CACHE_ROOT", _STORE),
    TouchPoint("vllm.envs", "VLLM_PLUGINS", _PLUGIN),
    TouchPoint("vllm.envs", "VLLM_RAY_EXTRA_ENV_VARS_TO_COPY", _PLUGIN),
    TouchPoint("vllm.envs", "VLLM_RPC_BASE_PATH", _PLUGIN),
    TouchPoint("vllm.envs", "VLLM_CPU_OMP_THREADS_BIND", _CPU),
    TouchPoint("vllm.envs", "VLLM_CPU_KVCACHE_SPACE", _CPU),
    # why an engine failed: vLLM's generic message, replaced by the root cause
    TouchPoint(
        "vllm.v1.engine.utils",
        "wait_for_engine_startup",
        _WATCH,
        contains=("Engine core initialization failed",),
    ),
    TouchPoint(
        "vllm.v1.executor.multiproc_executor",
        "WorkerProc.wait_for_ready",
        _WATCH,
        contains=("WorkerProc initialization failed",),
    ),
    # Ray 2.48-2.50's engine wrapper, rebuilt for vLLM >= 0.11 (engine_stage_shims)
    TouchPoint("vllm", "AsyncEngineArgs", _STAGE),
    TouchPoint("vllm.engine.arg_utils", "EngineArgs.create_engine_config", _STAGE, ("self",)),
    TouchPoint("vllm", "AsyncLLMEngine", _STAGE),
    TouchPoint("vllm.v1.engine.async_llm", "AsyncLLM.from_engine_args", _STAGE, ("engine_args",)),
    TouchPoint("vllm", "SamplingParams", _STAGE),
    TouchPoint("vllm", "PoolingParams", _STAGE),
    TouchPoint("vllm.config", "PoolerConfig", _STAGE),
    TouchPoint("vllm.sampling_params", "StructuredOutputsParams", _STAGE),
    TouchPoint("vllm.inputs", "TextPrompt", _STAGE),
    # Ray 2.51-2.54's wrapper with vLLM >= 0.19: the prompt classes where vLLM has them now
    TouchPoint("vllm.inputs.llm", "TokensPrompt", _STAGE),
    TouchPoint("vllm.inputs.llm", "TextPrompt", _STAGE),
    # a streamed engine's LoRA request for an adapter it fetched itself (engine_udf)
    TouchPoint("vllm.lora.request", "LoRARequest", "integrations/ray/engine_udf.py"),
)


__all__ = ["LOAD_FAILURE", "SHARD_PATTERN", "TOUCHPOINTS", "TouchPoint"]
