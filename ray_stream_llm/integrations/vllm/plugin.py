"""A vLLM general plugin that measures the Run:ai streamer where it runs.

vLLM loads weights in its engine-core (or worker) process, not in the Ray
actor that created the engine. vLLM runs every ``vllm.general_plugins`` entry
point in each of its processes; this one does nothing unless the engine actor
set ``RAY_STREAM_LLM_LOAD_REPORT_DIR`` (the engine's processes inherit the
actor's environment). Then it wraps ``SafetensorsStreamer`` so that each
streaming session writes one small JSON file there, ``<pid>-<n>.json``: the
files streamed, the bytes the streamer planned and the bytes it delivered,
the seconds from the first request to the last tensor, the process's tensor-parallel
rank, and the streamer settings in force there. The file is
rewritten at most every half second while tensors arrive (the actor turns it
into progress) and once at the end.

The figures are the streamer's own: its ``total_size`` (tensor bytes of the
files) and the tensors it yields, counted as they leave ``get_tensors``.

It also records why an engine failed to start, where vLLM says it: each
exception vLLM logs in its processes (``EngineCore failed to start.``, a worker's
failure) becomes ``failure-<pid>-<n>.json`` (type, module, message, and its
causes), so that the actor can quote the root cause rather than vLLM's
"Engine core initialization failed. See root cause above."

Tensor-parallel engines: with the ``mp`` executor the workers are the engine's child
processes and inherit the directory; with the Ray executor they are Ray actors, and
``register`` names the directory in ``VLLM_RAY_EXTRA_ENV_VARS_TO_COPY`` so that vLLM
passes it to them. Either way each rank writes its own sessions (on the actor's node).
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import time
from collections.abc import Iterator, Mapping
from typing import Any

from ray_stream_llm.errors import PluginNotActiveError
from ray_stream_llm.files import write_whole
from ray_stream_llm.integrations.vllm import cpu
from ray_stream_llm.integrations.vllm.compile_cache import REPORT_DIR_ENV, tensor_parallel_rank
from ray_stream_llm.integrations.vllm.shm import remove_orphaned_segments, segments_of

# The streamer's tuning, as the streaming process sees it (vLLM applies its
# model_loader_extra_config to this process's environment before it streams).
STREAMER_SETTINGS = {
    "concurrency": "RUNAI_STREAMER_CONCURRENCY",
    "memory_limit": "RUNAI_STREAMER_MEMORY_LIMIT",
    "chunk_bytesize": "RUNAI_STREAMER_CHUNK_BYTESIZE",
}


PLUGIN_NAME = "ray_stream_llm_load_report"  # its name in pyproject's vllm.general_plugins
PLUGIN_GROUP = "vllm.general_plugins"


def plugin_inactive_reason(env: Mapping[str, str] | None = None) -> str | None:
    """Why vLLM will not run this plugin in the engine's processes (``env``: their
    environment, by default this process's), with the fix; None when it will."""
    from importlib.metadata import entry_points

    environ: Mapping[str, str] = os.environ if env is None else env
    if not any(ep.name == PLUGIN_NAME for ep in entry_points(group=PLUGIN_GROUP)):
        return (
            f"ray_stream_llm is importable but not installed as a package: its "
            f"{PLUGIN_GROUP} entry point {PLUGIN_NAME!r} is missing (runtime_env py_modules "
            "and copied directories carry no entry points), so vLLM's processes would not "
            "load it; install the package on every node (pip install ray-stream-llm, or its "
            "wheel in the image) or ship it with the job as "
            "runtime_env={'pip': ['ray-stream-llm']} (a path to its .whl works too)"
        )
    allowed = environ.get("VLLM_PLUGINS")
    if allowed is not None and PLUGIN_NAME not in allowed.split(","):
        return (
            f"VLLM_PLUGINS={allowed!r} leaves this library's vLLM plugin {PLUGIN_NAME!r} out; "
            f"add it (VLLM_PLUGINS={allowed + ',' if allowed else ''}{PLUGIN_NAME}) or unset "
            "VLLM_PLUGINS"
        )
    return None


def require_plugin(env: Mapping[str, str] | None = None) -> None:
    """Raise :class:`PluginNotActiveError` where :func:`plugin_inactive_reason` finds one."""
    reason = plugin_inactive_reason(env)
    if reason is not None:
        raise PluginNotActiveError(reason)


def streamer_settings() -> dict[str, str]:
    return {k: os.environ.get(v, "default") for k, v in STREAMER_SETTINGS.items()}


# vLLM's Ray executor copies the variables named here to its worker actors: with it the
# workers (tensor or pipeline parallel, distributed_executor_backend="ray") report too.
RAY_COPY_ENV = "VLLM_RAY_EXTRA_ENV_VARS_TO_COPY"


def _copy_to_ray_workers(name: str) -> None:
    names = [n for n in os.environ.get(RAY_COPY_ENV, "").split(",") if n.strip()]
    if name not in names:
        os.environ[RAY_COPY_ENV] = ",".join([*names, name])


_FLUSH_S = 0.5
_sessions = itertools.count()


def _write(path: str, state: dict[str, Any]) -> None:
    write_whole(path, json.dumps(state))


def _measured(base: type) -> type:
    class MeasuredSafetensorsStreamer(base):
        """``SafetensorsStreamer`` that reports its sessions to the engine actor."""

        def stream_files(self, paths: list[str], *args: Any, **kwargs: Any) -> None:
            from ray_stream_llm.weights.region import region_of

            begin = time.time()
            # A file of a node's shared region (known by the region's own marker, however
            # the path is spelled) is streamed only once its completion mark is there, file
            # by file as each completes: never a sparse file still being written.
            shared = any(region_of(p) is not None for p in paths)
            if shared:
                self._rsl_pending: tuple[list[str], Any, Any] | None = (list(paths), args, kwargs)
                planned = sum(os.path.getsize(p) for p in paths)
            else:
                self._rsl_pending = None
                super().stream_files(paths, *args, **kwargs)
                planned = int(self.total_size)
            directory = os.environ.get(REPORT_DIR_ENV)
            if not directory:
                self._rsl: dict[str, Any] | None = None
                return
            self._rsl = {
                "path": os.path.join(directory, f"{os.getpid()}-{next(_sessions)}.json"),
                "pid": os.getpid(),
                "rank": tensor_parallel_rank(),
                "files": [str(p) for p in paths],
                "planned_bytes": planned,
                "delivered_bytes": 0,
                "tensors": 0,
                "started": begin,
                "seconds": 0.0,
                "waited": 0.0,
                "shared": shared,
                "settings": streamer_settings(),
                "done": False,
            }
            self._rsl_flush(force=True)

        def _rsl_flush(self, force: bool = False) -> None:
            state = self._rsl
            if state is None:
                return
            now = time.time()
            if not force and now - state.get("_flushed", 0.0) < _FLUSH_S:
                return
            state["_flushed"] = now
            state["seconds"] = now - state["started"]
            try:
                _write(
                    state["path"],
                    {k: v for k, v in state.items() if not k.startswith("_") and k != "path"},
                )
            except OSError:  # the actor removed the directory: nobody is listening
                pass

        def get_tensors(self) -> Iterator[tuple[str, Any]]:
            state = getattr(self, "_rsl", None)
            pending = getattr(self, "_rsl_pending", None)
            if pending is not None:
                from ray_stream_llm.weights.region import region_of, source_of

                paths, args, kwargs = pending
                for path in paths:
                    source, waited = source_of(path) if region_of(path) else (path, 0.0)
                    if state is not None:
                        state["waited"] += waited
                    super().stream_files([source], *args, **kwargs)
                    yield from self._rsl_count(super().get_tensors(), state)
            else:
                yield from self._rsl_count(super().get_tensors(), state)
            if state is not None:
                state["done"] = True
                self._rsl_flush(force=True)

        def _rsl_count(
            self, tensors: Iterator[tuple[str, Any]], state: dict[str, Any] | None
        ) -> Iterator[tuple[str, Any]]:
            for name, tensor in tensors:
                if state is not None:
                    state["delivered_bytes"] += tensor.numel() * tensor.element_size()
                    state["tensors"] += 1
                    self._rsl_flush()
                yield name, tensor

    return MeasuredSafetensorsStreamer


def _exception_record(exc: BaseException) -> dict[str, str]:
    return {"type": type(exc).__name__, "module": type(exc).__module__, "message": str(exc)}


class FailureRecorder(logging.Handler):
    """Writes each exception vLLM logs at ERROR or above to the engine actor's directory."""

    def __init__(self, directory: str):
        super().__init__(level=logging.ERROR)
        self.directory = directory

    def emit(self, record: logging.LogRecord) -> None:
        if not record.exc_info or record.exc_info[1] is None:
            return
        exc: BaseException | None = record.exc_info[1]
        chain: list[dict[str, str]] = []
        while exc is not None and len(chain) < 8:
            chain.append(_exception_record(exc))
            exc = exc.__cause__ or exc.__context__
        state = {
            "pid": os.getpid(),
            "time": record.created,
            "logger": record.name,
            "message": record.getMessage(),
            "chain": chain,
        }
        path = os.path.join(self.directory, f"failure-{os.getpid()}-{next(_sessions)}.json")
        try:
            _write(path, state)
        except OSError:  # the actor removed the directory: nobody is listening
            pass


def _record_failures(directory: str) -> None:
    vllm_logger = logging.getLogger("vllm")
    if not any(isinstance(h, FailureRecorder) for h in vllm_logger.handlers):
        vllm_logger.addHandler(FailureRecorder(directory))


SHARD_WRITER_ENV = "RAY_STREAM_LLM_SHARD_WRITER"  # set by save_sharded_checkpoint


def register() -> None:
    """Entry point of ``vllm.general_plugins``; vLLM may call it more than once per process.

    The streamer is wrapped in every process vLLM runs the plugin in: a read of a shared
    region's file waits for its completion mark wherever the engine came from. Reports
    are written only where an engine actor of this library asked for them."""
    if os.environ.get(SHARD_WRITER_ENV) == "1" and cpu.is_cpu_build():
        cpu.keep_linear_weights()
    directory = os.environ.get(REPORT_DIR_ENV)
    from ray_stream_llm.integrations.vllm import compile_cache  # the AOT load fix; compile figures

    compile_cache.install(directory)
    if directory:
        _copy_to_ray_workers(REPORT_DIR_ENV)
        _record_failures(directory)
    try:
        from vllm.model_executor.model_loader import weight_utils
    except ImportError:
        return
    current = getattr(weight_utils, "SafetensorsStreamer", None)
    if (
        not isinstance(current, type)
        or getattr(current, "__name__", "") == "MeasuredSafetensorsStreamer"
    ):
        return  # the streamer is not installed (vLLM's placeholder), or already wrapped
    weight_utils.SafetensorsStreamer = _measured(current)


def save_sharded_checkpoint(
    engine_kwargs: dict[str, Any], stage_dir: str, max_part_bytes: int | None = None
) -> tuple[float, float]:
    """The shard writer's use of vLLM (``ray_stream_llm.commands.shard``): start an engine with
    ``engine_kwargs`` in this process (its tensor-parallel workers are this process's
    children), have every rank save its own state with vLLM's
    ``ShardedStateLoader.save_model`` into ``stage_dir`` (``model-rank-R-part-P.safetensors``,
    parts of at most ``max_part_bytes``), then shut the engine down.

    Returns (seconds to a ready engine, seconds to save). ``stage_dir`` must be visible to
    every rank: one node.
    """
    import gc
    import shutil
    import tempfile

    from vllm import LLM

    on_cpu = cpu.is_cpu_build()
    before = cpu.allreduce_segments() if on_cpu else set()
    # the engine's IPC sockets (vLLM leaves them in VLLM_RPC_BASE_PATH, /tmp by default) in
    # a private short directory, removed with the engine
    rpc = tempfile.mkdtemp(prefix="rsl-shard-rpc-", dir="/tmp")
    changed = {SHARD_WRITER_ENV: "1", "VLLM_RPC_BASE_PATH": rpc}  # inherited (register)
    previous = {name: os.environ.get(name) for name in changed}
    os.environ.update(changed)
    start = time.perf_counter()
    try:
        llm = LLM(**engine_kwargs)
    except BaseException:
        shutil.rmtree(rpc, ignore_errors=True)
        if on_cpu:
            cpu.remove_unmapped(cpu.allreduce_segments() - before)
        raise
    finally:
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    ready = time.perf_counter()
    # vLLM's ring buffers (/dev/shm/psm_*), mapped by this process's engine and workers: a
    # worker stopped before it unlinks one (a loaded machine) leaves it behind
    rings = segments_of(os.getpid())
    try:
        llm.llm_engine.engine_core.save_sharded_state(
            path=stage_dir, pattern=None, max_size=max_part_bytes
        )
        saved = time.perf_counter()
    finally:
        llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()
        if on_cpu:
            cpu.remove_unmapped(cpu.allreduce_segments() - before)
        remove_orphaned_segments(0.0, wait=5.0, only=rings)
        shutil.rmtree(rpc, ignore_errors=True)
    return ready - start, saved - ready
