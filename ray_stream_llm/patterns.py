"""Which files of a model directory are weights and which are metadata.

Named once, here, with the reason for each. The rule for a streamed model:
weights are never written to local disk, in any format; metadata (what
transformers and vLLM read to build the config, the tokenizer and the chat
template) is fetched. Everything else (READMEs, images, Meta's ``original/``
checkpoint folder) is left in the store.

Paths are POSIX paths relative to the model directory. Matching is
case-sensitive (:func:`fnmatch.fnmatchcase`) and a pattern never crosses a
``/``: ``*.json`` matches ``config.json`` but not ``original/params.json``.
"""

from __future__ import annotations

import enum
import fnmatch
import posixpath
import re
from collections.abc import Iterable

from ray_stream_llm.errors import InvalidSettingError, ModelNotFoundError

# Weight files in every format we know of, at any depth. Never fetched.
WEIGHT_PATTERNS: tuple[str, ...] = (
    "*.safetensors",  # what the Run:ai streamer reads
    "*.bin",  # PyTorch pickles (pytorch_model.bin), training_args.bin
    "*.pt",
    "*.pth",  # original/consolidated.00.pth
    "*.ckpt",
    "*.gguf",  # llama.cpp
    "*.ggml",
    "*.h5",  # Keras / TF
    "*.keras",
    "*.msgpack",  # Flax
    "*.tensors",  # tensorizer
    "*.onnx",
    "*.onnx_data",
    "*.tflite",
    "*.npz",
    "*.npy",
    "*.ot",  # rust-bert
    "*.pkl",
    "*.pickle",
    "*.distcp",  # torch.distributed checkpoints
    "consolidated.*",  # Mistral / Meta native shards, whatever the extension
)

# Files the runai streamer streams: the only weights a streamed model may have. Only at the
# top level of the model directory: vLLM lists ``<model>/*.safetensors`` (one level, like
# its ``glob``), so a nested one (``original/``, a LoRA sub-folder) is never loaded.
STREAMABLE_PATTERNS: tuple[str, ...] = ("*.safetensors",)

# vLLM's ShardedStateLoader.DEFAULT_PATTERN: the names of a sharded-state checkpoint's files,
# one set per tensor-parallel rank (``model_loader_extra_config={"pattern": ...}`` changes it).
SHARD_PATTERN = "model-rank-{rank}-part-{part}.safetensors"


def shard_file_regex(pattern: str | None = None) -> re.Pattern[str]:
    """The regex, groups ``rank`` and ``part``, of the rank files vLLM's sharded loader
    finds with ``pattern`` (``pattern.format(rank=R, part="*")``); InvalidSettingError
    naming the value for a pattern the loader cannot use or the streamer cannot read."""
    if pattern is None:
        pattern = SHARD_PATTERN
    where = "engine_kwargs['model_loader_extra_config']['pattern']"
    if not isinstance(pattern, str):
        raise InvalidSettingError(f"{where} must be a string, got {pattern!r}")
    fields = sorted(re.findall(r"{([^{}]*)}", pattern))
    problem = None
    braces = (pattern.count("{"), pattern.count("}"))
    if fields not in (["rank"], ["part", "rank"]) or braces != (len(fields), len(fields)):
        problem = "must hold {rank} once, {part} at most once, and no other {field}"
    elif "{rank}{part}" in pattern or "{part}{rank}" in pattern:
        problem = "must separate {rank} from {part} (rank 1 part 12 and rank 11 part 2 look alike)"
    elif "/" in pattern:
        problem = "must be a file name, without '/'"
    elif not pattern.endswith(".safetensors"):
        problem = "must end with .safetensors (the streamer reads only safetensors)"
    if problem:
        raise InvalidSettingError(
            f"{where} is {pattern!r}: it {problem}, like vLLM's default {SHARD_PATTERN!r}"
        )
    # without {part} each rank has one file (vLLM's save would write every part to it)
    regex = "".join(
        {"{rank}": r"(?P<rank>\d+)", "{part}": r"(?P<part>\d+)"}.get(piece, re.escape(piece))
        for piece in re.split(r"({rank}|{part})", pattern)
    )
    return re.compile(regex)


# Metadata at the top level of the model directory.
METADATA_PATTERNS: tuple[str, ...] = (
    "*.json",  # config, generation_config, tokenizer(_config), special/added tokens,
    #            vocab.json, preprocessor/processor configs, chat_template.json,
    #            model.safetensors.index.json
    "*.jinja",  # chat_template.jinja (transformers >= 4.43)
    "*.model",  # sentencepiece: tokenizer.model, spiece.model
    "*.tiktoken",  # tiktoken vocabularies
    "merges.txt",  # BPE merges
    "vocab.txt",  # WordPiece vocabularies
    "*.py",  # custom code for trust_remote_code
)

# Sub-directories whose files are metadata too (matched with METADATA_PATTERNS).
METADATA_SUBDIRS: tuple[str, ...] = (
    "additional_chat_templates",  # transformers 5: named extra chat templates
)

# The files a model cannot be loaded without.
REQUIRED_METADATA: tuple[str, ...] = ("config.json",)

SAFETENSORS_INDEX = "model.safetensors.index.json"

# Metadata the driver parses before any actor starts, as the engines and tokenizers
# will: "model" must name the model (model_type or architectures), "object" must be
# a JSON object. The index has checks of its own.
CHECKED_METADATA: dict[str, str] = {
    "config.json": "model",
    "tokenizer_config.json": "object",
    "generation_config.json": "object",
}


class FileRole(str, enum.Enum):
    """What a file of a model directory is for."""

    STREAMABLE_WEIGHTS = "streamable_weights"
    OTHER_WEIGHTS = "other_weights"
    METADATA = "metadata"
    OTHER = "other"


def _match(name: str, patterns: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)


def classify(path: str) -> FileRole:
    """Classify one relative path.

    >>> classify("model-00001-of-00002.safetensors").value
    'streamable_weights'
    >>> classify("lora/adapter_model.safetensors").value
    'other_weights'
    >>> classify("original/consolidated.00.pth").value
    'other_weights'
    >>> classify("tokenizer.json").value
    'metadata'
    >>> classify("original/params.json").value
    'other'
    >>> classify("README.md").value
    'other'
    """
    directory, name = posixpath.split(path)
    if _match(name, STREAMABLE_PATTERNS) and directory == "":
        return FileRole.STREAMABLE_WEIGHTS
    if _match(name, WEIGHT_PATTERNS):
        return FileRole.OTHER_WEIGHTS
    if (directory == "" or directory in METADATA_SUBDIRS) and _match(name, METADATA_PATTERNS):
        return FileRole.METADATA
    return FileRole.OTHER


def is_weight_file(path: str) -> bool:
    """Whether ``path`` is a weight file of any format."""
    return classify(path) in (FileRole.STREAMABLE_WEIGHTS, FileRole.OTHER_WEIGHTS)


def require_metadata(
    uri: str, paths: Iterable[str], required: Iterable[str] = REQUIRED_METADATA
) -> None:
    """Raise :class:`ModelNotFoundError` naming ``uri`` when a file the model cannot be
    loaded without is not among ``paths``."""
    present = set(paths)
    missing = [name for name in required if name not in present]
    if missing:
        raise ModelNotFoundError(
            f"{uri!r} has no {', '.join(missing)}; point the URI at the model directory "
            "itself (the folder that holds config.json)"
        )
