"""vLLM's compile cache in this library's engines: the AOT artifact loaded again, and the
compile phase measured where it runs.

**The load fix** (vLLM 0.29's CPU build never loaded its AOT artifact again) is
:mod:`~ray_stream_llm.integrations.vllm.aot_fix`, applied here.

**The key** is vLLM's own (``aot_compile_hash_factors``), left as it is: the engine actor
gives vLLM paths that are the same on every node and under any URI (the metadata
directory named by its content, no ``model_weights``: the URI and the node's region are
named to the loader apart) and
a ``VLLM_CACHE_ROOT`` per compile target
(:func:`~ray_stream_llm.integrations.vllm.compile_target.cache_root`), so a node never
looks up code built for another CPU instruction set or accelerator.

**The measurement.** In the engine's processes (``RAY_STREAM_LLM_LOAD_REPORT_DIR`` set
by the engine actor), :func:`measure` times each of vLLM's own
``monitor_torch_compile`` blocks (an AOT load attempt, a compile) and reads vLLM's
``compilation_counter`` and its "load failure" warning; each compiling process writes
``compile/<pid>.json`` under the directory, which :func:`collect` reads in the actor and
:func:`figures` turns into the load report's ``compile_seconds`` and ``compile_cache``.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

from ray_stream_llm.files import HeldLock, try_locked, write_whole
from ray_stream_llm.integrations.vllm import aot_fix
from ray_stream_llm.integrations.vllm.touchpoints import LOAD_FAILURE

# set by the engine actor: where each of its processes writes what it measured
REPORT_DIR_ENV = "RAY_STREAM_LLM_LOAD_REPORT_DIR"


def write_report(path: str, state: dict[str, Any]) -> None:
    """``state`` as the JSON of ``path``, in the engine actor's report directory; nothing
    once the actor removed the directory (nobody is listening)."""
    with contextlib.suppress(OSError):
        write_whole(path, json.dumps(state))


def read_reports(directory: str, keep: Callable[[str], bool] = lambda name: True) -> list[Any]:
    """The JSON files of ``directory`` whose names ``keep``, in name order: none where the
    directory is gone; one being replaced while it is read is left for the next read."""
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return []
    found = []
    for name in names:
        if not name.endswith(".json") or not keep(name):
            continue
        try:
            with open(os.path.join(directory, name)) as f:
                found.append(json.load(f))
        except (OSError, ValueError):
            continue
    return found


SUBDIR = "compile"
logger = logging.getLogger(__name__)
_PATCHED = "_rsl_patched"  # on each of vLLM's functions replaced here: a second register() keeps it


def install(directory: str | None) -> None:
    """From the plugin's ``register()`` in each vLLM process: the load fix, one compile per
    node, and the measurement when the engine actor named a report ``directory``.
    Never raises: with a vLLM or torch this code does not know, vLLM is left as it is."""
    steps: list[tuple[Callable[[], object], str]] = [
        (aot_fix.apply, "AOT load fix not applied"),
        (compile_once, "engines of a node compile each"),
    ]
    if directory:
        steps.append((functools.partial(measure, directory), "compile not measured"))
    for step, otherwise in steps:
        try:
            step()
        except Exception:
            logger.debug(otherwise, exc_info=True)


# --- one compile per node -----------------------------------------------------------------
WAIT_ENV = "RAY_STREAM_LLM_COMPILE_WAIT_S"
DEFAULT_WAIT_S = 1800.0
_held: dict[str, HeldLock] = {}  # artifact path -> the lock this process holds
_artifacts: list[str] = []  # the AOT artifact paths this process's engine looked up
_recording: list[_Recorder] = []  # this process's compile record, once measure() ran
# in vLLM's processes only vLLM's logger has a handler: its child shows with vLLM's lines
_engine_log = logging.getLogger("vllm.ray_stream_llm")


def _lock_path(artifact: str) -> str:
    """This library's lock for one artifact path, in its own cache (never in vLLM's)."""
    from ray_stream_llm.cache import cache_root, make_dirs

    locks = make_dirs(cache_root() / "compile-locks", setting="RAY_STREAM_LLM_CACHE")
    return str(locks / (hashlib.sha256(artifact.encode()).hexdigest()[:32] + ".lock"))


def _release() -> None:
    """Drop every compile lock this process holds."""
    while _held:
        _held.popitem()[1].release()


def claim_or_wait(artifact: str, load: Any, wait_s: float | None = None) -> Any:
    """Before this process compiles what ``artifact`` (vLLM's AOT artifact path) will hold:
    take the node's lock for it and compile (None), or, when another engine of the node
    holds it (it is compiling the same code), wait for its artifact and return ``load()``
    of it. Waits at most ``wait_s`` (``RAY_STREAM_LLM_COMPILE_WAIT_S``, 1800 s), and only
    while the holder lives and has not finished: then this process compiles itself."""
    lock = _lock_path(artifact)
    wait_s = float(os.environ.get(WAIT_ENV, DEFAULT_WAIT_S)) if wait_s is None else wait_s
    start = time.monotonic()
    deadline = start + wait_s
    while True:
        held = try_locked(lock)
        if held is not None:  # nobody compiles it now
            if os.path.exists(artifact):  # saved whole: its maker let go after the save
                held.release()
                loaded = load()
                if loaded is not None:
                    _engine_log.info(
                        "loaded the compiled artifact another engine of this node made "
                        "(waited %.1fs for its compile)",
                        time.monotonic() - start,
                    )
                return loaded
            _held[artifact] = held  # this process compiles it
            return None
        # another engine holds it: its artifact is read only once it lets go (its compile
        # block ends after the save), never while the file may still be being written
        if time.monotonic() >= deadline:
            _engine_log.warning(
                "another engine of this node has compiled for %.0fs without saving its "
                "artifact; compiling here (%s sets the wait)",
                wait_s,
                WAIT_ENV,
            )
            return None
        time.sleep(0.5)


def compile_once() -> bool:
    """Engines of a node that start together compile once: vLLM's
    ``_try_load_aot_compiled_fn`` finds no artifact, then :func:`claim_or_wait` lets one
    process compile and the others load what it saves; the lock is released when its
    compile block (:func:`wrap_compile_block`), which ends after the save, ends. Whether it
    is in place."""
    from vllm.compilation import decorators

    loader = getattr(decorators, "_try_load_aot_compiled_fn", None)
    if loader is None or not wrap_compile_block():
        return False
    if getattr(loader, _PATCHED, False):
        return True

    def _try_load_aot_compiled_fn(model: Any, aot_compilation_path: str) -> Any:
        if aot_compilation_path not in _artifacts:
            _artifacts.append(aot_compilation_path)
        loaded = loader(model, aot_compilation_path)
        if loaded is not None or os.path.exists(aot_compilation_path):
            return loaded  # a hit, or a damaged artifact vLLM compiles over (it logged why)
        try:
            return claim_or_wait(aot_compilation_path, lambda: loader(model, aot_compilation_path))
        except Exception:  # no lock to be had (an unwritable cache...): compile, as vLLM would
            logger.debug("no compile lock", exc_info=True)
            return None

    setattr(_try_load_aot_compiled_fn, _PATCHED, True)
    # vLLM's own function stays reachable (inspect.unwrap): the load fix's check reads its source
    _try_load_aot_compiled_fn.__wrapped__ = loader  # type: ignore[attr-defined]
    decorators._try_load_aot_compiled_fn = _try_load_aot_compiled_fn
    return True


def wrap_compile_block() -> bool:
    """vLLM's compile block (``monitor_torch_compile``: an AOT load attempt, or a compile and
    its save), wrapped once per process: when a block ends, the compile locks this process
    holds are released (:func:`compile_once`) and, once :func:`measure` ran, its seconds
    are recorded. Whether it is in place."""
    from vllm.compilation import decorators

    original = getattr(decorators, "monitor_torch_compile", None)
    if original is None:
        return False
    if getattr(original, _PATCHED, False):
        return True

    @contextlib.contextmanager
    def monitor_torch_compile(*args: Any, **kwargs: Any) -> Iterator[None]:
        begin = time.perf_counter()
        try:
            with original(*args, **kwargs):
                yield
        finally:
            _release()  # this process's compile (and its save) ended
            for recorder in _recording:
                recorder.seconds += time.perf_counter() - begin
                recorder.blocks += 1
                recorder.write()

    setattr(monitor_torch_compile, _PATCHED, True)
    decorators.monitor_torch_compile = monitor_torch_compile
    return True


# --- measurement, in the engine's processes ------------------------------------------------
class _Recorder(logging.Handler):
    """This process's compile record: seconds in vLLM's compile blocks, vLLM's counters,
    the load failures it logged; written to ``<directory>/compile/<pid>.json``."""

    def __init__(self, directory: str):
        super().__init__(level=logging.WARNING)
        self.directory = directory
        self.seconds = 0.0
        self.blocks = 0
        self.failures: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        # vLLM 0.29 logs "Compiling model again due to a load failure from %s, reason: %s";
        # 0.32 puts a "%s" prefix (the compile tag) before it
        if LOAD_FAILURE not in str(record.msg):
            return
        args = record.args if isinstance(record.args, tuple) else ()
        self.failures.append(str(args[-1]) if args else record.getMessage())

    def write(self) -> None:
        from vllm.compilation.counter import compilation_counter as counter

        try:
            from torch._dynamo.utils import counters

            inductor = {
                "hit": int(counters["inductor"]["fxgraph_cache_hit"]),
                "miss": int(counters["inductor"]["fxgraph_cache_miss"]),
            }
        except Exception:
            inductor = None
        from vllm import envs

        state = {
            "pid": os.getpid(),
            "time": time.time(),
            "seconds": self.seconds,
            "blocks": self.blocks,
            "aot": bool(envs.VLLM_USE_AOT_COMPILE),
            "aot_loaded": int(counter.num_aot_artifacts_loaded),
            "aot_compiles": int(counter.num_aot_compiles),
            "aot_saved": int(counter.num_aot_artifacts_saved),
            "load_failures": list(self.failures),
            "inductor_cache": inductor,
            "rank": tensor_parallel_rank(),
            "artifacts": list(_artifacts),
        }
        # the engine actor's directory now (a start in the actor's own process may be
        # its second); never re-made once the actor removed it
        where = os.path.join(os.environ.get(REPORT_DIR_ENV) or self.directory, SUBDIR)
        with contextlib.suppress(OSError):  # there already, or the actor removed its parent
            os.mkdir(where)
        write_report(os.path.join(where, f"{os.getpid()}.json"), state)


def tensor_parallel_rank() -> int | None:
    """This process's tensor-parallel rank once vLLM set up its groups (a worker loading
    weights), else None."""
    try:
        from vllm.distributed import parallel_state

        if getattr(parallel_state, "_TP", None) is None:
            return None
        return int(parallel_state.get_tensor_model_parallel_rank())
    except Exception:
        return None


def measure(directory: str) -> None:
    """Time vLLM's compile blocks in this process and record them (once per process)."""
    if not _recording and wrap_compile_block():
        _recording.append(_Recorder(directory))
        logging.getLogger("vllm").addHandler(_recording[0])


# --- in the engine actor ---------------------------------------------------------------------
def collect(directory: str | None) -> list[dict[str, Any]]:
    """The compile records the engine's processes wrote under ``directory``."""
    return read_reports(os.path.join(directory, SUBDIR)) if directory else []


def outcome(record: dict[str, Any]) -> str:
    """One process's compile cache outcome: ``hit`` (vLLM loaded the AOT artifact),
    ``load failed: <vLLM's reason>`` (it compiled again), ``miss`` (it compiled; no
    artifact), or, with ``VLLM_USE_AOT_COMPILE=0``, ``inductor hit`` / ``miss``."""
    if record.get("aot_loaded"):
        return "hit"
    if record.get("load_failures"):
        return f"load failed: {record['load_failures'][-1]}"
    if not record.get("aot"):
        inductor = record.get("inductor_cache") or {}
        if inductor.get("hit") and not inductor.get("miss"):
            return "inductor hit"
    return "miss"


def figures(records: list[dict[str, Any]], why_miss: str | None = None) -> dict[str, Any]:
    """The load report's compile figures for one engine: ``compile_seconds`` (the slowest
    rank's seconds in vLLM's compile blocks) and ``compile_cache`` (the ranks' outcome, or
    each rank's when they differ; a ``miss`` says ``why_miss`` when the actor knows why
    it had no artifact: ``miss (artifact for CPU AVX512...; this node CPU AVX2...)``); both
    None when nothing compiled (``enforce_eager``, or this library's plugin not loaded)."""
    measured = [r for r in records if r.get("blocks")]
    if not measured:
        return {"compile_seconds": None, "compile_cache": None}
    measured.sort(key=lambda r: (r.get("rank") or 0, r.get("pid") or 0))
    outcomes = [outcome(r) for r in measured]
    if why_miss:
        outcomes = [f"miss ({why_miss})" if o == "miss" else o for o in outcomes]
    cache = outcomes[0]
    if len(set(outcomes)) > 1:
        cache = "; ".join(
            f"rank {r.get('rank')}: {o}" for r, o in zip(measured, outcomes, strict=True)
        )
    return {
        "compile_seconds": max(float(r["seconds"]) for r in measured),
        "compile_cache": cache,
    }
