"""What an engine holds once its weights are loaded: a sha256 per parameter, summed up per
rank in the load report (``weight_checksums=True``).

In each of the engine's processes, after vLLM's loader has loaded the model (the
registered loaders of :mod:`~ray_stream_llm.integrations.vllm.loader` call
:func:`record`): the digests are vLLM's own ``compute_tensor_digests`` (what its
``compute_weight_checksums()`` returns per worker, vLLM 0.32 on); an older vLLM has none,
and gets the same formula here (a sha256 of each parameter's bytes, in the order
``named_parameters`` gives them). The process writes ``checksum-<pid>.json`` into the
engine actor's report directory: its rank, how many parameters, and one sha256 over the
sorted ``name digest`` lines. Two engines that hold the same bytes report the same digest
per rank, whether they read the store, the node's copy or a peer's.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

from ray_stream_llm.files import write_whole
from ray_stream_llm.integrations.vllm.compile_cache import REPORT_DIR_ENV, tensor_parallel_rank

ENV = "RAY_STREAM_LLM_WEIGHT_CHECKSUMS"  # "1" in the engine actor: every process records
PREFIX = "checksum-"


def digests(model: Any) -> tuple[dict[str, str], str]:
    """A sha256 per parameter of ``model``, and whose function made them: ``"vllm"``
    (``compute_tensor_digests``, 0.32 on) or ``"ray_stream_llm"`` (:func:`same_formula`)."""
    try:
        from vllm.model_executor.model_loader.weight_checksum import compute_tensor_digests
    except ImportError:  # vLLM before 0.32
        return same_formula(model), "ray_stream_llm"
    found: dict[str, str] = compute_tensor_digests(model)
    return found, "vllm"


def same_formula(model: Any) -> dict[str, str]:
    """vLLM 0.32's digests for a model of plain parameters (no wrapped or shared tensors,
    which vLLM 0.29's models on this library's path do not have): the sha256 of each
    parameter's bytes."""
    import torch

    return {
        name: hashlib.sha256(
            p.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy()
        ).hexdigest()
        for name, p in model.named_parameters()
    }


def summary(per_parameter: dict[str, str]) -> str:
    """One sha256 over the sorted ``name digest`` lines."""
    lines = "".join(f"{name} {digest}\n" for name, digest in sorted(per_parameter.items()))
    return hashlib.sha256(lines.encode()).hexdigest()


def record(model: Any) -> None:
    """In an engine process, after loading: this rank's summary into the actor's report
    directory; nothing unless the actor asked (:data:`ENV`) and has a report directory."""
    directory = os.environ.get(REPORT_DIR_ENV)
    if os.environ.get(ENV) != "1" or not directory:
        return
    found, by = digests(model)
    entry = {
        "rank": tensor_parallel_rank(),
        "pid": os.getpid(),
        "parameters": len(found),
        "sha256": summary(found),
        "by": by,
    }
    write_whole(os.path.join(directory, f"{PREFIX}{os.getpid()}.json"), json.dumps(entry))
