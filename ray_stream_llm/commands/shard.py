"""``ray-stream-llm shard``: write a pre-sharded checkpoint (one set of files per
tensor-parallel rank) to the store, for ``load_format="runai_streamer_sharded"``.

The model is streamed from the store into a vLLM engine at ``tensor_parallel_size=N``
(``runai_streamer``, nothing written to disk), every rank saves its own state with vLLM's
``ShardedStateLoader.save_model`` into a private directory on a memory-backed filesystem
(``/dev/shm`` by default: a disk-backed one is refused), and each file is uploaded and
removed from there at once. The model's metadata (config, tokenizer, generation config,
chat templates; not the safetensors index, which names the original files) is copied too.

The output prefix, in order:

1. ``ray-stream-llm-shard.partial``: the run's identity (source, its weight ETags, N, the
   part size), written first; after the save, rewritten with every file's size and SHA-256;
2. the metadata files and ``model-rank-R-part-P.safetensors``, each with its SHA-256 in the
   object's user metadata (``x-amz-meta-sha256``);
3. ``ray-stream-llm-shard.done``, the completion marker, last; then the partial marker
   is deleted.

Idempotent: a complete output of the same run is left as it is (nothing loaded). Resumable:
a run stopped after ``.partial`` starts again where it was; objects already uploaded whole
(same size and SHA-256) are not sent again, and when every file is already there the model
is not loaded at all. :func:`ray_stream_llm.inspect_model` refuses a partial output
(:class:`~ray_stream_llm.errors.IncompleteShardedCheckpointError`).

Output: ``s3://`` (or an S3-compatible store) only: vLLM 0.29's ``ShardedStateLoader``
finds the rank files by listing ``s3://`` prefixes and nothing else.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ray_stream_llm import stores
from ray_stream_llm.errors import (
    EngineStartError,
    InvalidModelURIError,
    InvalidSettingError,
    RayStreamLLMError,
    ShardOutputConflictError,
    ShardWriteError,
    WeightSharingError,
)
from ray_stream_llm.files import sha256_of
from ray_stream_llm.manifest import (
    SHARD_DONE_MARKER,
    SHARD_PARTIAL_MARKER,
    inspect_model,
    read_shard_marker,
)
from ray_stream_llm.patterns import SAFETENSORS_INDEX, SHARD_PATTERN, FileRole, shard_file_regex
from ray_stream_llm.stores import StoreDeadline
from ray_stream_llm.stores.settings import ObjectStoreConfig, derive_settings
from ray_stream_llm.uri import ModelURI, parse_model_uri

MARKER_VERSION = 1
DEFAULT_STAGE = "/dev/shm"
MEMORY_FILESYSTEMS = ("tmpfs", "ramfs")
STAGE_PREFIX = "rsl-shard-"
# The rank files hold every weight of the model (replicated ones once per rank): far less
# than the source's bytes means the save lost weights.
MIN_SAVED_SHARE = 0.5
SHARDED_LOAD_FORMAT = "runai_streamer_sharded"
# Engine settings of the writing engine (vLLM's CPU build adds its own: cpu.WRITER_KWARGS).
WRITER_KWARGS: dict[str, Any] = {"enforce_eager": True, "max_num_seqs": 1, "seed": 0}


@dataclasses.dataclass
class ShardResult:
    """What one ``shard`` run did."""

    output: str
    tensor_parallel_size: int
    files: list[dict[str, Any]]  # {path, size, sha256, rank}: the rank files
    metadata: list[str]  # metadata files copied next to them
    uploaded: list[str]  # objects this run sent (the rest were there already)
    already_complete: bool  # the output was complete: nothing was loaded or sent
    loaded: bool  # a vLLM engine was started (False when every file was there)
    load_seconds: float
    save_seconds: float
    upload_seconds: float
    total_seconds: float
    stage_dir: str | None  # the memory-backed directory the ranks saved into (now removed)
    staged_peak_bytes: int  # the most bytes that were in it at once

    @property
    def weight_bytes(self) -> int:
        return sum(int(f["size"]) for f in self.files)

    def rank_bytes(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for f in self.files:
            out[int(f["rank"])] = out.get(int(f["rank"]), 0) + int(f["size"])
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            **dataclasses.asdict(self),
            "weight_bytes": self.weight_bytes,
            "rank_bytes": self.rank_bytes(),
        }


def mount_type(path: str | os.PathLike[str]) -> str:
    """The filesystem type of the mount holding ``path`` (from /proc/self/mounts)."""
    real = os.path.realpath(path)
    best, kind = "", "unknown"
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return kind
    for line in lines:
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, fields[2]
    return kind


def _check_stage(stage: Path, need: int) -> None:
    if not stage.is_dir():
        raise InvalidSettingError(
            f"stage directory {str(stage)!r} does not exist; pass a directory on a "
            f"memory-backed filesystem (tmpfs), e.g. {DEFAULT_STAGE}"
        )
    kind = mount_type(stage)
    if kind not in MEMORY_FILESYSTEMS:
        raise InvalidSettingError(
            f"stage directory {str(stage)!r} is on a {kind} filesystem, not a memory-backed "
            f"one ({', '.join(MEMORY_FILESYSTEMS)}): the rank files would be written to disk; "
            f"pass a tmpfs directory such as {DEFAULT_STAGE}"
        )
    free = shutil.disk_usage(stage).free
    if free < need:
        raise WeightSharingError(
            f"stage directory {str(stage)!r} has {free} bytes free, and the rank files of this "
            f"model need about {need}; free memory there or pass a larger tmpfs directory"
        )


def _remove_stale_stages(stage: Path) -> None:
    """Stage directories of ``shard`` runs whose process is gone (killed mid-way)."""
    for entry in stage.glob(f"{STAGE_PREFIX}*"):
        try:
            pid = int(entry.name[len(STAGE_PREFIX) :].split("-", 1)[0])
        except ValueError:
            continue
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(entry, ignore_errors=True)
        except PermissionError:
            continue


class _Output:
    """The output prefix, through one boto3 client (the S3 backend's)."""

    def __init__(self, uri: ModelURI, store: ObjectStoreConfig | None):
        self.uri = uri
        self.store = store
        self.deadline = StoreDeadline(store.timeout_s if store is not None else None)
        from ray_stream_llm.stores import s3

        # the client serves the whole run (uploads after the engine wrote for minutes): its
        # requests are bounded per attempt only; the budget bounds the markers' reads
        self.client = s3.make_client(store)

    def listing(self) -> dict[str, Any]:
        impl = stores.backend(self.uri.scheme)
        return {o.path: o for o in impl.list_objects(self.client, self.uri)}

    def _call(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        from botocore import exceptions as bexc

        from ray_stream_llm.stores import s3

        try:
            return fn(*args, **kwargs)
        except (bexc.BotoCoreError, bexc.ClientError) as exc:
            raise s3.translate(exc, self.uri, self.client, what) from None

    def put_json(self, name: str, value: dict[str, Any]) -> None:
        body = json.dumps(value, indent=1, sort_keys=True).encode()
        self._call(
            f"writing {name!r} to",
            self.client.put_object,
            Bucket=self.uri.bucket,
            Key=self.uri.key(name),
            Body=body,
        )

    def delete(self, name: str) -> None:
        self._call(
            f"deleting {name!r} of",
            self.client.delete_object,
            Bucket=self.uri.bucket,
            Key=self.uri.key(name),
        )

    def sha256_of(self, name: str) -> str | None:
        from botocore import exceptions as bexc

        try:
            head = self.client.head_object(Bucket=self.uri.bucket, Key=self.uri.key(name))
        except bexc.ClientError:
            return None
        return str(head.get("Metadata", {}).get("sha256") or "") or None

    def upload(self, local: Path, name: str, sha256: str) -> None:
        self._call(
            f"uploading {name!r} to",
            self.client.upload_file,
            str(local),
            self.uri.bucket,
            self.uri.key(name),
            ExtraArgs={"Metadata": {"sha256": sha256}},
        )


def _identity(
    source: ModelURI, etags: dict[str, str], tp: int, max_part_bytes: int | None
) -> dict[str, Any]:
    return {
        "source": str(source),
        "source_weights": etags,
        "tensor_parallel_size": tp,
        "pattern": SHARD_PATTERN,  # what the writer saves with (pattern=None)
        "max_part_bytes": max_part_bytes,
    }


def _same_run(marker: dict[str, Any], identity: dict[str, Any]) -> bool:
    return all(marker.get(k) == v for k, v in identity.items())


def _describe(marker: dict[str, Any]) -> str:
    return f"{marker.get('source')!r} at tensor_parallel_size={marker.get('tensor_parallel_size')}"


def _complete(marker: dict[str, Any], listing: dict[str, Any]) -> bool:
    return all(
        f.get("path") in listing and listing[f["path"]].size == f.get("size")
        for f in marker.get("files", [])
    ) and bool(marker.get("files"))


@dataclasses.dataclass
class _Plan:
    """What one run writes, where, and what the output already holds."""

    source: ModelURI
    output: ModelURI
    tensor_parallel_size: int
    max_part_bytes: int | None
    source_bytes: int  # the safetensors weights of the source
    metadata_paths: list[str]  # the source's metadata files, as inspect_model found them
    identity: dict[str, Any]  # the run's identity, in every marker
    out: _Output
    listing: dict[str, Any]  # the output prefix, listed once
    stage: Path
    need: int  # bytes the stage must hold


def shard_model(
    model_uri: str,
    tensor_parallel_size: int,
    output_uri: str,
    *,
    object_store: ObjectStoreConfig | None = None,
    engine_kwargs: dict[str, Any] | None = None,
    max_part_bytes: int | None = None,
    stage_dir: str | os.PathLike[str] = DEFAULT_STAGE,
    log: Callable[[str], None] = lambda _msg: None,
) -> ShardResult:
    """Write the model at ``model_uri`` to ``output_uri`` as a pre-sharded checkpoint for
    ``tensor_parallel_size`` ranks (see the module's docstring). Runs a vLLM engine with
    ``tensor_parallel_size`` workers on this node (``engine_kwargs`` are added to the
    writer's own). Raises the typed errors of :func:`ray_stream_llm.inspect_model` for the
    source, :class:`~ray_stream_llm.errors.ShardOutputConflictError` for an output that holds
    something else, :class:`~ray_stream_llm.errors.InvalidSettingError` for a stage
    directory that is not memory-backed.

    Four steps: :func:`_plan` (the arguments, the source, the output's listing),
    :func:`_resume` (what the output's markers say is left to do), :func:`_save` (the
    engine writes each rank's files into the stage) and :func:`_upload_ranks`; the
    completion marker last.
    """
    begin = time.perf_counter()
    plan = _plan(
        model_uri, tensor_parallel_size, output_uri, object_store, max_part_bytes, stage_dir
    )
    result = ShardResult(
        output=str(plan.output),
        tensor_parallel_size=tensor_parallel_size,
        files=[],
        metadata=[],
        uploaded=[],
        already_complete=False,
        loaded=False,
        load_seconds=0.0,
        save_seconds=0.0,
        upload_seconds=0.0,
        total_seconds=0.0,
        stage_dir=None,
        staged_peak_bytes=0,
    )
    marker, complete = _resume(plan, log)
    if complete and marker is not None:
        result.files, result.metadata = marker["files"], list(marker.get("metadata", []))
        result.already_complete = True
        result.total_seconds = time.perf_counter() - begin
        return result
    _check_stage(plan.stage, plan.need)  # before anything is written
    plan.out.put_json(
        SHARD_PARTIAL_MARKER, {**(marker or {}), **plan.identity, "version": MARKER_VERSION}
    )

    from ray_stream_llm.fetch import fetch_model_metadata

    meta_dir = fetch_model_metadata(str(plan.source), object_store=object_store)
    metadata = sorted(
        p for p in plan.metadata_paths if p != SAFETENSORS_INDEX and (meta_dir / p).is_file()
    )
    upload_start = time.perf_counter()
    for name in metadata:
        _upload_once(plan.out, meta_dir / name, name, plan.listing, result)
    result.metadata = metadata
    result.upload_seconds += time.perf_counter() - upload_start

    files: list[dict[str, Any]] = list((marker or {}).get("files", []))
    if files and all(_is_there(plan.out, f, plan.listing) for f in files):
        log("every rank file is already in the output: not loading the model")
    else:
        with _staging(plan.stage, plan.need) as private:
            result.stage_dir = str(private)
            staged = _save(plan, meta_dir, private, result, engine_kwargs, object_store, log)
            files = _upload_ranks(plan, staged, result, log)
    result.files = files
    done_marker = {
        **plan.identity,
        "version": MARKER_VERSION,
        "files": files,
        "metadata": metadata,
        # fixed width (UTC, whole seconds): the marker's size does not depend on the clock
        "written_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "source_weight_bytes": plan.source_bytes,
    }
    plan.out.put_json(SHARD_DONE_MARKER, done_marker)  # last: the checkpoint is complete
    plan.out.delete(SHARD_PARTIAL_MARKER)
    result.total_seconds = time.perf_counter() - begin
    return result


def _plan(
    model_uri: str,
    tensor_parallel_size: int,
    output_uri: str,
    object_store: ObjectStoreConfig | None,
    max_part_bytes: int | None,
    stage_dir: str | os.PathLike[str],
) -> _Plan:
    """The arguments checked, the source inspected (streamable, its weights' ETags), the
    output listed: typed errors before anything is written."""
    if isinstance(tensor_parallel_size, bool) or not isinstance(tensor_parallel_size, int):
        raise InvalidSettingError(
            f"tensor_parallel_size must be a positive integer, got {tensor_parallel_size!r}"
        )
    if tensor_parallel_size < 1:
        raise InvalidSettingError(
            f"tensor_parallel_size must be a positive integer, got {tensor_parallel_size}"
        )
    if max_part_bytes is not None and max_part_bytes < 1:
        raise InvalidSettingError(f"max_part_bytes must be positive, got {max_part_bytes}")
    source, output = parse_model_uri(model_uri), parse_model_uri(output_uri)
    if output.scheme != "s3":
        raise InvalidModelURIError(
            f"output {str(output)!r}: vLLM's runai_streamer_sharded loader finds rank files "
            "only under s3:// prefixes (S3 or an S3-compatible store); write the sharded "
            "checkpoint to an s3:// URI"
        )
    same_store = source.scheme == output.scheme and source.bucket == output.bucket
    if same_store and (
        source.prefix.startswith(output.prefix) or output.prefix.startswith(source.prefix)
    ):
        raise InvalidModelURIError(
            f"output {str(output)!r} and the model {str(source)!r} overlap; write the sharded "
            "checkpoint to a prefix of its own, e.g. "
            f"s3://{output.bucket}/{source.prefix.rstrip('/')}-tp{tensor_parallel_size}/"
        )
    manifest = inspect_model(str(source), object_store=object_store)
    manifest.raise_if_not_streamable()
    weights = [f for f in manifest.files if f.role is FileRole.STREAMABLE_WEIGHTS]
    etags = _source_etags(source, object_store)
    out = _Output(output, object_store)
    return _Plan(
        source=source,
        output=output,
        tensor_parallel_size=tensor_parallel_size,
        max_part_bytes=max_part_bytes,
        source_bytes=sum(f.size for f in weights),
        metadata_paths=list(manifest.paths(FileRole.METADATA)),
        identity=_identity(source, etags, tensor_parallel_size, max_part_bytes),
        out=out,
        listing=out.listing(),
        stage=Path(stage_dir),
        need=int(manifest.weight_bytes * 1.25) + (64 << 20),
    )


def _resume(plan: _Plan, log: Callable[[str], None]) -> tuple[dict[str, Any] | None, bool]:
    """What the output's markers say: (the marker of this run to continue from, or None;
    whether the output is already complete). An output of another run, or with objects
    this command did not write, is refused."""
    output, listing = plan.output, plan.listing
    if SHARD_DONE_MARKER in listing:
        done = read_shard_marker(
            plan.out.client, output, listing[SHARD_DONE_MARKER], plan.out.deadline
        )
        if not _same_run(done, plan.identity):
            raise ShardOutputConflictError(
                f"{str(output)!r} already holds a sharded checkpoint of {_describe(done)}; "
                "write to another prefix, or delete this one first"
            )
        if _complete(done, listing):
            log(f"{output} is already complete ({SHARD_DONE_MARKER}): nothing to do")
            return done, True
        return done, False  # a file it lists was removed: write it again
    if SHARD_PARTIAL_MARKER in listing:
        marker = read_shard_marker(
            plan.out.client, output, listing[SHARD_PARTIAL_MARKER], plan.out.deadline
        )
        if not _same_run(marker, plan.identity):
            raise ShardOutputConflictError(
                f"{str(output)!r} holds a partial sharded checkpoint of {_describe(marker)}; "
                "run that command again to finish it, or delete the prefix"
            )
        log(f"resuming the partial output at {output}")
        return marker, False
    if listing:
        names = sorted(listing)
        raise ShardOutputConflictError(
            f"{str(output)!r} holds {len(names)} object(s) that `ray-stream-llm shard` did "
            f"not write ({', '.join(names[:5])}); write to an empty prefix"
        )
    return None, False


def _source_etags(source: ModelURI, store: ObjectStoreConfig | None) -> dict[str, str]:
    from ray_stream_llm.patterns import classify

    _, listing = stores.list_model(source, store)
    return {
        o.path: o.etag
        for o in sorted(listing, key=lambda o: o.path)
        if classify(o.path) is FileRole.STREAMABLE_WEIGHTS
    }


def _is_there(out: _Output, entry: dict[str, Any], listing: dict[str, Any]) -> bool:
    found = listing.get(entry["path"])
    return (
        found is not None
        and found.size == entry["size"]
        and out.sha256_of(entry["path"]) == entry["sha256"]
    )


def _upload_once(
    out: _Output, local: Path, name: str, listing: dict[str, Any], result: ShardResult
) -> str:
    sha = sha256_of(local)
    found = listing.get(name)
    if found is not None and found.size == local.stat().st_size and out.sha256_of(name) == sha:
        return sha
    out.upload(local, name, sha)
    result.uploaded.append(name)
    return sha


def _writer_kwargs(
    meta_dir: Path, source: ModelURI, tp: int, engine_kwargs: dict[str, Any] | None
) -> dict[str, Any]:
    from ray_stream_llm.integrations.vllm import cpu

    kwargs: dict[str, Any] = {
        **WRITER_KWARGS,
        **(cpu.WRITER_KWARGS if cpu.is_cpu_build() else {}),
        **(engine_kwargs or {}),
        "model": str(meta_dir),
        "model_weights": str(source),
        "load_format": "runai_streamer",
        "tensor_parallel_size": tp,
    }
    if tp > 1:
        kwargs.setdefault("distributed_executor_backend", "mp")  # workers on this node
    return kwargs


@contextlib.contextmanager
def _staging(stage: Path, need: int) -> Iterator[Path]:
    """A private directory of this run under ``stage`` (checked: memory-backed, room for
    ``need`` bytes; earlier runs' stale directories removed), removed after."""
    _check_stage(stage, need)
    _remove_stale_stages(stage)
    private = Path(tempfile.mkdtemp(prefix=f"{STAGE_PREFIX}{os.getpid()}-", dir=stage))
    try:
        yield private
    finally:
        shutil.rmtree(private, ignore_errors=True)


@contextlib.contextmanager
def _writer_env(object_store: ObjectStoreConfig | None, tp: int) -> Iterator[None]:
    """The process environment the writing engine needs (the store's settings, Ray and
    vLLM kept on loopback), restored after."""
    from ray_stream_llm.commands import LOCAL_ENV
    from ray_stream_llm.env import scoped
    from ray_stream_llm.integrations.vllm import cpu

    env = {**derive_settings(object_store).env}
    if cpu.is_cpu_build():  # TP > 1: the ranks unpinned
        env.update(cpu.writer_env(tp))
    # LOCAL_ENV only where the process has not set it; both restored after
    local = {k: v for k, v in LOCAL_ENV.items() if k not in os.environ}
    with scoped({**local, **env}):
        yield


def _save(
    plan: _Plan,
    meta_dir: Path,
    private: Path,
    result: ShardResult,
    engine_kwargs: dict[str, Any] | None,
    object_store: ObjectStoreConfig | None,
    log: Callable[[str], None],
) -> list[Path]:
    """Load the model streamed at the plan's TP size and save every rank's files into
    ``private``; the rank files, checked (every rank, and most of the source's bytes)."""
    from ray_stream_llm.integrations.vllm.plugin import save_sharded_checkpoint

    source, tp = plan.source, plan.tensor_parallel_size
    with _writer_env(object_store, tp):
        kwargs = _writer_kwargs(meta_dir, source, tp, engine_kwargs)
        log(f"loading {source} at tensor_parallel_size={tp} (streamed) to save its ranks")
        try:
            result.load_seconds, result.save_seconds = save_sharded_checkpoint(
                kwargs, str(private), plan.max_part_bytes
            )
        except RayStreamLLMError:
            raise
        except Exception as exc:  # vLLM's own (a setting, the model, memory)
            cause = str(exc).strip().splitlines()
            raise EngineStartError(
                f"the vLLM engine that saves {source} at tensor_parallel_size={tp} failed: "
                f"{type(exc).__name__}: {' '.join(cause[:3])[:600]}; fix the engine settings "
                "(--engine-kwargs) or the TP size (the model's attention heads must divide "
                f"by it); the output's partial marker stays, run the command again to resume"
            ) from exc
    result.loaded = True
    staged = check_saved_ranks(private, tp, plan.source_bytes, source)
    result.staged_peak_bytes = sum(p.stat().st_size for p in staged)
    return staged


def check_saved_ranks(private: Path, tp: int, source_bytes: int, source: ModelURI) -> list[Path]:
    """The rank files an engine saved into ``private`` for ``tp`` ranks, sorted, once checked:
    files for exactly ranks ``0..tp-1``, holding at least :data:`MIN_SAVED_SHARE` of the
    source's ``source_bytes`` weight bytes; a :class:`ShardWriteError` naming the ranks or
    the sizes otherwise (raised before anything is uploaded or marked complete)."""
    named = shard_file_regex()
    staged = sorted(p for p in private.iterdir() if named.fullmatch(p.name))
    saved = sum(p.stat().st_size for p in staged)
    ranks = {int(m["rank"]) for p in staged if (m := named.fullmatch(p.name))}
    if ranks != set(range(tp)):
        raise ShardWriteError(
            f"vLLM saved files for ranks {sorted(ranks)}, not for the {tp} ranks asked; "
            "check that the engine started with tensor_parallel_size="
            f"{tp} (engine_kwargs must not override it); nothing was marked complete"
        )
    if saved < MIN_SAVED_SHARE * source_bytes:
        raise ShardWriteError(
            f"vLLM saved {saved} bytes of rank files for {source_bytes} bytes of weights in "
            f"{str(source)!r}: weights were lost in the save (an engine whose layers repacked "
            "their weights after loading, e.g. a quantization or a CPU kernel); nothing was "
            "marked complete"
        )
    return staged


def _upload_ranks(
    plan: _Plan, staged: list[Path], result: ShardResult, log: Callable[[str], None]
) -> list[dict[str, Any]]:
    """Every rank file into the output (each removed from memory once it is there); the
    partial marker names every file and its digest first, so that a resumed run knows
    them. The files' entries, for the completion marker."""
    out, listing = plan.out, plan.listing
    files: list[dict[str, Any]] = [
        {
            "path": path.name,
            "size": path.stat().st_size,
            "sha256": sha256_of(path),
            "rank": int(path.name.split("-")[2]),
        }
        for path in staged
    ]
    out.put_json(SHARD_PARTIAL_MARKER, {**plan.identity, "version": MARKER_VERSION, "files": files})
    upload_start = time.perf_counter()
    for entry, path in zip(files, staged, strict=True):
        if not _is_there(out, entry, listing):
            out.upload(path, entry["path"], entry["sha256"])
            result.uploaded.append(entry["path"])
        path.unlink()  # out of memory as soon as it is in the store
    result.upload_seconds += time.perf_counter() - upload_start
    log(f"uploaded {len(files)} rank files to {out.uri}")
    return files
