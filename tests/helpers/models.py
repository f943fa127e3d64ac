"""Tiny random-weight Llama models with a locally trained tokenizer, in realistic layouts.

Nothing here touches the Hugging Face Hub: the BPE tokenizer is trained with
``tokenizers`` on a synthetic corpus (once per process), and the model is a
``LlamaForCausalLM`` with random bfloat16 weights (hidden size 128, two layers,
about 0.8 M parameters) seeded for determinism.

Layouts (``LAYOUTS`` / ``build_layout``) write a model directory that a test
then uploads:

* ``single``: one ``model.safetensors``;
* ``sharded``: several ``model-0000X-of-0000N.safetensors`` plus the index;
* ``hub-mirror``: the single-file model plus everything a mirror of a Hub
  repository tends to hold (PyTorch/Meta/GGUF/Flax/TF weights, ``original/``,
  README, custom code, slow-tokenizer files, extra chat templates).

``metadata_files`` and ``weight_files`` state the metadata rule on their own,
on purpose not imported from ``ray_stream_llm``: tests check the library
against this independent statement. ``EXPECTED_METADATA`` / ``WEIGHT_FILES``
apply them to what a reference build of each layout actually produced, so the
sets follow whatever files the installed transformers writes.
"""

from __future__ import annotations

import atexit
import fnmatch
import functools
import json
import random
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

VOCAB_SIZE = 2048
SPECIAL_TOKENS = ("<s>", "</s>", "<pad>", "<|user|>", "<|assistant|>", "<|system|>", "<|end|>")
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\n' + message['content'] + '<|end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)
TOOL_USE_TEMPLATE = (
    "{% for tool in tools or [] %}"
    "{{ '<|system|>\ntool: ' + tool['function']['name'] + '<|end|>\n' }}"
    "{% endfor %}" + CHAT_TEMPLATE
)
LLAMA_SHAPE = dict(
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
)
SHARD_SIZE = "300KB"  # embeddings are 512 KiB each: gives 4 shards for the tiny model


@dataclass(frozen=True)
class UploadedModel:
    """A layout built locally and uploaded to the test S3 server."""

    name: str
    uri: str  # "s3://models/tiny/<name>/"
    local: Path  # the directory that was uploaded
    metadata: frozenset[str]  # relative paths a metadata-only fetch must bring, exactly
    weights: frozenset[str]  # relative paths of weight files (never to be written locally)


# --- the metadata rule, stated independently of ray_stream_llm.patterns -----------------
WEIGHT_GLOBS = (
    "*.safetensors",
    "*.bin",
    "*.pt",
    "*.pth",
    "*.ckpt",
    "*.gguf",
    "*.h5",
    "*.msgpack",
    "*.onnx",
    "*.tensors",
    "consolidated.*",
)
METADATA_GLOBS = ("*.json", "*.jinja", "*.py", "*.model", "*.tiktoken", "merges.txt", "vocab.txt")
METADATA_DIRS = ("additional_chat_templates",)


def is_weight(rel: str) -> bool:
    """A weight file in any format, at any depth."""
    name = rel.rsplit("/", 1)[-1]
    return any(fnmatch.fnmatchcase(name, g) for g in WEIGHT_GLOBS)


def is_metadata(rel: str) -> bool:
    """Root-level (or ``additional_chat_templates/``) config/tokenizer/template/code file."""
    directory, _, name = rel.rpartition("/")
    if is_weight(rel) or directory not in ("", *METADATA_DIRS):
        return False
    return any(fnmatch.fnmatchcase(name, g) for g in METADATA_GLOBS)


def list_files(model_dir: Path) -> set[str]:
    """Every file under ``model_dir``, as POSIX paths relative to it."""
    return {p.relative_to(model_dir).as_posix() for p in model_dir.rglob("*") if p.is_file()}


def metadata_files(model_dir: Path) -> frozenset[str]:
    return frozenset(p for p in list_files(model_dir) if is_metadata(p))


def weight_files(model_dir: Path) -> frozenset[str]:
    return frozenset(p for p in list_files(model_dir) if is_weight(p))


# --- tokenizer and model --------------------------------------------------------------------
def _corpus(lines: int = 5000, seed: int = 0) -> Iterator[str]:
    rnd = random.Random(seed)
    words = [
        "the",
        "quick",
        "brown",
        "fox",
        "jumps",
        "over",
        "lazy",
        "dog",
        "ray",
        "data",
        "vllm",
        "model",
        "streamer",
        "object",
        "store",
        "bucket",
        "tensor",
        "weight",
        "layer",
        "token",
        "batch",
        "inference",
        "hello",
        "world",
        "what",
        "is",
        "answer",
        "question",
        "user",
        "assistant",
        "system",
        "one",
        "two",
        "three",
        "four",
        "five",
    ]
    syllables = [
        "ka",
        "lo",
        "mi",
        "ren",
        "tas",
        "vu",
        "zer",
        "qo",
        "bli",
        "dra",
        "fen",
        "gor",
        "hul",
        "jix",
        "nop",
        "pre",
        "sta",
        "tri",
        "wel",
        "yam",
        "cho",
        "sku",
        "ith",
        "orn",
    ]
    # pseudo-words give BPE enough distinct merges to fill the vocabulary
    words += ["".join(rnd.choice(syllables) for _ in range(rnd.randint(1, 4))) for _ in range(3000)]
    for _ in range(lines):
        line = " ".join(rnd.choice(words) for _ in range(rnd.randint(5, 30)))
        yield line + rnd.choice([".", "?", "!", f" {rnd.randint(0, 9999)}."])


@functools.cache
def _trained_bpe_json() -> str:
    """The trained ``tokenizers.Tokenizer``, serialized (training is the slow part: once)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    return tok.to_str()


def make_tokenizer() -> Any:
    """A fresh ``PreTrainedTokenizerFast`` (bos/eos/pad, chat template) from the cached training."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_trained_bpe_json()),
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        model_max_length=512,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def _make_model(tok: Any) -> Any:
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tok),
        max_position_embeddings=512,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=False,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        **LLAMA_SHAPE,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = LlamaForCausalLM(config).to(torch.bfloat16).eval()
    model.generation_config = GenerationConfig(
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        max_new_tokens=32,
    )
    return model


def build_tiny_llama(dest: Path, *, shards: int = 1) -> Path:
    """Write a complete HF model directory to ``dest``: one safetensors file, or (``shards > 1``)
    several shards (as many as ``SHARD_SIZE`` gives, at least 3) plus the index."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    tok = make_tokenizer()
    model = _make_model(tok)
    model.save_pretrained(
        dest, safe_serialization=True, max_shard_size=SHARD_SIZE if shards > 1 else "5GB"
    )
    tok.save_pretrained(dest)
    if shards > 1:
        found = sorted(dest.glob("model-*-of-*.safetensors"))
        assert len(found) >= 3 and (dest / "model.safetensors.index.json").is_file(), found
    else:
        assert (dest / "model.safetensors").is_file()
    return dest


# --- layouts --------------------------------------------------------------------------------
def _single(dest: Path) -> Path:
    return build_tiny_llama(dest)


def _sharded(dest: Path) -> Path:
    return build_tiny_llama(dest, shards=3)


def _write(path: Path, data: str | bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, bytes):
        path.write_bytes(data)
    else:
        path.write_text(data)


def _hub_mirror(dest: Path) -> Path:
    import torch
    from safetensors.torch import load_file
    from tokenizers import Tokenizer

    build_tiny_llama(dest)
    state = load_file(dest / "model.safetensors")
    torch.save(state, dest / "pytorch_model.bin")
    (dest / "original").mkdir(exist_ok=True)
    torch.save(state, dest / "original" / "consolidated.00.pth")
    config = json.loads((dest / "config.json").read_text())
    params = {
        "dim": config["hidden_size"],
        "n_layers": config["num_hidden_layers"],
        "n_heads": config["num_attention_heads"],
        "n_kv_heads": config["num_key_value_heads"],
        "vocab_size": config["vocab_size"],
        "norm_eps": config["rms_norm_eps"],
        "rope_theta": 10000.0,
    }
    _write(dest / "original" / "params.json", json.dumps(params, indent=2))
    _write(dest / "original" / "tokenizer.model", b"\x0a\x05<unk>\x15\x00\x00\x00\x00\x18\x02")
    bpe = Tokenizer.from_str(_trained_bpe_json())
    bpe.model.save(str(dest))  # vocab.json + merges.txt (slow-tokenizer files)
    added = {t: bpe.token_to_id(t) for t in SPECIAL_TOKENS}
    _write(dest / "added_tokens.json", json.dumps(added, indent=2))
    _write(
        dest / "special_tokens_map.json",
        json.dumps({"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"}, indent=2),
    )
    _write(dest / "qwen.tiktoken", "IQ== 0\nIg== 1\nIw== 2\n")
    _write(dest / "preprocessor_config.json", "{}\n")
    _write(
        dest / "README.md",
        "---\nlicense: apache-2.0\nlibrary_name: transformers\n---\n"
        "# tiny-llama\n\nRandom weights, for tests only.\n",
    )
    _write(
        dest / ".gitattributes",
        "*.safetensors filter=lfs diff=lfs merge=lfs -text\n"
        "*.bin filter=lfs diff=lfs merge=lfs -text\n"
        "*.pth filter=lfs diff=lfs merge=lfs -text\n",
    )
    _write(
        dest / "configuration_custom.py",
        "from transformers import LlamaConfig\n\n\n"
        'class CustomConfig(LlamaConfig):\n    model_type = "custom-llama"\n',
    )
    _write(
        dest / "modeling_custom.py",
        "from transformers import LlamaForCausalLM\n\n"
        "from .configuration_custom import CustomConfig\n\n\n"
        "class CustomForCausalLM(LlamaForCausalLM):\n    config_class = CustomConfig\n",
    )
    _write(dest / "model.gguf", b"GGUF\x03\x00\x00\x00")
    _write(dest / "flax_model.msgpack", b"\x80")
    _write(dest / "tf_model.h5", b"\x89HDF\r\n\x1a\n")
    _write(dest / "training_args.bin", b"PK\x05\x06" + b"\x00" * 18)
    if not (dest / "chat_template.jinja").exists():  # transformers 5 writes it, 4.x did not
        _write(dest / "chat_template.jinja", CHAT_TEMPLATE)
    _write(dest / "additional_chat_templates" / "tool_use.jinja", TOOL_USE_TEMPLATE)
    return dest


LAYOUTS: dict[str, Callable[[Path], Path]] = {
    "single": _single,
    "sharded": _sharded,
    "hub-mirror": _hub_mirror,
}

# Files each layout must have in its metadata whatever transformers writes (a floor, not the set).
REQUIRED_METADATA: dict[str, frozenset[str]] = {
    "single": frozenset({"config.json", "tokenizer.json"}),
    "sharded": frozenset({"config.json", "tokenizer.json", "model.safetensors.index.json"}),
    "hub-mirror": frozenset(
        {
            "config.json",
            "tokenizer.json",
            "vocab.json",
            "merges.txt",
            "added_tokens.json",
            "special_tokens_map.json",
            "qwen.tiktoken",
            "preprocessor_config.json",
            "configuration_custom.py",
            "modeling_custom.py",
            "chat_template.jinja",
            "additional_chat_templates/tool_use.jinja",
        }
    ),
}


def build_layout(name: str, dest: Path) -> Path:
    """Build layout ``name`` into ``dest`` (created) and check it against the rule's floor."""
    model_dir = LAYOUTS[name](Path(dest))
    missing = REQUIRED_METADATA[name] - metadata_files(model_dir)
    assert not missing, f"layout {name} lacks metadata files {sorted(missing)}"
    return model_dir


@functools.cache
def _reference_dir() -> Path:
    root = Path(tempfile.mkdtemp(prefix="tiny-llama-ref-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    return root


@functools.cache
def _reference_build(name: str) -> Path:
    return build_layout(name, _reference_dir() / name)


class _PerLayout(Mapping[str, frozenset[str]]):
    """``layout name -> set``, computed from a reference build made on first access."""

    def __init__(self, select: Callable[[Path], frozenset[str]]) -> None:
        self._select = select

    def __getitem__(self, name: str) -> frozenset[str]:
        if name not in LAYOUTS:
            raise KeyError(name)
        return self._select(_reference_build(name))

    def __iter__(self) -> Iterator[str]:
        return iter(LAYOUTS)

    def __len__(self) -> int:
        return len(LAYOUTS)


EXPECTED_METADATA: Mapping[str, frozenset[str]] = _PerLayout(metadata_files)
WEIGHT_FILES: Mapping[str, frozenset[str]] = _PerLayout(weight_files)


def tensor_bytes(path: Path) -> int:
    """Bytes of the tensors in a safetensors file, read from its own header."""
    import struct

    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    return sum(
        v["data_offsets"][1] - v["data_offsets"][0]
        for k, v in header.items()
        if k != "__metadata__"
    )
