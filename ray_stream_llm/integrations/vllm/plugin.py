"""The library's vLLM general plugin: what it does in the vLLM processes of the library's
own engines, and nowhere else.

vLLM runs every ``vllm.general_plugins`` entry point in each of its processes, in every
program of an image that has the package: a user's ``vllm serve``, a Ray Serve replica, a
notebook's ``vllm.LLM``. ``register`` first checks that an engine of this library started
the process (:func:`library_engine`: the engine actor's report directory, or the shard
writer's mark, both set in the actor's or writer's environment before vLLM starts and
inherited by vLLM's processes); anywhere else it returns at once, having registered,
replaced, written and logged nothing. In the library's engines it:

- registers the library's loaders under vLLM's Run:ai load formats
  (:mod:`~ray_stream_llm.integrations.vllm.loader`: a node's region read file by file as
  each completes, and the load report);
- installs the compile-cache fix and figures
  (:mod:`~ray_stream_llm.integrations.vllm.compile_cache`);
- where the engine actor asked for reports, records why an engine failed to start, where
  vLLM says it: each exception vLLM logs in its processes becomes
  ``failure-<pid>-<n>.json`` (type, module, message, and its causes), so that the actor can
  quote the root cause rather than vLLM's "Engine core initialization failed".

Tensor-parallel engines: with the ``mp`` executor the workers are the engine's child
processes and inherit the directory; with the Ray executor they are Ray actors, and
``register`` names the directory in ``VLLM_RAY_EXTRA_ENV_VARS_TO_COPY`` so that vLLM
passes it to them.
"""

from __future__ import annotations

import itertools
import logging
import os
import time
from collections.abc import Mapping
from typing import Any

from ray_stream_llm.errors import PluginNotActiveError
from ray_stream_llm.integrations.vllm import cpu, loader
from ray_stream_llm.integrations.vllm.compile_cache import REPORT_DIR_ENV, write_report
from ray_stream_llm.integrations.vllm.shm import remove_orphaned_segments, segments_of

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


# vLLM's Ray executor copies the variables named here to its worker actors: with it the
# workers (tensor or pipeline parallel, distributed_executor_backend="ray") report too.
RAY_COPY_ENV = "VLLM_RAY_EXTRA_ENV_VARS_TO_COPY"


def copy_to_ray_workers(name: str) -> None:
    """Name ``name`` in this process's ``VLLM_RAY_EXTRA_ENV_VARS_TO_COPY`` (once)."""
    names = [n for n in os.environ.get(RAY_COPY_ENV, "").split(",") if n.strip()]
    if name not in names:
        os.environ[RAY_COPY_ENV] = ",".join([*names, name])


_failures = itertools.count()


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
            kind = type(exc)
            chain.append({"type": kind.__name__, "module": kind.__module__, "message": str(exc)})
            exc = exc.__cause__ or exc.__context__
        state = {
            "pid": os.getpid(),
            "time": record.created,
            "logger": record.name,
            "message": record.getMessage(),
            "chain": chain,
        }
        write_report(
            os.path.join(self.directory, f"failure-{os.getpid()}-{next(_failures)}.json"), state
        )


def _record_failures(directory: str) -> None:
    vllm_logger = logging.getLogger("vllm")
    if not any(isinstance(h, FailureRecorder) for h in vllm_logger.handlers):
        vllm_logger.addHandler(FailureRecorder(directory))


SHARD_WRITER_ENV = "RAY_STREAM_LLM_SHARD_WRITER"  # set by save_sharded_checkpoint


def library_engine(env: Mapping[str, str] | None = None) -> bool:
    """Whether the process whose environment is ``env`` (by default this one's) belongs to
    an engine of this library: its engine actor's report directory or the shard writer's
    mark is set there."""
    environ: Mapping[str, str] = os.environ if env is None else env
    return bool(environ.get(REPORT_DIR_ENV)) or environ.get(SHARD_WRITER_ENV) == "1"


def register() -> None:
    """Entry point of ``vllm.general_plugins``; vLLM may call it more than once per process.

    Does nothing unless :func:`library_engine`: a vLLM that no engine of this library
    started keeps its own loaders and functions."""
    if not library_engine():
        return
    if os.environ.get(SHARD_WRITER_ENV) == "1" and cpu.is_cpu_build():
        cpu.keep_linear_weights()
    directory = os.environ.get(REPORT_DIR_ENV)
    from ray_stream_llm.integrations.vllm import compile_cache  # the AOT load fix; compile figures

    compile_cache.install(directory)
    if directory:
        copy_to_ray_workers(REPORT_DIR_ENV)
        _record_failures(directory)
    loader.register()


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

    from ray_stream_llm.env import scoped

    on_cpu = cpu.is_cpu_build()
    before = cpu.allreduce_segments() if on_cpu else set()
    # the engine's IPC sockets (vLLM leaves them in VLLM_RPC_BASE_PATH, /tmp by default) in
    # a private short directory, removed with the engine
    rpc = tempfile.mkdtemp(prefix="rsl-shard-rpc-", dir="/tmp")
    start = time.perf_counter()
    try:
        # inherited by the engine's processes (register), restored once it started
        with scoped({SHARD_WRITER_ENV: "1", "VLLM_RPC_BASE_PATH": rpc}):
            llm = LLM(**engine_kwargs)
    except BaseException:
        shutil.rmtree(rpc, ignore_errors=True)
        if on_cpu:
            remove_orphaned_segments(0.0, wait=0.0, only=cpu.allreduce_segments() - before)
        raise
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
            remove_orphaned_segments(0.0, wait=0.0, only=cpu.allreduce_segments() - before)
        remove_orphaned_segments(0.0, wait=5.0, only=rings)
        shutil.rmtree(rpc, ignore_errors=True)
    return ready - start, saved - ready
