"""Ray's vLLM engine stage, and its differences across the supported Ray versions.

Importing Ray's engine stage imports vLLM (seconds of CPU and hundreds of MB): only the
engine actor and the driver's build import this module, never the tokenizer-side stage
actors (:mod:`ray_stream_llm.integrations.ray.compat` has everything else).

Ray 2.48-2.50's engine wrapper calls the vLLM API of its day (``task=``, ``VLLM_USE_V1``,
``GuidedDecodingParams``, ``vllm.inputs.data``), which vLLM removed; with such a vLLM
:func:`engine_stage_shims` builds the same v1 engine the new way. Later Rays' wrapper (2.54)
still builds its prompts from ``vllm.inputs.data``, which vLLM 0.19 removed: there the
prompts are built where vLLM has them now, the rest as Ray does it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import inspect
from collections.abc import Iterator
from typing import Any

from ray.llm._internal.batch.stages import vllm_engine_stage as _engine_stage
from ray.llm._internal.batch.stages.vllm_engine_stage import vLLMEngineStageUDF

from ray_stream_llm.integrations.ray.compat import ray_stage_shims


@functools.cache
def _needs_v1_wrapper() -> bool:
    """Ray's wrapper splits v0/v1 engines and passes ``task=``: vLLM >= 0.11 has neither."""
    if not hasattr(_engine_stage.vLLMEngineWrapper, "generate_async_v0"):
        return False
    import vllm

    return "task" not in {f.name for f in dataclasses.fields(vllm.AsyncEngineArgs)}


@functools.cache
def _needs_prompt_classes() -> bool:
    """Ray's wrapper builds its prompts from ``vllm.inputs.data``, which vLLM 0.19 removed
    (its prompt classes are in ``vllm.inputs.llm`` since)."""
    import importlib.util

    if "vllm.inputs.data." not in inspect.getsource(_engine_stage.vLLMEngineWrapper):
        return False
    try:
        return importlib.util.find_spec("vllm.inputs.data") is None
    except ModuleNotFoundError:
        return True


def _engine_wrapper() -> type | None:
    """The wrapper that replaces Ray's in the engine actor on this Ray and vLLM, if any."""
    if _needs_v1_wrapper():
        return _V1EngineWrapper
    if _needs_prompt_classes():
        return _PromptsWrapper
    return None


@contextlib.contextmanager
def engine_stage_shims() -> Iterator[None]:
    """:func:`~ray_stream_llm.integrations.ray.compat.ray_stage_shims`, and Ray's engine wrapper
    replaced where it calls a vLLM API that is gone."""
    wrapper = _engine_wrapper()
    swaps = [(_engine_stage, "vLLMEngineWrapper", wrapper)] if wrapper else []
    with ray_stage_shims(*swaps):
        yield


def _prompt_classes() -> tuple[Any, Any]:
    """vLLM's ``TokensPrompt`` and ``TextPrompt``: in ``vllm.inputs.llm`` from vLLM 0.19,
    in ``vllm.inputs`` before."""
    try:
        from vllm.inputs.llm import TextPrompt, TokensPrompt
    except ImportError:
        from vllm.inputs import TextPrompt, TokensPrompt
    return TokensPrompt, TextPrompt


class _PromptsWrapper(_engine_stage.vLLMEngineWrapper):
    """Ray 2.54's engine wrapper for vLLM >= 0.19: Ray's own request handling, the prompt
    built from the classes where this vLLM has them (Ray's ``vllm.inputs.data.TokensPrompt``
    failed every request: "module 'vllm.inputs' has no attribute 'data'"), and the row's
    LoRA adapter passed on (Ray 2.54's made the request's ``lora_request`` and dropped it:
    an adapter's rows were answered by the base model)."""

    async def _generate_async(self, request: Any) -> Any:
        tokens_prompt, text_prompt = _prompt_classes()
        data = request.multimodal_data
        if request.images:
            data = {**(data or {}), "image": request.images}
        fields = {
            "multi_modal_data": data,
            "mm_processor_kwargs": request.mm_processor_kwargs,
            "multi_modal_uuids": request.multimodal_uuids,
        }
        if request.prompt_token_ids is not None:
            prompt = tokens_prompt(prompt_token_ids=request.prompt_token_ids, **fields)
        else:
            prompt = text_prompt(prompt=request.prompt, **fields)
        task = _engine_stage.vLLMTaskType
        pooling = {getattr(task, name, None) for name in ("EMBED", "CLASSIFY", "SCORE")}
        if self.task_type in pooling:
            stream = self.engine.encode(
                request_id=str(request.request_id),
                prompt=prompt,
                pooling_params=request.params,
                truncate_prompt_tokens=request.params.truncate_prompt_tokens,
            )
        else:
            stream = self.engine.generate(
                request_id=str(request.request_id),
                prompt=prompt,
                sampling_params=request.params,
                lora_request=request.lora_request,  # Ray 2.54's own dropped it
            )
        async for output in stream:
            if output.finished:
                output.prompt = request.prompt if request.prompt is not None else ""
                return output
        raise RuntimeError(f"vLLM ended request {request.request_id} before it finished")


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
        _, text_prompt = _prompt_classes()
        data = {"image": request.images} if request.images else None
        prompt = text_prompt(prompt=request.prompt, multi_modal_data=data)
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


__all__ = ["engine_stage_shims", "vLLMEngineStageUDF"]
