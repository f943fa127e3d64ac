"""vLLM's compile cache shipped through the store (``compile_cache_uri``): an engine on a
fresh node loads the code another node compiled instead of compiling again.

Layout under ``compile_cache_uri`` (an ``s3://``, ``gs://`` or ``az://`` prefix, reached
with the job's store settings, through the store backends' ``write``)::

    <model>/<target>/<hash>.tar    vLLM's artifact directory torch_aot_compile/<hash>/, a tar
    <model>/<target>/<hash>.done   {"size", "sha256", "target"} of the tar, written last

``<model>`` names the model's metadata as fetched (config, tokenizer...: its files' names,
sizes and CRC32s); ``<target>`` what the code was compiled for
(:mod:`~ray_stream_llm.integrations.vllm.compile_target`: the CPU's instruction set as
torch and Inductor use it, the accelerator's compute capability, the torch and vLLM
versions), which the marker also records in full; together they are the key
(:func:`cache_key`). ``<hash>`` is vLLM's own key (``aot_compile_hash_factors``, over
paths the engine actor keeps the same on every node), so an artifact is only ever loaded by
an engine whose config vLLM keys alike. The node's side is ``$VLLM_CACHE_ROOT``, which the
engine actor sets per target (:func:`~ray_stream_llm.integrations.vllm.compile_target.cache_root`):
:func:`aot_root` follows it.

Before vLLM starts, the engine actor fetches every complete artifact of its key that the
node does not hold (:func:`fetch`): the marker's target is compared with the node's (an
artifact of another target, or of none, is never unpacked, whatever directory it is in),
the tar is checked against the marker, unpacked (``tarfile``'s ``data`` filter: no path
leaves the directory) into a staging directory and renamed into place; a directory
already there (vLLM's own) is never touched. When the store has artifacts of the model only
for other targets, the fetch says why none is used (the load report's ``compile_cache``:
``miss (artifact for CPU AVX512...; this node CPU AVX2...)``). Once the engine is ready, an
engine that compiled ships its artifact (:func:`ship`) unless the store has one for that
hash already: the tar first, the marker last, so a reader never sees half an artifact and
a good artifact is never replaced. Nothing here fails an engine: a damaged, incompatible or
missing artifact gets one warning naming it, and vLLM compiles.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shutil
import tarfile
import tempfile
from pathlib import Path
from typing import Any

from ray_stream_llm import stores
from ray_stream_llm.errors import RayStreamLLMError
from ray_stream_llm.files import sha256_of
from ray_stream_llm.integrations.vllm import compile_target
from ray_stream_llm.redact import redact
from ray_stream_llm.stores.base import Client, ObjectInfo, StoreDeadline
from ray_stream_llm.stores.settings import ObjectStoreConfig
from ray_stream_llm.uri import ModelURI, parse_model_uri

logger = logging.getLogger(__name__)

AOT_SUBDIR = os.path.join("torch_compile_cache", "torch_aot_compile")
TAR, DONE = ".tar", ".done"


@dataclasses.dataclass(frozen=True)
class CacheKey:
    """Where an engine's artifacts are in the store: ``<model>/<target digest>/``."""

    model: str  # the model's metadata as fetched, hashed
    target: dict[str, str | None] = dataclasses.field(hash=False)  # compile_target.target()

    @property
    def target_dir(self) -> str:
        return compile_target.digest(self.target)

    def __str__(self) -> str:
        return f"{self.model}/{self.target_dir}"


def metadata_identity(model: Any) -> str | None:
    """What a model directory this library fetched stands for in the store's key
    (:func:`~ray_stream_llm.fetch.metadata_digest`), not its path; None for any other
    directory."""
    if not isinstance(model, str) or not model:
        return None
    from ray_stream_llm.fetch import metadata_digest

    digest = metadata_digest(os.path.realpath(os.path.expanduser(model)))
    return None if digest is None else f"ray_stream_llm-metadata:{digest}"


def cache_key(metadata_dir: str) -> CacheKey | None:
    """What the compiled code depends on besides vLLM's own key, for one engine: the model's
    fetched metadata and what this node compiles for (its CPU's instruction set as torch and
    Inductor use it, its accelerator, torch's and vLLM's versions). None when the model's
    metadata was not fetched by this library (nothing to key it by), or when part of the
    target could not be read (nothing to vouch for the code by: vLLM compiles, as without
    ``compile_cache_uri``)."""
    identity = metadata_identity(metadata_dir)
    if identity is None:
        return None
    built_for = compile_target.target()
    missing = compile_target.unknown(built_for)
    if missing:
        logger.warning(
            "compile cache not shared: this node's %s could not be read; vLLM compiles",
            ", ".join(missing),
        )
        return None
    model = hashlib.sha256(json.dumps([identity]).encode()).hexdigest()[:32]
    return CacheKey(model, built_for)


@dataclasses.dataclass
class Fetched:
    """What :func:`fetch` did: the artifacts it unpacked, and why the store's artifacts of
    this model were not used (another target's, a damaged one...)."""

    hashes: list[str] = dataclasses.field(default_factory=list)
    refused: list[str] = dataclasses.field(default_factory=list)

    @property
    def why_not(self) -> str | None:
        """Why nothing was fetched, when the store had artifacts of this model; else None."""
        if self.hashes or not self.refused:
            return None
        more = len(self.refused) - 1
        return self.refused[0] + (f" (and {more} more not used)" if more else "")


def aot_root() -> Path:
    """Where vLLM keeps its AOT artifacts in this process's ``$VLLM_CACHE_ROOT`` (the engine
    actor's: the target's own directory, once it set it)."""
    from vllm import envs

    return Path(envs.VLLM_CACHE_ROOT) / AOT_SUBDIR


class _Prefix:
    """``<compile_cache_uri>/<key>/`` through its scheme's store backend."""

    def __init__(self, uri: str, key: str, store: ObjectStoreConfig | None):
        self.uri: ModelURI = parse_model_uri(uri.rstrip("/") + f"/{key}/")
        self.deadline = StoreDeadline(store.timeout_s if store is not None else None)
        self.backend = stores.backend(self.uri.scheme)
        self.client: Client = self.backend.make_client(store, self.deadline)
        self.listing: dict[str, ObjectInfo] = {}

    def names(self) -> dict[str, ObjectInfo]:
        objects = self.deadline.call(
            f"listing {str(self.uri)!r}",
            lambda: list(self.backend.list_objects(self.client, self.uri)),
        )
        self.listing = {o.path: o for o in objects}
        return self.listing

    def get(self, name: str, dest: Path) -> None:
        stores.download(self.client, self.uri, self.listing[name], str(dest), self.deadline)

    def get_json(self, name: str) -> dict[str, Any]:
        return dict(json.loads(stores.read(self.client, self.uri, name, self.deadline)))

    def put(self, local: Path, name: str) -> None:
        where = f"writing {name!r} under {str(self.uri)!r}"
        self.deadline.call(where, self.backend.write, self.client, self.uri, name, str(local))


class _OtherTarget(ValueError):
    """The artifact was compiled for another target than this node's."""


def fetch(uri: str, key: CacheKey, root: Path, store: ObjectStoreConfig | None) -> Fetched:
    """Every complete artifact under ``<uri>/<key>/`` that ``root`` (vLLM's AOT directory)
    lacks and whose marker records this node's target, unpacked there; when there is none,
    why the model's other artifacts (other targets') were not used. Never raises: a store or
    artifact problem is one warning, and vLLM compiles."""
    result = Fetched()
    try:
        prefix = _Prefix(uri, key.model, store)  # the model's artifacts, every target's
        names = prefix.names()
    except Exception as exc:  # the store: vLLM compiles
        logger.warning("compile cache %s not read (%s); vLLM compiles", uri, _why(exc))
        return result
    markers = sorted(n for n in names if n.endswith(DONE) and n.count("/") == 1)
    mine = key.target_dir + "/"
    held = False
    for marker in (m for m in markers if m.startswith(mine)):
        digest = marker[len(mine) : -len(DONE)]
        dest = root / digest
        if dest.exists():
            held = True  # the node has it (vLLM's own directory is never touched)
            continue
        if not digest.isalnum():
            continue
        try:
            _unpack(prefix, key, mine + digest, dest)
            result.hashes.append(digest)
        except Exception as exc:
            why = str(exc) if isinstance(exc, _OtherTarget) else _why(exc)
            result.refused.append(f"{digest + TAR}: {why}")
            logger.warning(
                "compile cache artifact %s%s not used (%s); vLLM compiles",
                prefix.uri,
                mine + digest + TAR,
                why,
            )
    if not (result.hashes or result.refused or held):  # none for this target: what is there?
        result.refused = _other_targets(prefix, key, markers)
    if result.hashes:
        logger.info("compile cache: fetched %s from %s%s", result.hashes, prefix.uri, mine)
    elif result.why_not:
        logger.info("compile cache: nothing fetched from %s: %s", prefix.uri, result.why_not)
    return result


def _other_targets(prefix: _Prefix, key: CacheKey, markers: list[str], most: int = 3) -> list[str]:
    """Why the artifacts of other targets (at most ``most`` markers read) do not serve this
    node: ``artifact for CPU AVX512...; this node CPU AVX2...``."""
    reasons: list[str] = []
    for marker in [m for m in markers if not m.startswith(key.target_dir + "/")][:most]:
        try:
            why = compile_target.mismatch(prefix.get_json(marker).get("target"), key.target)
        except Exception as exc:
            logger.debug("compile cache marker %s not read (%s)", marker, _why(exc))
            continue
        if why is not None and why not in reasons:
            reasons.append(why)
    return reasons


def _unpack(prefix: _Prefix, key: CacheKey, name: str, dest: Path) -> None:
    want = prefix.get_json(name + DONE)
    other = compile_target.mismatch(want.get("target"), key.target)
    if other is not None:  # an artifact moved under this key, or of an earlier library
        raise _OtherTarget(other)
    size = getattr(prefix.listing.get(name + TAR), "size", None)
    if size != want.get("size"):
        raise ValueError(f"the tar's size is {size}, its marker says {want}")
    digest = dest.name
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{digest}.rsl-", dir=dest.parent))
    try:
        tar_path = staging / "artifact.tar"
        prefix.get(name + TAR, tar_path)
        if sha256_of(tar_path) != want.get("sha256"):
            raise ValueError("the tar's SHA-256 differs from its marker's")
        with tarfile.open(tar_path) as tar:
            tar.extractall(staging / "out", filter="data")
        unpacked = staging / "out" / digest
        if not unpacked.is_dir():
            raise ValueError(f"the tar holds no directory {digest!r}")
        try:
            os.rename(unpacked, dest)
        except OSError:
            if not dest.exists():  # another engine of the node unpacked it first: fine
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def ship(uri: str, key: CacheKey, artifact_dir: Path, store: ObjectStoreConfig | None) -> bool:
    """Upload ``artifact_dir`` (``torch_aot_compile/<hash>``, which this engine compiled)
    under ``<uri>/<key>/`` unless the store holds a complete one for that hash: the tar,
    then its marker, which records the key's target. Whether it was uploaded. Never
    raises."""
    name = f"{key.target_dir}/{artifact_dir.name}"
    try:
        prefix = _Prefix(uri, key.model, store)
        if name + DONE in prefix.names():
            return False  # a complete artifact is never replaced
        with tempfile.TemporaryDirectory(prefix="rsl-compile-") as tmp:
            tar_path = Path(tmp) / (artifact_dir.name + TAR)
            with tarfile.open(tar_path, "w") as tar:
                tar.add(artifact_dir, arcname=artifact_dir.name, filter=_skip_temporary)
            marker = {
                "size": tar_path.stat().st_size,
                "sha256": sha256_of(tar_path),
                "target": key.target,
            }
            marker_path = Path(tmp) / (artifact_dir.name + DONE)
            marker_path.write_text(json.dumps(marker, sort_keys=True))
            prefix.put(tar_path, name + TAR)
            prefix.put(marker_path, name + DONE)
    except Exception as exc:
        logger.warning("compile cache artifact %s not shipped to %s (%s)", name, uri, _why(exc))
        return False
    logger.info("compile cache: shipped %s (%d bytes) to %s", name, marker["size"], prefix.uri)
    return True


def _skip_temporary(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    """Leave out what another process is still writing (vLLM's ``*.tmp`` files) and locks."""
    name = os.path.basename(info.name)
    return None if name.endswith((".tmp", ".lock")) else info


def compiled_dirs(records: list[dict[str, Any]]) -> list[Path]:
    """The artifact directories (``torch_aot_compile/<hash>``) the engine's processes
    compiled and saved, from their compile records."""
    dirs = {
        Path(path).parent.parent
        for record in records
        if record.get("aot_saved")
        for path in record.get("artifacts") or ()
    }
    return sorted(d for d in dirs if d.is_dir())


def _why(exc: BaseException) -> str:
    if isinstance(exc, RayStreamLLMError):
        return redact(str(exc))
    return redact(f"{type(exc).__name__}: {exc}")
