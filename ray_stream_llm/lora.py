"""LoRA adapters from the model's store: the driver's checks of ``dynamic_lora_loading_path``
and the engines' fetch of one adapter, both through this library's store clients.

Ray Data LLM serves an adapter when a row's ``model`` column names a sub-folder of
``dynamic_lora_loading_path`` (``enable_lora`` in ``engine_kwargs``). Ray's own
downloader (``download_lora_adapter``) builds a plain boto3 client from the process
environment: it ignores the addressing style, the CA bundle's scope and the store budget
of ``ObjectStoreConfig``, and logs and skips an object it failed to read. A streamed
processor fetches adapters here instead, with the same settings as the model's metadata
(on the driver from the config; in an engine from the environment the job's runtime_env
and secrets gave it).

A leaf: no Ray, vLLM or torch import.
"""

from __future__ import annotations

import dataclasses
import json
import os
import posixpath
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ray_stream_llm import stores
from ray_stream_llm.errors import (
    AdapterBaseMismatchError,
    AdapterNotFoundError,
    InvalidAdapterError,
    InvalidModelURIError,
    InvalidSettingError,
    ModelNotFoundError,
)
from ray_stream_llm.stores.base import StoreDeadline
from ray_stream_llm.stores.settings import ObjectStoreConfig
from ray_stream_llm.uri import ModelURI, looks_like_uri, parse_model_uri

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")
LORA_SCHEMES = ("s3", "gs")  # what this library and Ray's batch stage both read
VLLM_DEFAULT_MAX_LORA_RANK = 16  # vLLM 0.29's LoRAConfig.max_lora_rank
# the values vLLM's LoRAConfig.max_lora_rank accepts (MaxLoRARanks, the same in 0.29 and 0.32)
VLLM_MAX_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


@dataclasses.dataclass(frozen=True)
class Adapter:
    """One adapter sub-folder, as the driver checked it."""

    name: str  # the sub-folder: what a row's ``model`` column names
    uri: str
    base_model: str  # its adapter_config.json's base_model_name_or_path
    rank: int | None


def check_lora_prefix(value: Any) -> ModelURI:
    """``dynamic_lora_loading_path`` parsed: an ``s3://`` or ``gs://`` prefix; an
    InvalidSettingError naming it otherwise."""
    where = "dynamic_lora_loading_path"
    schemes = ", ".join(f"{s}://" for s in LORA_SCHEMES)
    if not looks_like_uri(value):
        raise InvalidSettingError(
            f"{where} is {value!r}: give the store prefix that holds one sub-folder per "
            f"adapter, one of {schemes} (e.g. 's3://bucket/loras/'), reached with the "
            "model's object_store settings"
        )
    try:
        uri = parse_model_uri(value)
    except InvalidModelURIError as exc:
        raise InvalidSettingError(f"{where} is {value!r}: {exc}") from None
    if uri.scheme not in LORA_SCHEMES:
        raise InvalidSettingError(
            f"{where} is {value!r}: adapters are served from {schemes} only (Ray's engine "
            f"stage reads no {uri.scheme}:// adapter path); copy the adapter folders to an "
            f"{' or '.join(f'{s}://' for s in LORA_SCHEMES)} prefix and give that prefix"
        )
    return uri


def model_names(model_uri: ModelURI, metadata_dir: str | os.PathLike[str] | None) -> set[str]:
    """What an adapter may record as its base for the model at ``model_uri``
    (see :func:`base_matches`)."""
    names = {str(model_uri).rstrip("/")}
    if metadata_dir is not None:
        try:
            config = json.loads((Path(metadata_dir) / "config.json").read_text())
        except (OSError, ValueError):
            config = {}
        recorded = config.get("_name_or_path") if isinstance(config, dict) else None
        if isinstance(recorded, str) and recorded.strip():
            names.add(recorded.strip().rstrip("/"))
    return names


def base_matches(base: str, model_uri: ModelURI, names: set[str]) -> bool:
    """Whether an adapter whose ``base_model_name_or_path`` is ``base`` was made for the
    model at ``model_uri``. What "matches" means, and what it does not prove:

    - ``base`` is the model's URI (``s3://b/m`` and ``s3://b/m/`` are the same);
    - or ``base`` equals the ``_name_or_path`` recorded in the model's ``config.json``;
    - or ``base`` is a name (a Hub id such as ``meta-llama/Llama-3.1-8B``, or a path) whose
      last segment equals the last segment of the model's prefix, case-insensitively
      (``s3://b/hub/meta-llama/Llama-3.1-8B/``): the usual copy of a Hub model into a store.

    It compares names, not weights: a renamed copy of the right model is refused (record
    its URI in the adapter's config), and a different model that kept the name passes
    (vLLM then refuses tensors whose shapes do not fit, when the adapter is first used).
    """
    text = base.strip().rstrip("/")
    if not text:
        return False
    if looks_like_uri(text):
        try:
            return parse_model_uri(text) == model_uri
        except InvalidModelURIError:
            return False
    if text in names:
        return True
    last = posixpath.basename(model_uri.prefix.rstrip("/"))
    return bool(last) and posixpath.basename(text).lower() == last.lower()


def check_adapters(
    lora_path: str,
    model_uri: ModelURI,
    *,
    engine_kwargs: Mapping[str, Any],
    object_store: ObjectStoreConfig | None,
    metadata_dir: str | os.PathLike[str] | None = None,
) -> list[Adapter]:
    """The driver's checks of ``dynamic_lora_loading_path``, before any actor starts:
    ``enable_lora`` is on; the prefix holds adapter sub-folders; each has
    ``adapter_config.json`` (valid JSON), an ``adapter_model.*`` weight file, a rank the
    engine accepts (``max_lora_rank``), and a base model that :func:`base_matches` the model.
    Typed errors name the value and the fix."""
    if not engine_kwargs.get("enable_lora"):
        state = (
            f"is {engine_kwargs['enable_lora']!r}"
            if "enable_lora" in engine_kwargs
            else "is not set"
        )
        raise InvalidSettingError(
            f"dynamic_lora_loading_path is {lora_path!r} but engine_kwargs['enable_lora'] {state}: "
            "vLLM would refuse every adapter row; set engine_kwargs={'enable_lora': True, ...}"
        )
    prefix = check_lora_prefix(lora_path)
    deadline = StoreDeadline(object_store.timeout_s if object_store is not None else None)
    try:
        client, listing = stores.list_model(prefix, object_store, deadline)
    except ModelNotFoundError:
        raise AdapterNotFoundError(
            f"dynamic_lora_loading_path {lora_path!r} holds no objects; check the prefix (it is "
            "case-sensitive) and that the adapters sit in sub-folders of it, "
            "<prefix>/<adapter-name>/adapter_config.json"
        ) from None
    paths = {obj.path for obj in listing}
    if ADAPTER_CONFIG in paths:
        raise AdapterNotFoundError(
            f"dynamic_lora_loading_path {lora_path!r} is one adapter (it holds {ADAPTER_CONFIG}"
            "), not a folder of adapters; give its parent prefix and name the sub-folder in "
            "each row's 'model' column"
        )
    folders = sorted({p.split("/", 1)[0] for p in paths if "/" in p})
    if not folders:
        raise AdapterNotFoundError(
            f"dynamic_lora_loading_path {lora_path!r} has no sub-folders (found "
            f"{sorted(paths)[:5]}); put each adapter in <prefix>/<adapter-name>/"
        )
    names = model_names(model_uri, metadata_dir)
    max_rank = int(engine_kwargs.get("max_lora_rank") or VLLM_DEFAULT_MAX_LORA_RANK)
    rank_source = "" if engine_kwargs.get("max_lora_rank") else " (vLLM's default)"
    adapters = []
    for name in folders:
        where = f"{prefix}{name}/"
        if f"{name}/{ADAPTER_CONFIG}" not in paths:
            raise InvalidAdapterError(
                f"adapter {where!r} has no {ADAPTER_CONFIG} (found "
                f"{sorted(p for p in paths if p.startswith(name + '/'))[:5]}); upload the "
                "adapter folder PEFT saved, or move the non-adapter folder out of "
                f"{lora_path!r}"
            )
        if not any(f"{name}/{w}" in paths for w in ADAPTER_WEIGHTS):
            raise InvalidAdapterError(
                f"adapter {where!r} has no weights ({' or '.join(ADAPTER_WEIGHTS)}); upload "
                "the adapter folder PEFT saved"
            )
        raw = stores.read(client, prefix, f"{name}/{ADAPTER_CONFIG}", deadline)
        try:
            config = json.loads(raw)
        except ValueError as exc:
            raise InvalidAdapterError(
                f"{where}{ADAPTER_CONFIG} is not valid JSON ({exc}); re-save the adapter"
            ) from None
        if not isinstance(config, dict):
            raise InvalidAdapterError(
                f"{where}{ADAPTER_CONFIG} holds {type(config).__name__}, not an object; "
                "re-save the adapter"
            )
        base = config.get("base_model_name_or_path")
        if not isinstance(base, str) or not base_matches(base, model_uri, names):
            raise AdapterBaseMismatchError(
                f"adapter {where!r} was made for base model {base!r}, not {str(model_uri)!r}; "
                "serve it with that model, or, if it is the same model under another name, "
                f"set base_model_name_or_path in its {ADAPTER_CONFIG} to {str(model_uri)!r}"
            )
        rank = config.get("r")
        if isinstance(rank, int) and not isinstance(rank, bool) and rank > max_rank:
            fits = [v for v in VLLM_MAX_LORA_RANKS if v >= rank]
            fix = (
                f"set engine_kwargs['max_lora_rank'] to {fits[0]} (vLLM accepts "
                f"{', '.join(map(str, VLLM_MAX_LORA_RANKS))})"
                if fits
                else f"vLLM accepts max_lora_rank up to {VLLM_MAX_LORA_RANKS[-1]}: serve an "
                "adapter trained with a lower r"
            )
            raise InvalidAdapterError(
                f"adapter {where!r} has rank r={rank}, above the engine's max_lora_rank "
                f"{max_rank}{rank_source}; {fix}"
            )
        adapters.append(Adapter(name, where, base, rank if isinstance(rank, int) else None))
    return adapters


def fetch_adapter(
    lora_path: str,
    name: str,
    dest_root: str | os.PathLike[str],
    *,
    object_store: ObjectStoreConfig | None = None,
) -> Path:
    """Every object of the adapter ``<lora_path>/<name>/`` written under ``dest_root``;
    the local directory (vLLM's ``lora_path``). In an actor ``object_store`` is None: its
    settings arrived in the environment. Each file is written to a temporary name and then
    renamed, so a directory that exists is complete."""
    prefix = check_lora_prefix(lora_path)
    if not name or "/" in name or name in (".", ".."):
        raise AdapterNotFoundError(
            f"row names adapter {name!r}, which is not a sub-folder name of {lora_path!r}; "
            "put the adapter's folder name in the row's 'model' column"
        )
    uri = ModelURI(prefix.scheme, prefix.bucket, f"{prefix.prefix}{name}/")
    dest = Path(dest_root) / name
    if (dest / ADAPTER_CONFIG).is_file():
        return dest
    deadline = StoreDeadline(object_store.timeout_s if object_store is not None else None)
    try:
        client, listing = stores.list_model(uri, object_store, deadline)
    except ModelNotFoundError:
        raise AdapterNotFoundError(
            f"row names adapter {name!r}, but {str(uri)!r} holds no objects; the adapters "
            f"under {lora_path!r} are its sub-folders"
        ) from None
    staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=dest_root))
    for obj in listing:
        target = staging / uri.safe_relative(obj.path)
        target.parent.mkdir(parents=True, exist_ok=True)
        stores.download(client, uri, obj, str(target), deadline)
    os.replace(staging, dest)
    return dest
