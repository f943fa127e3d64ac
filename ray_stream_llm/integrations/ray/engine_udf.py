"""The engine stage UDF of a streamed processor: Ray's, with the model's metadata fetched
on the node and given to vLLM as a directory named by its content, the weights named to
the library's loader apart (the URI, or the node's region where the weights are shared),
and ``VLLM_CACHE_ROOT`` per compile target, so that vLLM's own compile key is the same for
the same model on every node of a target, under any URI; it retries a start that failed
on the store, and reports the load. Imported only in the engine actor and by the driver's
build: it imports vLLM.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from ray_stream_llm.errors import (
    EngineStartError,
    ObjectChangedError,
    RayStreamLLMError,
    StoreTimeoutError,
    StoreUnreachableError,
    WeightLoadError,
)
from ray_stream_llm.fetch import FetchReport, content_dir, fetch_metadata_report
from ray_stream_llm.integrations.ray import node
from ray_stream_llm.integrations.ray.agent import watch_engine
from ray_stream_llm.integrations.ray.engine_stage import engine_stage_shims, vLLMEngineStageUDF
from ray_stream_llm.integrations.ray.progress import progress_enabled
from ray_stream_llm.integrations.ray.stream_watch import StreamWatcher, from_streamer, root_cause
from ray_stream_llm.integrations.ray.telemetry import job_id, node_ip, publish, store_failure
from ray_stream_llm.integrations.ray.udfs import SecretEnv, _prepare, local_metadata
from ray_stream_llm.integrations.vllm import checksums, compile_store, compile_target, cpu
from ray_stream_llm.integrations.vllm.compile_cache import REPORT_DIR_ENV, collect, figures
from ray_stream_llm.integrations.vllm.loader import streamer_settings
from ray_stream_llm.integrations.vllm.plugin import copy_to_ray_workers, require_plugin
from ray_stream_llm.integrations.vllm.shm import (
    janitor_log,
    remove_orphaned_segments,
    segments_of,
)
from ray_stream_llm.lora import fetch_adapter
from ray_stream_llm.plan import Plan
from ray_stream_llm.redact import redact
from ray_stream_llm.reports import build_report
from ray_stream_llm.stores.base import WAITED_OUT
from ray_stream_llm.uri import ModelURI
from ray_stream_llm.weights import memory
from ray_stream_llm.weights.marks import failure
from ray_stream_llm.weights.pull import pull_error
from ray_stream_llm.weights.reading import REGION_ENV, WEIGHTS_ENV, weights_env
from ray_stream_llm.weights.source import WeightSource, acquire

logger = logging.getLogger(__name__)

CACHE_ROOT_ENV = "VLLM_CACHE_ROOT"


class StreamingvLLMEngineStageUDF(vLLMEngineStageUDF):
    """Ray's engine UDF with metadata fetched locally and weights streamed from the URI."""

    def __init__(
        self,
        data_column: str,
        expected_input_keys: list[str],
        model: str,
        engine_kwargs: dict[str, Any],
        *,
        secret_env: SecretEnv | None = None,
        plan: Plan | None = None,
        **kwargs: Any,
    ):
        self._started = time.time() - 1.0  # file mtimes are coarser than time.time()
        # vLLM's IPC sockets in a directory of this engine's own (vLLM leaves them in
        # VLLM_RPC_BASE_PATH, /tmp by default: about 6 per engine start), removed with it
        rpc_base = os.environ.get("VLLM_RPC_BASE_PATH") or tempfile.gettempdir()
        self._rpc_dir = tempfile.mkdtemp(prefix="rsl-rpc-", dir=rpc_base)
        os.environ["VLLM_RPC_BASE_PATH"] = self._rpc_dir
        # vLLM's shared memory and that directory are removed however the actor ends: by
        # the node's agent, made (if it must be) while the engine starts
        watched = watch_engine(
            os.getpid(), self._started, [self._rpc_dir], janitor_log(os.getpid())
        )
        begin = time.perf_counter()
        uri_text = model  # what the report names: the URI when streamed, else Ray's model
        fetched: FetchReport | None = None
        self._weights: WeightSource | None = None
        _prepare(secret_env, None, None)  # logging and secrets; the fetch is next
        stream = plan is not None
        on_cpu = cpu.is_cpu_build()
        if on_cpu:  # vLLM's processes inherit this actor's environment
            cpu.bind_threads(os.environ)
        if plan is not None:
            uri_text = plan.model
            # the streamer's CPU buffer bounded by the actor's memory, unless the user chose
            memory.streamer_memory_limit(
                engine_kwargs,
                node.engines_per_node(plan.sharing.engine_resources),
                cpu_build=on_cpu,
                assigned=node.assigned_memory(),
            )
            if plan.weight_checksums:  # vLLM's processes inherit this actor's environment
                os.environ[checksums.ENV] = "1"
            try:
                fetched = fetch_metadata_report(plan.uri, wait_out_outages=True)
            except RayStreamLLMError as exc:
                store_failure(exc)  # for ray_stream_llm.typed_errors() on the driver
                raise
            engine_kwargs = dict(engine_kwargs)
            engine_kwargs.setdefault("served_model_name", uri_text)
            try:  # the node's region where the weights are shared, else the store
                if plan.sharing is not None and plan.sharing.mode == "node":
                    # a region is read only through this library's loader: fail closed
                    # before any of it is made
                    require_plugin()
                self._weights = acquire(plan.uri, fetched, plan.sharing, node.holder())
            except RayStreamLLMError as exc:  # no plugin; or 'node' asked for, cannot fit
                store_failure(exc)  # for ray_stream_llm.typed_errors() on the driver
                raise
            if "tokenizer" in engine_kwargs:
                engine_kwargs["tokenizer"] = local_metadata(engine_kwargs["tokenizer"])
            model = str(content_dir(fetched.path))  # the same path for the same metadata
        local = Path(model) if Path(model).is_dir() else None  # else a hub id: no config
        if on_cpu:
            engine_kwargs = cpu.kv_cache_default(engine_kwargs, local)
        if not engine_kwargs.get("enforce_eager"):  # vLLM compiles: a cache per target
            _engine_env(CACHE_ROOT_ENV, _target_cache_root())
        compile_cache_uri = plan.compile_cache_uri if plan else None
        compile_key = compile_store.cache_key(model) if compile_cache_uri else None
        why_miss = None  # why the store had nothing for this node (another CPU's code...)
        if compile_cache_uri and compile_key:  # what another node compiled, before vLLM starts
            root = compile_store.aot_root()
            why_miss = compile_store.fetch(compile_cache_uri, compile_key, root, None).why_not
        attempts = 1 + max(0, plan.load_retries if plan else 0)
        for attempt in range(1, attempts + 1):
            if self._weights is not None:  # vLLM then skips its own pull and streams these
                self._weights = self._weights.prepare()
                # vLLM gets no model_weights (its compile key then holds no URI and no
                # node); the library's loader reads the URI, or the node's region, named here
                engine_kwargs.pop("model_weights", None)
                _engine_env(WEIGHTS_ENV, weights_env(model, self._weights.model_weights))
                _engine_env(REGION_ENV, getattr(self._weights, "region", None))
            watcher = StreamWatcher(uri_text, progress=progress_enabled())
            try:
                with watcher, engine_stage_shims():
                    super().__init__(
                        data_column,
                        expected_input_keys,
                        model=model,
                        engine_kwargs=engine_kwargs,
                        **kwargs,
                    )
                    ready_seconds = time.perf_counter() - begin
                    records = collect(os.environ.get(REPORT_DIR_ENV))
            except Exception as exc:  # the engine did not start: why?
                self._release_engine()
                delay = (plan.load_retry_backoff_s if plan else 0.0) * 2 ** (attempt - 1)
                error = _budget_spent(uri_text, self._weights) or _start_failure(
                    uri_text, plan, exc, watcher, attempt, attempts
                )
                if error is not None:  # the pull's own class where an object changed
                    error = _object_changed(uri_text, self._weights, attempt) or error
                    store_failure(error)  # for ray_stream_llm.typed_errors() on the driver
                    raise error from exc
                logger.warning(
                    "vLLM engine for %s failed to start while loading its weights (attempt "
                    "%d/%d: %s); retrying in %.1fs",
                    uri_text,
                    attempt,
                    attempts,
                    _cause(exc, watcher),
                    delay,
                )
                time.sleep(delay)
                continue
            compiled = figures(records, why_miss)  # vLLM's compile phase, as its processes saw it
            publish(
                build_report(
                    model=uri_text,
                    streamed=stream,
                    attempt=attempt,
                    ready_seconds=ready_seconds,
                    fetched=fetched,
                    sessions=watcher.sessions,
                    sizes=self._weights.sizes() if self._weights else {},
                    job_id=job_id(),
                    node_ip=node_ip(),
                    actor_settings=streamer_settings(),
                    weight_sharing=self._weights.sharing if self._weights else "off",
                    pull=self._weights.pull() if self._weights else None,
                    weight_checksums=watcher.checksums,
                    **compiled,
                )
            )
            if compile_cache_uri and compile_key:  # what this engine compiled, for other nodes
                for artifact in compile_store.compiled_dirs(records):
                    compile_store.ship(compile_cache_uri, compile_key, artifact, None)
            lora_path = kwargs.get("dynamic_lora_loading_path")
            if plan is not None and lora_path:
                self._serve_adapters(lora_path, plan.model)
            watched.confirm()  # the node's agent watches this actor
            return

    def _serve_adapters(self, lora_path: str, base: str) -> None:
        """Ray's per-row adapter lookup (``_maybe_get_lora_request`` of its engine wrapper),
        with each adapter fetched once, when a row first names it, by this library's store
        client with the settings this actor's environment holds (the job's
        ``ObjectStoreConfig``), into this engine's own directory (removed with it). A row
        whose ``model`` is the model's URI, or that has none, is the base model."""
        wrapper = self.llm
        root = os.path.join(self._rpc_dir, "lora")  # the node's agent removes it however we end
        os.makedirs(root, exist_ok=True)
        lock = asyncio.Lock()
        loaded: dict[str, Any] = {}
        base_names = {wrapper.model, base}

        async def lora_request(row: dict[str, Any]) -> Any:
            name = row.get("model")
            if name is None or name in base_names:
                return None
            async with lock:
                if name not in loaded:
                    from vllm.lora.request import LoRARequest

                    try:
                        path = await asyncio.to_thread(fetch_adapter, lora_path, name, root)
                    except RayStreamLLMError as exc:
                        store_failure(exc)  # for ray_stream_llm.typed_errors() on the driver
                        raise
                    logger.info("LoRA adapter %r fetched from %s to %s", name, lora_path, path)
                    loaded[name] = LoRARequest(
                        lora_name=name, lora_int_id=len(loaded) + 1, lora_path=str(path)
                    )
            return loaded[name]

        wrapper._maybe_get_lora_request = lora_request

    def _release_engine(self) -> None:
        """What a failed start left behind: the engine processes and their shared memory."""
        llm = self.__dict__.pop("llm", None)
        if llm is not None:
            try:
                llm.shutdown()
            except Exception:  # already dead: nothing more to release
                logger.debug("engine shutdown after a failed start raised", exc_info=True)
        # the engine's processes are gone: what they mapped is the node agent's to remove,
        # once this actor exits (it saw them while they lived)

    def __del__(self) -> None:
        own = segments_of(os.getpid())  # the engine's, while its processes still map them
        super().__del__()  # shuts the engine down
        if hasattr(self, "_started") and own:
            remove_orphaned_segments(self._started, only=own)
        rpc = getattr(self, "_rpc_dir", None)
        if rpc is not None:
            shutil.rmtree(rpc, ignore_errors=True)
        weights, self._weights = getattr(self, "_weights", None), None
        if weights is not None:
            weights.release()  # the last engine of the node removes the region


def _engine_env(name: str, value: str | None) -> None:
    """``name`` in this actor's environment, which vLLM's processes inherit (``value``, or
    unset for None), and among the variables vLLM's Ray executor copies to its workers."""
    if value is None:
        os.environ.pop(name, None)
        return
    os.environ[name] = value
    copy_to_ray_workers(name)


def _target_cache_root() -> str:
    """vLLM's cache directory for what this node compiles for: the user's
    ``VLLM_CACHE_ROOT`` (or vLLM's default) with the target's name under it."""
    from vllm import envs

    return compile_target.cache_root(envs.VLLM_CACHE_ROOT, compile_target.target())


def _cause(exc: BaseException, watcher: StreamWatcher) -> str:
    """vLLM's root cause as its processes logged it, else the exception the actor saw."""
    return redact(root_cause(watcher.failures) or f"{type(exc).__name__}: {exc}")


def _start_failure(
    uri: str,
    plan: Plan | None,
    exc: BaseException,
    watcher: StreamWatcher,
    attempt: int,
    attempts: int,
) -> RayStreamLLMError | None:
    """The typed error to raise for a failed engine start, or None to retry it.

    A start is retried only when the weights were the problem: a streaming session began
    and did not finish, the streamer raised, or the store does not answer now. Anything
    else (a setting vLLM refused, memory, the model) fails at once, quoting vLLM's root
    cause.
    """
    cause = _cause(exc, watcher)
    store_now = _store_check(plan.uri) if plan else "not checked"
    if plan and (
        watcher.streaming_interrupted or from_streamer(watcher.failures) or store_now != "reachable"
    ):
        if attempt < attempts:
            return None
        return WeightLoadError(
            f"the vLLM engine for {uri!r} failed to load its weights {attempts} time(s) (root "
            f"cause: {cause}); object store now: {store_now}. Check the store and the "
            "network; load_retries and load_retry_backoff_s set the retry policy"
        )
    return EngineStartError(
        f"the vLLM engine for {uri!r} failed to start, not because of the object store "
        f"(not retried): {cause}. Fix the engine settings (engine_kwargs) or the node's "
        "resources; the engine's log has the full traceback"
    )


def _budget_spent(uri: str, weights: WeightSource | None) -> RayStreamLLMError | None:
    """The node's pull's typed store error when it waited the store out for the whole of the
    store's budget (its failure mark says so): the budget is the job's, not one start's, so
    the start is not retried to wait again. None otherwise (a store that failed early, or
    no region)."""
    region = getattr(weights, "region", None)
    found = failure(Path(region)) if region is not None else None
    if found is None:
        return None
    name, message = found
    for kind in (StoreUnreachableError, StoreTimeoutError):
        if name == kind.__name__ and WAITED_OUT in message:
            return kind(
                f"the node's pull of the weights of {uri!r} waited for the object store and "
                f"gave up (not retried): {message}. Check the store and "
                "the network; ObjectStoreConfig.timeout_s sets how long a store is waited for"
            )
    return None


def _object_changed(
    uri: str, weights: WeightSource | None, attempt: int
) -> RayStreamLLMError | None:
    """The start failed for good and the node's pull saw an object of the model change (its
    failure mark says ``ObjectChangedError``): that class, not ``WeightLoadError`` or
    ``EngineStartError``, so that the driver's ``except ObjectChangedError`` (inside
    :func:`ray_stream_llm.typed_errors`) catches it. None otherwise."""
    region = getattr(weights, "region", None)
    error = pull_error(region) if region is not None else None
    if not isinstance(error, ObjectChangedError):
        return None
    return ObjectChangedError(
        f"the vLLM engine for {uri!r} failed to load its weights {attempt} time(s); {error}"
    )


def _store_check(model: ModelURI) -> str:
    """One listing of the model: 'reachable', or the typed error's message."""
    from ray_stream_llm import stores

    try:
        stores.list_model(model, None)
    except RayStreamLLMError as exc:
        return f"{type(exc).__name__}: {exc}"
    return "reachable"
