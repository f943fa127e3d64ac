"""The library's weight seam into vLLM: its Run:ai loaders, registered again under their
own load-format names through vLLM's public ``register_model_loader``.

``runai_streamer`` becomes a subclass of vLLM's ``RunaiModelStreamerLoader`` and
``runai_streamer_sharded`` a subclass of its ``ShardedStateLoader``; each changes only how
the weights are iterated (:func:`stream_weights`), so vLLM's own option checks, listing and
weight loading stay in charge. What they add:

- **The engine's weights, named apart.** The engine actor gives vLLM its model directory
  and no ``model_weights`` (vLLM's compile key then holds no URI and no node) and names
  the URI the weights stream from for that directory
  (:func:`~ray_stream_llm.weights.reading.weights_of`).
- **A node's shared region, file by file.** When the engine actor names a region for the
  model's URI (:func:`~ray_stream_llm.weights.reading.region_of`), or the path vLLM gives
  is a region's directory (it holds the region's marker), the files
  are the ones the marker lists, in that order, and each is streamed once it is whole
  under its name in that directory (:func:`~ray_stream_llm.weights.reading.file_source`:
  or from the store, its URI made from the marker's, where ``'auto'`` gave the region up).
  The pull renames a file to its name only when it is whole, so nothing can read one that
  is still being written.
- **The load report.** Where an engine actor of this library asked for reports
  (``RAY_STREAM_LLM_LOAD_REPORT_DIR``), each streaming session writes ``<pid>-<n>.json``
  there: the files, the bytes planned and delivered, the seconds, the seconds waited for
  the region, the process's tensor-parallel rank and the streamer settings in force. It is
  rewritten at most every half second while tensors arrive (the actor turns it into
  progress) and once at the end.
- **No second copy.** vLLM's iterator yields ``tensor.clone()`` of every tensor; a streamer
  that hands out tensors it does not reuse (``owned=True``, runai-model-streamer 0.17) needs
  none, so none is made there. An older streamer's tensors are views into its reused
  buffers: they are cloned, as vLLM does.

vLLM logs a warning when a load format is registered again ("already registered, and will
be overwritten"): once per process, and expected.
"""

from __future__ import annotations

import inspect
import itertools
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

from ray_stream_llm.errors import UnsupportedLoadFormatError
from ray_stream_llm.integrations.vllm import checksums
from ray_stream_llm.integrations.vllm.compile_cache import (
    REPORT_DIR_ENV,
    tensor_parallel_rank,
    write_report,
)
from ray_stream_llm.weights.marks import objects_of
from ray_stream_llm.weights.reading import (
    file_source,
    planned_files,
    region_of,
    wait_for,
    weights_of,
)

# The streamer's tuning, as the streaming process sees it (vLLM applies its
# model_loader_extra_config to this process's environment before it streams).
STREAMER_SETTINGS = {
    "concurrency": "RUNAI_STREAMER_CONCURRENCY",
    "memory_limit": "RUNAI_STREAMER_MEMORY_LIMIT",
    "chunk_bytesize": "RUNAI_STREAMER_CHUNK_BYTESIZE",
}
LOAD_FORMATS = ("runai_streamer", "runai_streamer_sharded")
SHARDED_SCHEMES = ("s3",)  # the store URIs vLLM's sharded loader lists rank files under

_FLUSH_S = 0.5
_sessions = itertools.count()
_registered: list[str] = []  # the load formats registered in this process


def streamer_settings() -> dict[str, str]:
    return {k: os.environ.get(v, "default") for k, v in STREAMER_SETTINGS.items()}


def register() -> list[str]:
    """Register the loaders in this (vLLM) process; the load formats registered. Idempotent;
    nothing where vLLM is not importable."""
    if _registered:
        return list(_registered)
    try:
        from vllm.model_executor.model_loader import (
            RunaiModelStreamerLoader,
            ShardedStateLoader,
            register_model_loader,
        )
    except ImportError:
        return []

    class Checksummed:
        """Both loaders: with ``weight_checksums=True``, the model this process loaded is
        hashed (:func:`~ray_stream_llm.integrations.vllm.checksums.record`)."""

        def load_model(self, *args: Any, **kwargs: Any) -> Any:
            model = super().load_model(*args, **kwargs)  # type: ignore[misc]
            checksums.record(model)
            return model

    class StreamingLoader(Checksummed, RunaiModelStreamerLoader):
        """vLLM's Run:ai loader; a node's region is read file by file as each completes."""

        def _prepare_weights(self, model_name_or_path: str, revision: str | None) -> list[str]:
            model_name_or_path = weights_of(model_name_or_path)  # the engine's URI
            planned = planned_files(model_name_or_path)  # a region: its marker's files
            if planned is not None:
                return planned
            files: list[str] = super()._prepare_weights(model_name_or_path, revision)
            return files

        def _get_weights_iterator(
            self, model_or_path: str, revision: str | None, *args: Any, **kwargs: Any
        ) -> Iterator[tuple[str, Any]]:
            # a newer vLLM's predicate of the weights a model does not use (0.33:
            # is_unused_weight, passed positionally and most often None)
            unused = args[0] if args else kwargs.get("is_unused_weight")
            model_or_path = weights_of(model_or_path)  # the engine's URI
            region = region_of(model_or_path)  # the URI, with the node's region named apart
            if region is not None:  # the marker's files, each awaited by its name
                return stream_weights(
                    [o.path for o in objects_of(region)],
                    distributed=self._is_distributed,
                    unused=unused,
                    region=str(region),
                )
            if unused is not None:  # from the store: vLLM's own selection of the files
                return counted(
                    super()._get_weights_iterator(model_or_path, revision, *args, **kwargs)
                )
            files = self._prepare_weights(model_or_path, revision)
            return stream_weights(files, distributed=self._is_distributed)

    class ShardedStreamingLoader(Checksummed, ShardedStateLoader):
        """vLLM's pre-sharded loader; ``runai_streamer_sharded`` streams as above. vLLM
        lists a rank's files with a glob of the directory, which sees a region's files only
        once they are whole: on a region, every file is awaited before the glob. A store
        URI it cannot list is refused (:func:`check_sharded_location`)."""

        def _prepare_weights(self, model_name_or_path: str, revision: str | None) -> Any:
            source = weights_of(model_name_or_path)  # the engine's URI
            check_sharded_location(source)
            region = region_of(source)
            return super()._prepare_weights(str(region or source), revision)

        def load_weights(self, model: Any, model_config: Any) -> None:
            given = model_config.model_weights or model_config.model
            source = weights_of(given)  # the engine's URI
            # vLLM >= 0.34 calls _prepare_weights here first; older ones glob at once
            check_sharded_location(source)
            region = region_of(source)
            if region is not None:
                for obj in objects_of(region):
                    wait_for(region, obj.path)
                source = str(region)
            if source == given:
                super().load_weights(model, model_config)
                return
            # vLLM's loader globs model_weights: set for the load alone (its compile key
            # is made from the engine's config as given)
            saved = model_config.model_weights
            model_config.model_weights = source
            try:
                super().load_weights(model, model_config)
            finally:
                model_config.model_weights = saved

        def iterate_over_files(self, paths: list[str]) -> Iterator[tuple[str, Any]]:
            if self.load_config.load_format != "runai_streamer_sharded":
                yield from super().iterate_over_files(paths)
                return
            yield from stream_weights(sorted(paths), distributed=False)

    register_model_loader("runai_streamer")(StreamingLoader)
    register_model_loader("runai_streamer_sharded")(ShardedStreamingLoader)
    _registered.extend(LOAD_FORMATS)
    return list(_registered)


def check_sharded_location(location: str) -> None:
    """Raise :class:`~ray_stream_llm.errors.UnsupportedLoadFormatError` for a URI whose rank
    files vLLM's ``ShardedStateLoader`` cannot list (any scheme but ``s3://``); a local
    path, a region's included, passes. vLLM 0.29-0.33 globs such a URI as a local path
    ("Could not find checkpoint files"); 0.34 hands it to a Hugging Face Hub download."""
    scheme, sep, _ = str(location).partition("://")
    if sep and scheme.lower() not in SHARDED_SCHEMES:
        raise UnsupportedLoadFormatError(
            f"load_format 'runai_streamer_sharded' finds rank files only under s3://, not "
            f"{scheme}:// ({location!r}); use 'runai_streamer' for this model, or put the "
            "sharded checkpoint in S3"
        )


def _owned_tensors() -> bool:
    """Whether this streamer hands out tensors it never reuses (``owned=True``)."""
    from runai_model_streamer import SafetensorsStreamer

    return "owned" in inspect.signature(SafetensorsStreamer.stream_files).parameters


def _device(distributed: bool) -> str:
    """Where the streamer puts tensors: the GPU only in its distributed mode (as vLLM)."""
    if not distributed:
        return "cpu"
    from vllm.platforms import current_platform

    if current_platform.is_cuda_alike():
        return f"cuda:{current_platform.current_device()}"
    return "cpu"


def stream_weights(
    files: list[str],
    *,
    distributed: bool,
    unused: Callable[[str], bool] | None = None,
    region: str | None = None,
) -> Iterator[tuple[str, Any]]:
    """The tensors of ``files`` (local paths or store URIs), streamed by the Run:ai
    streamer in one session; without the tensors ``unused`` names (a newer vLLM's weights a
    model does not use). ``region``: the node's region (the directory vLLM was given), and
    ``files`` the names of its weight files: each is awaited and streamed once whole, one
    at a time (:func:`~ray_stream_llm.weights.reading.file_source`)."""
    from runai_model_streamer import SafetensorsStreamer

    owned = _owned_tensors()
    options: dict[str, Any] = {"device": _device(distributed), "is_distributed": distributed}
    if owned:
        options["owned"] = True
    shown = [os.path.join(region, f) for f in files] if region is not None else files
    report = _Report(shown, shared=region is not None)
    with SafetensorsStreamer() as streamer:
        if region is None:
            streamer.stream_files(list(files), **options)
            report.planned(int(streamer.total_size))
            yield from report.count(streamer.get_tensors(), clone=not owned, unused=unused)
        else:
            sizes = {o.path: o.size for o in objects_of(region)}
            report.planned(sum(sizes[name] for name in files))
            for name in files:
                source, waited = file_source(region, name)
                report.waited(waited)
                streamer.stream_files([source], **options)
                yield from report.count(streamer.get_tensors(), clone=not owned, unused=unused)
    report.finish()


def counted(tensors: Iterator[tuple[str, Any]]) -> Iterator[tuple[str, Any]]:
    """vLLM's own iterator's tensors, counted for the load report (its files unknown here)."""
    report = _Report([], shared=False)
    yield from report.count(tensors, clone=False)
    report.finish()


class _Report:
    """One streaming session's ``<pid>-<n>.json`` in the engine actor's report directory
    (nothing where no actor asked for one)."""

    def __init__(self, files: list[str], *, shared: bool):
        directory = os.environ.get(REPORT_DIR_ENV)
        self.path = (
            os.path.join(directory, f"{os.getpid()}-{next(_sessions)}.json") if directory else None
        )
        self.state: dict[str, Any] = {
            "pid": os.getpid(),
            "rank": tensor_parallel_rank(),
            "files": [str(f) for f in files],
            "planned_bytes": 0,
            "delivered_bytes": 0,
            "tensors": 0,
            "started": time.time(),
            "seconds": 0.0,
            "waited": 0.0,
            "shared": shared,
            "settings": streamer_settings(),
            "done": False,
        }
        self._flushed = 0.0

    def planned(self, nbytes: int) -> None:
        self.state["planned_bytes"] = nbytes
        self._flush(force=True)

    def waited(self, seconds: float) -> None:
        self.state["waited"] += seconds

    def count(
        self,
        tensors: Iterator[tuple[str, Any]],
        *,
        clone: bool,
        unused: Callable[[str], bool] | None = None,
    ) -> Iterator[tuple[str, Any]]:
        for name, tensor in tensors:
            self.state["delivered_bytes"] += tensor.numel() * tensor.element_size()
            self.state["tensors"] += 1
            self._flush()
            if unused is None or not unused(name):
                yield name, (tensor.clone() if clone else tensor)

    def finish(self) -> None:
        self.state["done"] = True
        self._flush(force=True)

    def _flush(self, force: bool = False) -> None:
        if self.path is None:
            return
        now = time.time()
        if not force and now - self._flushed < _FLUSH_S:
            return
        self._flushed = now
        self.state["seconds"] = now - self.state["started"]
        write_report(self.path, self.state)
