"""``inspect_model``: what a model directory in object storage holds, and whether it streams.

One listing, each object classified (:mod:`ray_stream_llm.patterns`); the JSON
files the engines and tokenizers will parse (``config.json``, the safetensors
index, ``tokenizer_config.json``, ``generation_config.json``) read and checked
the way they will be used; the index checked against the shards present; and
every shard's header read with two ranged GETs (the 8-byte length, then the JSON
header) to check it is well formed and that the object is as long as the header
says. Weights are never downloaded. Every store call is bounded by one
:class:`~ray_stream_llm.stores.base.StoreDeadline` (``ObjectStoreConfig.timeout_s``).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import re
import struct
from pathlib import Path
from typing import Any

from ray_stream_llm import stores
from ray_stream_llm.errors import (
    IncompleteShardedCheckpointError,
    NotStreamableError,
    TensorParallelMismatchError,
)
from ray_stream_llm.patterns import (
    CHECKED_METADATA,
    SAFETENSORS_INDEX,
    SHARD_PATTERN,
    FileRole,
    classify,
    require_metadata,
    shard_file_regex,
)
from ray_stream_llm.stores import StoreDeadline
from ray_stream_llm.stores.base import Client
from ray_stream_llm.stores.settings import ObjectStoreConfig
from ray_stream_llm.uri import ModelURI, is_safe_relative, parse_model_uri

MAX_HEADER_BYTES = 100 * 1024 * 1024  # safetensors' own limit
MAX_METADATA_JSON_BYTES = 16 * 1024 * 1024  # config, index, tokenizer and generation configs
# The markers of ``ray-stream-llm shard`` (ray_stream_llm.commands.shard) at the root of its
# output: the partial one written first, the completion one last (then the partial one is
# deleted). Neither is metadata nor a weight: no fetch brings them to local disk.
SHARD_PARTIAL_MARKER = "ray-stream-llm-shard.partial"
SHARD_DONE_MARKER = "ray-stream-llm-shard.done"
MAX_SHARD_MARKER_BYTES = 16 * 1024 * 1024
_CONVERT_HINT = (
    "convert it once to safetensors, e.g. `AutoModelForCausalLM.from_pretrained(dir)"
    ".save_pretrained(dir, safe_serialization=True)` with transformers, and upload the "
    "*.safetensors files (and model.safetensors.index.json) next to config.json"
)


@dataclasses.dataclass(frozen=True)
class ModelFile:
    """One object of the model directory and its role."""

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
    ranks: tuple[int, ...] = ()  # ranks of the pre-sharded files (checked with a TP size)
    rank_mismatch: bool = False  # the pre-sharded files do not fit tensor_parallel_size

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
            "ranks": list(self.ranks),
            "files": [dataclasses.asdict(f) | {"role": f.role.value} for f in self.files],
        }

    def raise_if_not_streamable(self) -> None:
        if self.problems:
            cls = TensorParallelMismatchError if self.rank_mismatch else NotStreamableError
            raise cls(f"{self.uri!r} cannot be streamed: " + "; ".join(self.problems))


def inspect_model(
    uri: str,
    *,
    object_store: ObjectStoreConfig | None = None,
    tensor_parallel_size: int | None = None,
    shard_pattern: str | None = None,
    check_headers: bool = True,
    metadata_dir: str | os.PathLike[str] | None = None,
) -> ModelManifest:
    """List and check the model at ``uri`` without downloading any weight.

    Raises the typed store errors (missing bucket or prefix, access denied,
    unreachable endpoint). Problems of the model itself are collected in
    ``ModelManifest.problems``; :meth:`ModelManifest.raise_if_not_streamable`
    raises them as one :class:`NotStreamableError`. With ``tensor_parallel_size``,
    pre-sharded checkpoints (``runai_streamer_sharded``) are checked to hold one
    set of files per rank (:class:`TensorParallelMismatchError` when raised), named by
    ``shard_pattern`` (the engines' ``model_loader_extra_config["pattern"]``; vLLM's
    ``model-rank-{rank}-part-{part}.safetensors`` by default). An output
    of ``ray-stream-llm shard`` that the writer did not finish (its partial marker without
    the completion marker, or a file the completion marker lists missing or of another
    size) raises :class:`IncompleteShardedCheckpointError` at once. With ``metadata_dir``
    (a :func:`fetch_model_metadata` directory of the same model) the JSON files are
    parsed from there, not read again.

    >>> inspect_model("s3://models/SmolLM2-135M-Instruct/").weight_bytes  # doctest: +SKIP
    269060552
    """
    model = parse_model_uri(uri)
    deadline = StoreDeadline(object_store.timeout_s if object_store is not None else None)
    client, listing = stores.list_model(model, object_store, deadline)
    for obj in listing:
        model.safe_relative(obj.path)
    files = tuple(ModelFile(o.path, o.size, classify(o.path)) for o in listing)
    problems: list[str] = []
    names = {f.path: f for f in files}
    _check_shard_markers(client, model, names, deadline)
    require_metadata(str(model), names)
    reader = _Reader(client, model, deadline, Path(metadata_dir) if metadata_dir else None)
    for name, check in CHECKED_METADATA.items():
        if name in names:
            problems.extend(_check_json(reader, names[name], check))
    shards = [f for f in files if f.role is FileRole.STREAMABLE_WEIGHTS]
    others = [f for f in files if f.role is FileRole.OTHER_WEIGHTS]
    nested = [f.path for f in others if f.path.endswith(".safetensors")]
    if not shards and nested:
        shown = ", ".join(repr(p) for p in nested[:5]) + (" ..." if len(nested) > 5 else "")
        problems.append(
            f"no *.safetensors weights next to config.json: only in sub-folders ({shown}), "
            "which vLLM does not load (it lists the model directory's top level); upload "
            "the weights next to config.json, or point the URI at the folder that holds them"
        )
    elif not shards:
        kinds = sorted({f.path.rsplit(".", 1)[-1] for f in others})
        problems.append(
            f"no *.safetensors weights (found {', '.join('*.' + k for k in kinds)}); "
            f"{_CONVERT_HINT}"
            if others
            else f"no weight files at all; {_CONVERT_HINT}"
        )
    if SAFETENSORS_INDEX in names:
        problems.extend(_check_index(reader, names[SAFETENSORS_INDEX], {f.path for f in shards}))
    ranks: tuple[int, ...] = ()
    mismatch = False
    if tensor_parallel_size is not None:
        named = shard_file_regex(shard_pattern)
        parts = _rank_parts(shards, named)
        ranks = tuple(sorted(parts))
        mismatch = bool(ranks) and set(ranks) != set(range(tensor_parallel_size))
        problems.extend(_check_ranks(parts, tensor_parallel_size, shard_pattern))
        problems.extend(_unlisted_rank_files(files, named))
    tensors = 0
    if check_headers and shards:
        with concurrent.futures.ThreadPoolExecutor(min(8, len(shards))) as pool:
            for count, problem in pool.map(
                lambda f: _check_header(client, model, f, deadline), shards
            ):
                tensors += count
                if problem:
                    problems.append(problem)
    return ModelManifest(
        uri=str(model),
        files=files,
        problems=tuple(problems),
        tensors=tensors,
        ranks=ranks,
        rank_mismatch=mismatch,
    )


def read_shard_marker(
    client: Client, model: ModelURI, file: ModelFile | Any, deadline: StoreDeadline
) -> dict[str, Any]:
    """The JSON object of a ``ray-stream-llm shard`` marker; IncompleteShardedCheckpointError
    when it is too large or not such an object (a marker cut or replaced by hand)."""
    problem = None
    if file.size > MAX_SHARD_MARKER_BYTES:
        problem = f"is {file.size} bytes, more than a marker has"
    else:
        try:
            value = _loads(stores.read(client, model, file.path, deadline))
        except (ValueError, UnicodeDecodeError) as exc:
            problem = f"is not valid JSON ({exc})"
        else:
            if isinstance(value, dict) and isinstance(value.get("files", []), list):
                return value
            problem = "is not a marker object"
    raise IncompleteShardedCheckpointError(
        f"{str(model)!r}: the shard marker {file.path} {problem}; run `ray-stream-llm shard` "
        f"with --output {model!s} again to rewrite the checkpoint"
    )


def _check_shard_markers(
    client: Client, model: ModelURI, names: dict[str, ModelFile], deadline: StoreDeadline
) -> None:
    """Refuse an output of ``ray-stream-llm shard`` that its writer did not finish."""
    resume = (
        f"run the same `ray-stream-llm shard SOURCE --tensor-parallel-size N --output "
        f"{model!s}` again to resume it (or delete the prefix)"
    )
    if SHARD_DONE_MARKER not in names:
        if SHARD_PARTIAL_MARKER in names:
            raise IncompleteShardedCheckpointError(
                f"{str(model)!r} is a partial output of `ray-stream-llm shard`: "
                f"{SHARD_PARTIAL_MARKER} is there and {SHARD_DONE_MARKER} is not, so the writer "
                f"stopped before it finished; {resume}"
            )
        return
    marker = read_shard_marker(client, model, names[SHARD_DONE_MARKER], deadline)
    bad = []
    for entry in marker.get("files", []):
        path, size = str(entry.get("path")), entry.get("size")
        found = names.get(path)
        if found is None:
            bad.append(f"{path} (missing)")
        elif found.size != size:
            bad.append(f"{path} ({found.size} bytes, the marker says {size})")
    if bad:
        raise IncompleteShardedCheckpointError(
            f"{str(model)!r}: {len(bad)} object(s) that {SHARD_DONE_MARKER} lists are not as "
            f"written: {', '.join(bad[:5])}; {resume}"
        )


def _loads(raw: bytes) -> Any:
    """``json.loads`` whose every failure is a ValueError (deep nesting included)."""
    try:
        return json.loads(raw)
    except RecursionError:
        raise ValueError("nested too deeply") from None


@dataclasses.dataclass(frozen=True)
class _Reader:
    """Reads the model's small files: from ``local`` when it holds a copy of the same size
    (a metadata fetch of this model), else from the store, within ``deadline``."""

    client: Client
    model: ModelURI
    deadline: StoreDeadline
    local: Path | None = None

    def json(self, file: ModelFile) -> tuple[bytes | None, str | None]:
        """(raw bytes, problem) for a small JSON file of the model directory."""
        if file.size > MAX_METADATA_JSON_BYTES:
            return None, (
                f"{file.path} is {file.size} bytes, more than the {MAX_METADATA_JSON_BYTES} a "
                "metadata file may have; upload the right file"
            )
        copy = self.local / file.path if self.local else None
        if copy is not None and copy.is_file() and copy.stat().st_size == file.size:
            return copy.read_bytes(), None
        return stores.read(self.client, self.model, file.path, self.deadline), None


def json_problem(name: str, raw: bytes, check: str) -> str | None:
    """What the engines and tokenizers would fail on when they parse ``raw`` as ``name``:
    ``check`` is ``"object"`` (a JSON object) or ``"model"`` (an object naming the model).

    >>> json_problem("config.json", b'{"model_type": "llama"}', "model") is None
    True
    >>> json_problem("config.json", b"[]", "model")
    'config.json holds a JSON list, not an object; upload a valid config.json (re-save the model)'
    """
    try:
        value = _loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        what = "is empty" if not raw.strip() else f"is not valid JSON ({exc})"
        return f"{name} {what}; upload a valid {name} (re-save the model)"
    if not isinstance(value, dict):
        return (
            f"{name} holds a JSON {type(value).__name__}, not an object; upload a "
            f"valid {name} (re-save the model)"
        )
    if check == "model" and not (
        isinstance(value.get("model_type"), str) or isinstance(value.get("architectures"), list)
    ):
        return (
            f"{name} has neither 'model_type' nor 'architectures', so transformers "
            "cannot tell which model it is; upload the model's own config.json"
        )
    return None


def _check_json(reader: _Reader, file: ModelFile, check: str) -> list[str]:
    raw, problem = reader.json(file)
    if raw is not None:
        problem = json_problem(file.path, raw, check)
    return [problem] if problem else []


def index_problems(raw: bytes, shards: set[str]) -> list[str]:
    """What is wrong with a safetensors index ``raw`` given the shards in the store: it
    must map tensor names to safe relative names of safetensors shards, each present."""
    problem = json_problem(SAFETENSORS_INDEX, raw, "object")
    if problem:
        return [problem]
    index = _loads(raw)
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        return [
            f"{SAFETENSORS_INDEX} is not a valid index (no 'weight_map' object); re-save the model"
        ]
    bad = sorted({type(v).__name__ for v in weight_map.values() if not isinstance(v, str)})
    if bad:
        return [
            f"{SAFETENSORS_INDEX} maps tensors to values that are not file names "
            f"({', '.join(bad)}); re-save the model"
        ]
    named = {str(v) for v in weight_map.values()}
    problems = []
    unsafe = sorted(n for n in named if not is_safe_relative(n))
    if unsafe:
        problems.append(
            f"{SAFETENSORS_INDEX} names file(s) outside the model directory "
            f"({', '.join(repr(n) for n in unsafe[:5])}); re-save the model"
        )
    safe = named - set(unsafe)
    other = sorted(n for n in safe if classify(n) is not FileRole.STREAMABLE_WEIGHTS)
    if other:
        problems.append(
            f"{SAFETENSORS_INDEX} names non-safetensors file(s) {', '.join(other[:5])}; the "
            f"streamer reads only *.safetensors: {_CONVERT_HINT}"
        )
    missing = sorted(n for n in safe - set(other) if n not in shards)
    if missing:
        problems.append(
            f"{SAFETENSORS_INDEX} names shard(s) missing from the store: "
            f"{', '.join(missing[:5])}; upload them or re-save the model"
        )
    return problems


def _check_index(reader: _Reader, file: ModelFile, shards: set[str]) -> list[str]:
    raw, problem = reader.json(file)
    return [problem] if raw is None and problem else index_problems(raw or b"", shards)


def _rank_parts(shards: list[ModelFile], named: re.Pattern[str]) -> dict[int, set[int]]:
    """The part numbers of each rank's files (part 0 for a pattern without ``{part}``)."""
    parts: dict[int, set[int]] = {}
    for f in shards:
        if m := named.fullmatch(f.path):
            parts.setdefault(int(m["rank"]), set()).add(int(m.groupdict().get("part") or 0))
    return parts


def _check_ranks(parts: dict[int, set[int]], tp: int, pattern: str | None) -> list[str]:
    ranks = set(parts)
    names = (pattern or SHARD_PATTERN).format(rank="<rank>", part="<part>")
    if not ranks:
        return [
            f"runai_streamer_sharded needs pre-sharded files named {names} (saved with "
            "vLLM's save_sharded_state); none found; "
            + (
                ""
                if pattern
                else "for files named otherwise set model_loader_extra_config={'pattern': ...}; "
            )
            + "use load_format='runai_streamer' for a plain checkpoint"
        ]
    if ranks != set(range(tp)):
        return [
            f"the pre-sharded files are for ranks {sorted(ranks)}, but tensor_parallel_size is "
            f"{tp} (ranks {list(range(tp))}); save the shards again with "
            f"tensor_parallel_size={tp} (`ray-stream-llm shard --tensor-parallel-size {tp}`) "
            f"or set tensor_parallel_size={len(ranks)}"
        ]
    gaps = [
        f"rank {rank} lacks part(s) {sorted(set(range(max(got) + 1)) - got)}"
        for rank, got in sorted(parts.items())
        if got != set(range(max(got) + 1))
    ]
    if gaps:
        return [
            f"the pre-sharded files are incomplete: {'; '.join(gaps)}; upload the missing "
            f"{names} files or save the shards again"
        ]
    return []


# vLLM 0.29's sharded loader finds rank files with one list_objects_v2 call
# (s3_utils.list_files, no pagination): S3 answers with the first 1,000 keys in key order.
SHARDED_LISTING_LIMIT = 1000


def _unlisted_rank_files(files: tuple[ModelFile, ...], named: re.Pattern[str]) -> list[str]:
    if len(files) <= SHARDED_LISTING_LIMIT:
        return []
    listed = set(sorted(f.path for f in files)[:SHARDED_LISTING_LIMIT])  # code point = key order
    unlisted = [f.path for f in files if named.fullmatch(f.path) and f.path not in listed]
    if not unlisted:
        return []
    return [
        f"vLLM's sharded loader lists the prefix once, which gives the first "
        f"{SHARDED_LISTING_LIMIT} of its {len(files)} objects, so it would not find "
        f"{len(unlisted)} rank file(s) ({', '.join(unlisted[:3])}); give the checkpoint a "
        f"prefix with fewer than {SHARDED_LISTING_LIMIT} objects (ray-stream-llm shard "
        "--output to a new prefix, with a larger --max-part-bytes for fewer parts)"
    ]


def header_length_problem(name: str, size: int, length: int) -> str | None:
    """Whether a safetensors header of ``length`` bytes fits a ``size``-byte object."""
    if length == 0 or length > MAX_HEADER_BYTES or 8 + length > size:
        return (
            f"{name} has a header length of {length} bytes, impossible for a {size}-byte "
            "object: it is truncated or not safetensors; upload it again"
        )
    return None


def parse_header(name: str, size: int, length: int, raw: bytes) -> tuple[int, str | None]:
    """(tensor count, problem) for the JSON header ``raw`` of a ``size``-byte shard whose
    header is ``length`` bytes long: an object of tensors whose data ends at the object's end."""
    try:
        header = _loads(raw)
    except (ValueError, UnicodeDecodeError):
        return 0, f"{name}: the safetensors header is not valid JSON; upload it again"
    if not isinstance(header, dict):
        return 0, (
            f"{name}: the safetensors header is a JSON {type(header).__name__}, not an "
            "object; upload it again"
        )
    try:
        spans = [v["data_offsets"] for k, v in header.items() if k != "__metadata__"]
        data_end = max((int(end) for _, end in spans), default=0)
    except (ValueError, KeyError, TypeError, AttributeError, OverflowError):
        return 0, (
            f"{name}: the safetensors header has a tensor without valid "
            "'data_offsets'; upload it again"
        )
    if 8 + length + data_end != size:
        return len(spans), (
            f"{name} is {size} bytes but its header describes {8 + length + data_end}: "
            "the object is truncated or corrupt; upload it again"
        )
    return len(spans), None


def _check_header(
    client: Client, model: ModelURI, shard: ModelFile, deadline: StoreDeadline
) -> tuple[int, str | None]:
    """(tensor count, problem) for one shard, from two ranged GETs."""
    name = shard.path
    if shard.size < 8:
        return 0, f"{name} is {shard.size} bytes, too short to be safetensors; upload it again"
    (length,) = struct.unpack("<Q", stores.read(client, model, name, deadline, 0, 7))
    problem = header_length_problem(name, shard.size, length)
    if problem:
        return 0, problem
    return parse_header(
        name, shard.size, length, stores.read(client, model, name, deadline, 8, 7 + length)
    )
