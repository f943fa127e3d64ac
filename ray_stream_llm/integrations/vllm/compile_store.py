"""vLLM's compile cache shipped through the store (``compile_cache_uri``): an engine on a
fresh node loads the code another node compiled instead of compiling again.

Layout under ``compile_cache_uri`` (an ``s3://``, ``gs://`` or ``az://`` prefix, reached
with the job's store settings, through the store backends' ``write``)::

    <key>/<hash>.tar    vLLM's artifact directory torch_aot_compile/<hash>/, as a tar
    <key>/<hash>.done   {"size", "sha256"} of the tar, written last

``<key>`` (:func:`cache_key`) names what the compiled code depends on besides vLLM's own
key: the model's metadata as fetched (config, tokenizer...: its names, sizes and CRC32s),
the vLLM and torch versions and the device kind. ``<hash>`` is vLLM's own key
(``aot_compile_hash_factors``, made location-free by
:mod:`~ray_stream_llm.integrations.vllm.compile_cache`), so an artifact is only ever loaded by
an engine whose config vLLM would have keyed alike.

Before vLLM starts, the engine actor fetches every complete artifact of its key that the
node does not hold (:func:`fetch`): the tar is checked against its marker, unpacked
(``tarfile``'s ``data`` filter: no path leaves the directory) into a staging directory and
renamed into place; a directory already there (vLLM's own) is never touched. Once the
engine is ready, an engine that compiled ships its artifact (:func:`ship`) unless the
store has one for that hash already: the tar first, the marker last, so a reader never sees
half an artifact and a good artifact is never replaced. Nothing here fails an engine: a
damaged, incompatible or missing artifact gets one warning naming it, and vLLM compiles.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tarfile
import tempfile
from pathlib import Path
from typing import Any

from ray_stream_llm.errors import RayStreamLLMError
from ray_stream_llm.stores.base import Client, ObjectInfo, StoreDeadline
from ray_stream_llm.stores.settings import ObjectStoreConfig
from ray_stream_llm.uri import ModelURI, parse_model_uri

logger = logging.getLogger(__name__)

AOT_SUBDIR = os.path.join("torch_compile_cache", "torch_aot_compile")
TAR, DONE = ".tar", ".done"


def cache_key(metadata_dir: str) -> str | None:
    """What the compiled code depends on besides vLLM's own key, for one engine: the model's
    fetched metadata, vLLM's and torch's versions, the device kind. None when the model's
    metadata was not fetched by this library (nothing to key it by)."""
    import torch
    import vllm

    from ray_stream_llm.integrations.vllm.compile_cache import metadata_identity

    identity = metadata_identity(metadata_dir)
    if identity is None:
        return None
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    parts = [identity, f"vllm {vllm.__version__}", f"torch {torch.__version__}", device]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:32]


def aot_root() -> Path:
    """Where vLLM keeps its AOT artifacts on this node (``$VLLM_CACHE_ROOT``)."""
    from vllm import envs

    return Path(envs.VLLM_CACHE_ROOT) / AOT_SUBDIR


class _Prefix:
    """``<compile_cache_uri>/<key>/`` through its scheme's store backend."""

    def __init__(self, uri: str, key: str, store: ObjectStoreConfig | None):
        from ray_stream_llm import stores

        self.uri: ModelURI = parse_model_uri(uri.rstrip("/") + f"/{key}/")
        self.deadline = StoreDeadline(store.timeout_s if store is not None else None)
        self.backend = stores.backend(self.uri.scheme)
        self.client: Client = self.backend.make_client(store, self.deadline)
        self.listing: dict[str, ObjectInfo] = {}

    def names(self) -> dict[str, int]:
        objects = self.deadline.call(
            f"listing {str(self.uri)!r}",
            lambda: list(self.backend.list_objects(self.client, self.uri)),
        )
        self.listing = {o.path: o for o in objects}
        return {o.path: o.size for o in objects}

    def get(self, name: str, dest: Path) -> None:
        from ray_stream_llm import stores

        stores.download(self.client, self.uri, self.listing[name], str(dest), self.deadline)

    def get_json(self, name: str) -> dict[str, Any]:
        from ray_stream_llm import stores

        return dict(json.loads(stores.read(self.client, self.uri, name, self.deadline)))

    def put(self, local: Path, name: str) -> None:
        where = f"writing {name!r} under {str(self.uri)!r}"
        self.deadline.call(where, self.backend.write, self.client, self.uri, name, str(local))

    def put_json(self, name: str, value: dict[str, Any]) -> None:
        with tempfile.TemporaryDirectory(prefix="rsl-compile-") as tmp:
            local = Path(tmp) / name
            local.write_text(json.dumps(value, sort_keys=True))
            self.put(local, name)


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def fetch(uri: str, key: str, root: Path, store: ObjectStoreConfig | None) -> list[str]:
    """Every complete artifact under ``<uri>/<key>/`` that ``root`` (vLLM's AOT directory)
    lacks, unpacked there; the hashes fetched. Never raises: a store or artifact problem
    is one warning, and vLLM compiles."""
    fetched: list[str] = []
    try:
        prefix = _Prefix(uri, key, store)
        names = prefix.names()
    except Exception as exc:  # the store: vLLM compiles
        logger.warning("compile cache %s not read (%s); vLLM compiles", uri, _why(exc))
        return fetched
    for marker in sorted(n for n in names if n.endswith(DONE) and "/" not in n):
        digest = marker[: -len(DONE)]
        target = root / digest
        if target.exists() or not digest.isalnum():
            continue  # the node has it (vLLM's own directory is never touched)
        try:
            _unpack(prefix, digest, names, target)
            fetched.append(digest)
        except Exception as exc:
            logger.warning(
                "compile cache artifact %s%s not used (%s); vLLM compiles",
                prefix.uri,
                digest + TAR,
                _why(exc),
            )
    if fetched:
        logger.info("compile cache: fetched %s from %s", fetched, prefix.uri)
    return fetched


def _unpack(prefix: _Prefix, digest: str, names: dict[str, int], target: Path) -> None:
    want = prefix.get_json(digest + DONE)
    if names.get(digest + TAR) != want.get("size"):
        raise ValueError(f"the tar's size is {names.get(digest + TAR)}, its marker says {want}")
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{digest}.rsl-", dir=target.parent))
    try:
        tar_path = staging / "artifact.tar"
        prefix.get(digest + TAR, tar_path)
        if _sha256(tar_path) != want.get("sha256"):
            raise ValueError("the tar's SHA-256 differs from its marker's")
        with tarfile.open(tar_path) as tar:
            tar.extractall(staging / "out", filter="data")
        unpacked = staging / "out" / digest
        if not unpacked.is_dir():
            raise ValueError(f"the tar holds no directory {digest!r}")
        try:
            os.rename(unpacked, target)
        except OSError:
            if not target.exists():  # another engine of the node unpacked it first: fine
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def ship(uri: str, key: str, artifact_dir: Path, store: ObjectStoreConfig | None) -> bool:
    """Upload ``artifact_dir`` (``torch_aot_compile/<hash>``, which this engine compiled)
    under ``<uri>/<key>/`` unless the store holds a complete one for that hash: the tar,
    then its marker. Whether it was uploaded. Never raises."""
    digest = artifact_dir.name
    try:
        prefix = _Prefix(uri, key, store)
        if digest + DONE in prefix.names():
            return False  # a complete artifact is never replaced
        with tempfile.TemporaryDirectory(prefix="rsl-compile-") as tmp:
            tar_path = Path(tmp) / (digest + TAR)
            with tarfile.open(tar_path, "w") as tar:
                tar.add(artifact_dir, arcname=digest, filter=_skip_temporary)
            marker = {"size": tar_path.stat().st_size, "sha256": _sha256(tar_path)}
            prefix.put(tar_path, digest + TAR)
            prefix.put_json(digest + DONE, marker)
    except Exception as exc:
        logger.warning("compile cache artifact %s not shipped to %s (%s)", digest, uri, _why(exc))
        return False
    logger.info("compile cache: shipped %s (%d bytes) to %s", digest, marker["size"], prefix.uri)
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
    from ray_stream_llm.redact import redact

    if isinstance(exc, RayStreamLLMError):
        return redact(str(exc))
    return redact(f"{type(exc).__name__}: {exc}")
