"""``inspect_model``: what a model directory in object storage holds, and whether it streams.

One listing, each object classified (:mod:`ray_stream_llm.patterns`), the
safetensors index checked against the shards present, and every shard's header
read with two ranged GETs (the 8-byte length, then the JSON header) to check it
is well formed and that the object is as long as the header says. Weights are
never downloaded.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import re
import struct
from typing import Any

from ray_stream_llm import _backends
from ray_stream_llm.errors import ModelNotFoundError, NotStreamableError, UnsafeObjectKeyError
from ray_stream_llm.patterns import SAFETENSORS_INDEX, FileRole, classify
from ray_stream_llm.store import ObjectStoreConfig
from ray_stream_llm.uri import ModelURI, parse_model_uri

MAX_HEADER_BYTES = 100 * 1024 * 1024  # safetensors' own limit
_SHARDED_RE = re.compile(r"^model-rank-(\d+)-part-(\d+)\.safetensors$")  # vLLM sharded_state
_CONVERT_HINT = (
    "convert it once to safetensors, e.g. `AutoModelForCausalLM.from_pretrained(dir)"
    ".save_pretrained(dir, safe_serialization=True)` with transformers, and upload the "
    "*.safetensors files (and model.safetensors.index.json) next to config.json"
)


@dataclasses.dataclass(frozen=True)
class ModelFile:
    path: str  # relative to the model directory
    size: int
    role: FileRole


@dataclasses.dataclass(frozen=True)
class ModelManifest:
    """The objects of a model directory, classified, and whether the streamer can load it."""

    uri: str
    files: tuple[ModelFile, ...]
    problems: tuple[str, ...]  # each names the object and the fix; empty: streamable
    tensors: int  # tensors listed by the shards' headers

    @property
    def streamable(self) -> bool:
        return not self.problems

    def paths(self, role: FileRole) -> list[str]:
        return [f.path for f in self.files if f.role is role]

    def bytes(self, role: FileRole) -> int:
        return sum(f.size for f in self.files if f.role is role)

    @property
    def weight_bytes(self) -> int:
        """Bytes the engines will stream (the safetensors shards)."""
        return self.bytes(FileRole.STREAMABLE_WEIGHTS)

    def to_dict(self) -> dict[str, Any]:
        return {
            "uri": self.uri,
            "streamable": self.streamable,
            "problems": list(self.problems),
            "tensors": self.tensors,
            "weight_bytes": self.weight_bytes,
            "files": [dataclasses.asdict(f) | {"role": f.role.value} for f in self.files],
        }

    def raise_if_not_streamable(self) -> None:
        if self.problems:
            raise NotStreamableError(
                f"{self.uri!r} cannot be streamed: " + "; ".join(self.problems)
            )


def inspect_model(
    uri: str,
    *,
    object_store: ObjectStoreConfig | None = None,
    tensor_parallel_size: int | None = None,
    check_headers: bool = True,
) -> ModelManifest:
    """List and check the model at ``uri`` without downloading any weight.

    Raises the typed store errors (missing bucket or prefix, access denied,
    unreachable endpoint). Problems of the model itself are collected in
    ``ModelManifest.problems``; :meth:`ModelManifest.raise_if_not_streamable`
    raises them as one :class:`NotStreamableError`. With ``tensor_parallel_size``,
    pre-sharded checkpoints (``runai_streamer_sharded``) are checked to hold one
    set of files per rank.
    """
    model = parse_model_uri(uri)
    client, listing = _backends.list_model(model, object_store)
    for obj in listing:
        if obj.path.startswith("/") or ".." in obj.path.split("/"):
            raise UnsafeObjectKeyError(
                f"object key {obj.key!r} under {str(model)!r} would resolve outside the model "
                "directory; rename or delete that object in the store"
            )
    files = tuple(ModelFile(o.path, o.size, classify(o.path)) for o in listing)
    problems: list[str] = []
    names = {f.path for f in files}
    if "config.json" not in names:
        raise ModelNotFoundError(
            f"{str(model)!r} has no config.json; point the URI at the model directory itself "
            "(the folder that holds config.json)"
        )
    shards = [f for f in files if f.role is FileRole.STREAMABLE_WEIGHTS]
    others = [f for f in files if f.role is FileRole.OTHER_WEIGHTS]
    if not shards:
        kinds = sorted({f.path.rsplit(".", 1)[-1] for f in others})
        problems.append(
            f"no *.safetensors weights (found {', '.join('*.' + k for k in kinds)}); {_CONVERT_HINT}"
            if others
            else f"no weight files at all; {_CONVERT_HINT}"
        )
    if SAFETENSORS_INDEX in names:
        problems.extend(_check_index(client, model, {f.path for f in shards}))
    if tensor_parallel_size is not None:
        problems.extend(_check_ranks(shards, tensor_parallel_size))
    tensors = 0
    if check_headers and shards:
        with concurrent.futures.ThreadPoolExecutor(min(8, len(shards))) as pool:
            for count, problem in pool.map(lambda f: _check_header(client, model, f), shards):
                tensors += count
                if problem:
                    problems.append(problem)
    return ModelManifest(uri=str(model), files=files, problems=tuple(problems), tensors=tensors)


def _check_index(client: Any, model: ModelURI, shards: set[str]) -> list[str]:
    try:
        index = json.loads(_backends.read(client, model, SAFETENSORS_INDEX))
        named = set(index["weight_map"].values())
    except (ValueError, KeyError, TypeError, AttributeError):
        return [f"{SAFETENSORS_INDEX} is not a valid index (no 'weight_map'); re-save the model"]
    missing = sorted(named - shards)
    if missing:
        return [
            f"{SAFETENSORS_INDEX} names shard(s) missing from the store: {', '.join(missing)}; "
            "upload them or re-save the model"
        ]
    return []


def _check_ranks(shards: list[ModelFile], tp: int) -> list[str]:
    ranks = {int(m.group(1)) for f in shards if (m := _SHARDED_RE.match(f.path))}
    if not ranks:
        return [
            "runai_streamer_sharded needs pre-sharded files named "
            "model-rank-<rank>-part-<part>.safetensors (saved with vLLM's save_sharded_state); "
            "none found; use load_format='runai_streamer' for a plain checkpoint"
        ]
    if ranks != set(range(tp)):
        return [
            f"the pre-sharded files are for ranks {sorted(ranks)}, but tensor_parallel_size is "
            f"{tp}; save the shards again with tensor_parallel_size={tp} or set "
            f"tensor_parallel_size={len(ranks)}"
        ]
    return []


def _check_header(client: Any, model: ModelURI, shard: ModelFile) -> tuple[int, str | None]:
    """(tensor count, problem) for one shard, from two ranged GETs."""
    name = shard.path
    if shard.size < 8:
        return 0, f"{name} is {shard.size} bytes, too short to be safetensors; upload it again"
    (length,) = struct.unpack("<Q", _backends.read(client, model, name, 0, 7))
    if length == 0 or length > MAX_HEADER_BYTES or 8 + length > shard.size:
        return 0, (
            f"{name} has a header length of {length} bytes, impossible for a {shard.size}-byte "
            "object: it is truncated or not safetensors; upload it again"
        )
    try:
        header = json.loads(_backends.read(client, model, name, 8, 7 + length))
        spans = [v["data_offsets"] for k, v in header.items() if k != "__metadata__"]
        data_end = max((int(end) for _, end in spans), default=0)
    except (ValueError, KeyError, TypeError, AttributeError):
        return 0, f"{name}: the safetensors header is not valid JSON; upload it again"
    if 8 + length + data_end != shard.size:
        return len(spans), (
            f"{name} is {shard.size} bytes but its header describes {8 + length + data_end}: "
            "the object is truncated or corrupt; upload it again"
        )
    return len(spans), None
