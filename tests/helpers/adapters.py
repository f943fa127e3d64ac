"""PEFT-style LoRA adapters for the tiny Llama of tests/helpers/models.py, written with
safetensors and json (no peft): PEFT's tensor names and ``adapter_config.json``; their
upload to sub-folders of one prefix of the S3 server (tests/integration/test_lora.py,
tests/e2e/test_lora.py, tests/integration/test_catalog.py); the server as a user's
ObjectStoreConfig names it.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from helpers.jobs import store_through
from helpers.models import LLAMA_SHAPE
from ray_stream_llm.tools.localstore import LocalS3Server

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")
RANK = 8


def _shapes() -> dict[str, tuple[int, int]]:
    """(in, out) features of each targeted projection of the tiny Llama."""
    hidden = LLAMA_SHAPE["hidden_size"]
    q = LLAMA_SHAPE["num_attention_heads"] * LLAMA_SHAPE["head_dim"]
    kv = LLAMA_SHAPE["num_key_value_heads"] * LLAMA_SHAPE["head_dim"]
    return {
        "q_proj": (hidden, q),
        "k_proj": (hidden, kv),
        "v_proj": (hidden, kv),
        "o_proj": (q, hidden),
    }


def make_adapter(dest: Path, base: str, *, b_scale: float, seed: int = 0, rank: int = RANK) -> Path:
    """A PEFT-style LoRA adapter for the tiny Llama: ``adapter_model.safetensors`` (lora_A
    random, lora_B random times ``b_scale``; 0 gives a no-op adapter) and
    ``adapter_config.json`` recording ``base``."""
    import torch
    from safetensors.torch import save_file

    dest.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(LLAMA_SHAPE["num_hidden_layers"]):
        for module, (fan_in, fan_out) in _shapes().items():
            name = f"base_model.model.model.layers.{layer}.self_attn.{module}"
            tensors[f"{name}.lora_A.weight"] = torch.randn(rank, fan_in, generator=gen)
            tensors[f"{name}.lora_B.weight"] = torch.randn(fan_out, rank, generator=gen) * b_scale
    tensors = {k: v.to(torch.bfloat16).contiguous() for k, v in tensors.items()}
    save_file(tensors, str(dest / "adapter_model.safetensors"), metadata={"format": "pt"})
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base,
        "r": rank,
        "lora_alpha": 2 * rank,
        "lora_dropout": 0.0,
        "target_modules": list(TARGETS),
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "use_dora": False,
        "modules_to_save": None,
    }
    (dest / "adapter_config.json").write_text(json.dumps(config, indent=2))
    return dest


def upload_adapters(
    server: LocalS3Server,
    local_root: Path,
    base: str,
    specs: dict[str, dict],
    prefix: str | None = None,
) -> str:
    """Adapters made from ``specs`` (name -> make_adapter kwargs, ``base`` among them to
    record another base model) under ``local_root``, each uploaded to a sub-folder of
    ``prefix`` (default: a fresh prefix in the models bucket, beside the model); the prefix."""
    prefix = prefix or f"s3://models/loras/{uuid.uuid4().hex[:8]}/"
    for name, kwargs in specs.items():
        kwargs = dict(kwargs)
        local = make_adapter(local_root / "adapters" / name, kwargs.pop("base", base), **kwargs)
        server.upload_dir(local, f"{prefix}{name}/")
    return prefix


def store_fields(server: LocalS3Server) -> dict[str, str]:
    """The server as a user's ObjectStoreConfig names it: ``localhost`` (path-style
    addressing derived by this library; a plain boto3 client would address
    ``models.localhost``, which does not resolve)."""
    return store_through(server, f"http://localhost:{server.port}")
