"""The Ray Data LLM internals this library builds on, imported in one place, and every
difference between the Ray versions it supports (2.48.0 to 2.60.0) absorbed here.

Imported at build time and in the stage actors only: Ray's stage modules import torch.
Nothing here imports Ray's engine stage, which imports vLLM: the tokenizer-side stage
actors never load vLLM (:mod:`ray_stream_llm.integrations.ray.engine_stage` has the engine's
differences).
Differences are found by feature detection (fields, signatures, attributes), not by
version tables; the only version test is the supported range itself
(:func:`~ray_stream_llm.integrations.ray.version.check_ray_version`). What differs across the range:

- Ray up to 2.52 builds a multimodal stage with ``PrepareImageUDF`` (no model); Ray
  2.53 on with ``PrepareMultimodalUDF`` (model config).
- Ray's builder takes ``preprocess_map_kwargs``/``postprocess_map_kwargs``, and
  ``ray.data.llm`` has ``build_processor``, from 2.53 on; before, the processor
  applies them itself (:class:`_MapKwargsProcessor`).
- The config has ``placement_group_config`` from 2.50 on, per-stage configs
  (``chat_template_stage``...) from 2.53 on; Ray 2.48 has flat flags and
  ``resources_per_bundle``.
- Ray 2.48-2.50's engine wrapper calls the vLLM API of its day (``task=``,
  ``VLLM_USE_V1``, ``GuidedDecodingParams``, ``vllm.inputs.data``), which vLLM removed;
  with such a vLLM :mod:`~ray_stream_llm.integrations.ray.engine_stage` builds the same v1
  engine the new way. Ray's tokenizer cache reads ``all_special_tokens_extended``, which
  transformers 5 removed.
- Ray Data gives a GPU map actor that names no CPUs one CPU from 2.60 on
  (ray-project/ray#66202), none before: Ray's vLLM engine actor asks ``{"GPU": 1}`` on
  2.48-2.59 and ``{"GPU": 1, "CPU": 1}`` on 2.60 (:func:`default_engine_resources`).
- Ray's workers install uvloop's event loop policy; an async UDF's constructor (the chat
  template's, the engine's) then asks it for a loop, and uvloop 0.22 on refuses outside a
  running loop (MagicStack/uvloop#702). Ray 2.60 makes the loop itself; before, the stages
  this library builds run with uvloop off (:func:`stage_env`).
- Ray 2.60's raylet ends every process a dead worker leaves (each worker leads a process
  group of its own, signalled when the worker is gone); Ray 2.48-2.59 does so only with
  ``process_group_cleanup_enabled`` (2.54 has it) or the subreaper setting turned on
  (:func:`ray_ends_workers_processes`: the node agent ends them itself where Ray does not).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

from ray.data import DataContext
from ray.data._internal.execution.operators.map_operator import _canonicalize_ray_remote_args
from ray.data.llm import vLLMEngineProcessorConfig
from ray.llm._internal.batch.processor.base import Processor
from ray.llm._internal.batch.processor.vllm_engine_proc import build_vllm_engine_processor
from ray.llm._internal.batch.stages.chat_template_stage import ChatTemplateUDF
from ray.llm._internal.batch.stages.tokenize_stage import DetokenizeUDF, TokenizeUDF

from ray_stream_llm.integrations.ray.version import SUPPORTED_RAY

try:  # Ray >= 2.53
    from ray.llm._internal.batch.stages.prepare_multimodal_stage import PrepareMultimodalUDF
except ImportError:  # Ray 2.48
    PrepareMultimodalUDF = None

try:  # Ray 2.48 (and later, beside PrepareMultimodalUDF)
    from ray.llm._internal.batch.stages.prepare_image_stage import PrepareImageUDF
except ImportError:
    PrepareImageUDF = None


HAS_PLACEMENT_GROUP_CONFIG = "placement_group_config" in vLLMEngineProcessorConfig.model_fields
BUILDER_TAKES_MAP_KWARGS = (
    "preprocess_map_kwargs" in inspect.signature(build_vllm_engine_processor).parameters
)
# Stage UDFs that read no model: left as Ray built them (the settings still reach them).
MODEL_FREE_UDFS: tuple[type, ...] = tuple(udf for udf in (PrepareImageUDF,) if udf is not None)


def ray_builds_with(
    config: Any,
    preprocess: Any = None,
    postprocess: Any = None,
    preprocess_map_kwargs: dict[str, Any] | None = None,
    postprocess_map_kwargs: dict[str, Any] | None = None,
) -> Any:
    """Ray's ``build_vllm_engine_processor``; the map kwargs passed to a Ray that takes
    them, else kept on a processor that applies them (:class:`_MapKwargsProcessor`)."""
    maps = {
        "preprocess_map_kwargs": preprocess_map_kwargs,
        "postprocess_map_kwargs": postprocess_map_kwargs,
    }
    # Ray 2.48's Processor sets this process's DataContext.wait_for_min_actors_s to 600
    # (its workaround for ray#53124): the user's own value, or Ray Data's default, is put
    # back; the wait the processor gives its datasets is wait_for_initial_actors'
    current = DataContext.get_current()
    wait = current.wait_for_min_actors_s
    try:
        if BUILDER_TAKES_MAP_KWARGS:
            return build_vllm_engine_processor(
                config, preprocess=preprocess, postprocess=postprocess, **maps
            )
        processor = build_vllm_engine_processor(
            config, preprocess=preprocess, postprocess=postprocess
        )
    finally:
        current.wait_for_min_actors_s = wait
    processor.__class__ = _MapKwargsProcessor
    for name, value in maps.items():
        setattr(processor, name, dict(value or {}))
    return processor


class _MapKwargsProcessor(Processor):
    """Ray 2.48-2.52's processor, whose pre/postprocess maps take Ray Data's defaults
    (1 CPU a task), with the map kwargs of later Ray: the same three steps."""

    preprocess_map_kwargs: dict[str, Any]
    postprocess_map_kwargs: dict[str, Any]

    def __call__(self, dataset: Any) -> Any:
        dataset = dataset.map(self.preprocess, **self.preprocess_map_kwargs)
        for stage in self.stages.values():
            kwargs = stage.get_dataset_map_batches_kwargs(
                batch_size=self.config.batch_size, data_column=self.DATA_COLUMN
            )
            dataset = dataset.map_batches(stage.fn, **kwargs)
        return dataset.map(self.postprocess, **self.postprocess_map_kwargs)


# Ray Data's own knob, read from the environment once (ray.data.context); -1: no wait
WAIT_FOR_MIN_ACTORS_ENV = "RAY_DATA_DEFAULT_WAIT_FOR_MIN_ACTORS_S"


@functools.cache
def _waits_for_actors(base: type) -> type:
    """``base`` (a processor class) whose call makes the dataset's actor pools start their
    initial actors before the rows flow, for the processor's ``start_wait_s``, where the
    user left Ray Data's wait as it comes (neither the variable nor the dataset's
    ``DataContext.wait_for_min_actors_s`` set)."""

    class _WaitingProcessor(base):
        start_wait_s: int

        def __call__(self, dataset: Any) -> Any:
            from ray.data import context

            data_context = dataset.context
            unset = data_context.wait_for_min_actors_s == context.DEFAULT_WAIT_FOR_MIN_ACTORS_S
            if unset and WAIT_FOR_MIN_ACTORS_ENV not in os.environ:
                data_context.wait_for_min_actors_s = self.start_wait_s
            return super().__call__(dataset)

    _WaitingProcessor.__name__ = _WaitingProcessor.__qualname__ = base.__name__
    return _WaitingProcessor


def wait_for_initial_actors(processor: Any, seconds: int) -> None:
    """``processor`` made to start its stages' initial actors (the engines: ``concurrency``
    or its range's least) before the first row goes out, waiting up to ``seconds`` (Ray
    Data's ``wait_for_min_actors_s``; an engine that fails to start fails the job at
    once). Ray Data's default sends the rows to the first engine ready: a short job then
    ends while the others still start, and kills them mid-pull or mid-compile."""
    processor.__class__ = _waits_for_actors(processor.__class__)
    processor.start_wait_s = seconds


def settle_ray_data(timeout: float = 60.0) -> None:
    """Wait (up to ``timeout`` s in all) for the threads of this process's finished Ray
    Data executions to end; call it before ``ray.shutdown()``. Ray Data stops them as a
    dataset's last row is taken but does not wait for them (its executor joins its own
    scheduling thread for 2 s; the block prefetcher's and the metadata fetcher's threads
    are only told to stop): on a loaded machine one is still in a call into Ray as the
    caller shuts Ray down, and a thread in Ray after ``ray.shutdown()`` ends the whole
    process with status 1 ("The core worker has already been shutdown"). A thread of an
    execution still running is not waited for."""
    deadline = time.monotonic() + timeout
    for thread in threading.enumerate():
        # the executor is its own thread; the others are a stopped object's bound method
        owner = getattr(getattr(thread, "_target", None), "__self__", thread)
        stopped = getattr(owner, "_shutdown", False) or getattr(owner, "_stopped", False)
        if type(owner).__module__.startswith("ray.data.") and stopped is True:
            thread.join(max(0.0, deadline - time.monotonic()))


def default_engine_resources() -> dict[str, float]:
    """The resources Ray's vLLM engine actor asks for when no placement is given: its
    ``num_gpus=1`` and the CPUs Ray Data adds to a GPU map actor that names none (Ray's own
    rule, asked: one CPU from Ray 2.60 on, none in 2.48-2.59)."""
    args = _canonicalize_ray_remote_args({"num_gpus": 1})
    named = {"GPU": args.get("num_gpus"), "CPU": args.get("num_cpus")}
    return {k: float(v) for k, v in named.items() if v}


# The raylet's settings of its clean-up of a dead worker's processes (RAY_<name>, or
# ray.init's _system_config): per-worker process groups, signalled as the worker is gone
# (not in 2.48, in 2.54, the default from 2.60), and the deprecated subreaper, which ends a dead
# worker's orphans every 10 s (2.48 on, never the default)
PROCESS_GROUPS = "process_group_cleanup_enabled"
SUBREAPER = "kill_child_processes_on_worker_exit_with_raylet_subreaper"


def ray_ends_workers_processes(
    version: str | None = None,
    settings: Mapping[str, object] | None = None,
    *,
    at_shutdown: bool = False,
) -> bool:
    """Whether the raylet of Ray ``version``, under ``settings`` (its config values by name,
    :data:`PROCESS_GROUPS` and :data:`SUBREAPER`; a value as ``RAY_<name>`` reads, or a
    bool), ends every process a worker leaves when it dies (SIGKILLed, exited or
    ``ray.kill``-ed: children and grandchildren alike); ``at_shutdown``: when a local Ray
    shuts down, where the subreaper, gone with its raylet, ends none. Under Ray's defaults
    only 2.60 does; 2.48-2.59 kill a worker's direct children as it exits and leave a
    killed worker's running. ``version`` and ``settings`` default to this process's Ray and
    its raylet's (:func:`raylet_settings`)."""
    from ray_stream_llm.integrations.ray.version import _minor

    version = version or _ray_version()
    settings = raylet_settings() if settings is None else settings
    groups = _as_bool(settings.get(PROCESS_GROUPS), _minor(version) >= (2, 60))
    if _minor(version) < (2, 54):
        groups = False  # 2.48's raylet has no such setting (taken as absent up to 2.53)
    return groups or (not at_shutdown and _as_bool(settings.get(SUBREAPER), False))


def _ray_version() -> str:
    import ray

    return str(ray.__version__)


def _as_bool(value: object, default: bool) -> bool:
    """A raylet setting's value as Ray reads it (``true`` or ``1``, any case); unset:
    ``default``."""
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    return str(value).strip().lower() in ("true", "1")


def raylet_settings() -> dict[str, object]:
    """The settings of this node's raylet that decide its clean-up of a dead worker's
    processes (:data:`PROCESS_GROUPS`, :data:`SUBREAPER`), where this process can read them
    (a Ray worker, or a driver connected to a Ray): the cluster's ``_system_config`` first,
    as the raylet reads it, then the raylet's environment (a worker's parent; else this
    process's own). An unset one is absent."""
    import ray

    environ: Mapping[str, str] = os.environ
    if ray.is_initialized() and _is_raylet(os.getppid()):
        environ = _environ_of(os.getppid()) or os.environ
    found: dict[str, object] = {
        name: environ[f"RAY_{name}"]
        for name in (PROCESS_GROUPS, SUBREAPER)
        if f"RAY_{name}" in environ
    }
    if ray.is_initialized():
        from ray._private.state import state

        with contextlib.suppress(Exception):  # an older GCS client: the environment alone
            system = state.get_system_config()
            found.update({k: system[k] for k in (PROCESS_GROUPS, SUBREAPER) if k in system})
    return found


def _is_raylet(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/comm", encoding="utf-8") as comm:
            return comm.read().strip() == "raylet"
    except OSError:
        return False


def _environ_of(pid: int) -> dict[str, str]:
    """The environment process ``pid`` started with; empty where it cannot be read."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as environ:
            items = environ.read().split(b"\0")
    except OSError:
        return {}
    pairs = (item.decode(errors="replace").partition("=") for item in items if b"=" in item)
    return {key: value for key, _, value in pairs}


class _TokenizerProbe:
    """The least a tokenizer has; no ``all_special_tokens_extended`` (as in transformers 5)."""

    all_special_ids: tuple[int, ...] = ()
    all_special_tokens: tuple[str, ...] = ()

    def __len__(self) -> int:
        return 0


UVLOOP = "RAY_USE_UVLOOP"  # Ray's own switch of its workers' event loop (on by default)


def stage_env(*runtime_envs: dict[str, Any] | None) -> dict[str, str]:
    """What every stage worker of a processor this library builds needs in its environment
    on this Ray: ``RAY_USE_UVLOOP=0`` where Ray's workers would install a uvloop that refuses
    to make a loop and Ray asks it for one (:func:`_ray_asks_the_policy_for_a_loop`): every
    async stage dies in its constructor with "There is no current event loop" (Ray 2.54.1
    with uvloop 0.23.0). Nothing where that cannot happen, or where the user
    chose ``RAY_USE_UVLOOP`` (this process's environment, or one of ``runtime_envs``)."""
    chosen = UVLOOP in os.environ or any(
        UVLOOP in ((env or {}).get("env_vars") or {}) for env in runtime_envs
    )
    if not chosen and _ray_asks_the_policy_for_a_loop() and _uvloop_refuses():
        return {UVLOOP: "0"}
    return {}


@functools.cache
def _ray_asks_the_policy_for_a_loop() -> bool:
    """Whether Ray's ``get_or_create_event_loop`` (what Ray Data's async UDF constructor
    calls) takes the event loop policy's answer with no loop of its own to fall back on
    (Ray 2.48-2.54; 2.60 makes one)."""
    from ray._common import utils

    return "new_event_loop" not in inspect.getsource(utils.get_or_create_event_loop)


@functools.cache
def _uvloop_refuses() -> bool:
    """Whether the installed uvloop's policy refuses to make a loop (0.22 on)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        major, minor = (int(part) for part in version("uvloop").split(".")[:2])
    except (PackageNotFoundError, ValueError):
        return False  # no uvloop: Ray's workers use asyncio's own loop
    return (major, minor) >= (0, 22)


@functools.cache
def _needs_tokenizer_cache() -> bool:
    """Ray 2.48's tokenizer cache reads ``all_special_tokens_extended`` unguarded (later Ray
    reads it with ``getattr``), and this transformers has none."""
    from ray.llm._internal.batch.stages import tokenize_stage
    from transformers import PreTrainedTokenizerBase

    if hasattr(PreTrainedTokenizerBase, "all_special_tokens_extended"):
        return False
    try:
        tokenize_stage.get_cached_tokenizer(_TokenizerProbe())
    except AttributeError:
        return True
    return False


def _cached_tokenizer(tokenizer: Any) -> Any:
    """Ray's tokenizer cache for transformers 5: the special tokens, ids and length that
    decoding reads on every row, computed once."""
    text = getattr(tokenizer, "tokenizer", tokenizer)  # a VLM's processor wraps it
    ids, tokens, size = set(text.all_special_ids), set(text.all_special_tokens), len(text)
    cached = type(
        f"Cached{type(text).__name__}",
        (type(text),),
        {
            "all_special_ids": property(lambda self: ids),
            "all_special_tokens": property(lambda self: tokens),
            "__len__": lambda self: size,
        },
    )
    text.__class__ = cached
    return text


@contextlib.contextmanager
def ray_stage_shims(*swaps: tuple[Any, str, Any]) -> Iterator[None]:
    """Inside a stage actor, while Ray's UDF constructor runs: the pieces of an older Ray
    that call an API its successors of vLLM and transformers removed, replaced (Ray's
    stage modules name them as module globals, so they are swapped for the constructor's
    duration, in this actor's process only), with ``swaps`` (module, name, replacement)
    of the caller's. Nothing is swapped where nothing is missing."""
    from ray.llm._internal.batch.stages import tokenize_stage

    swaps = tuple(swaps)
    if _needs_tokenizer_cache():
        swaps += ((tokenize_stage, "get_cached_tokenizer", _cached_tokenizer),)
    originals = [(module, name, getattr(module, name)) for module, name, _ in swaps]
    for module, name, replacement in swaps:
        setattr(module, name, replacement)
    try:
        yield
    finally:
        for module, name, original in originals:
            setattr(module, name, original)


__all__ = [
    "HAS_PLACEMENT_GROUP_CONFIG",
    "MODEL_FREE_UDFS",
    "SUPPORTED_RAY",
    "ChatTemplateUDF",
    "DetokenizeUDF",
    "PrepareMultimodalUDF",
    "Processor",
    "TokenizeUDF",
    "default_engine_resources",
    "ray_builds_with",
    "ray_ends_workers_processes",
    "ray_stage_shims",
    "settle_ray_data",
    "wait_for_initial_actors",
]
