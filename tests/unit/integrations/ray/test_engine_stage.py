"""Ray's engine stage across Ray and vLLM versions (ray_stream_llm/integrations/ray/
engine_stage.py): on this stack, the wrapper Ray runs and the prompt classes vLLM has."""

from __future__ import annotations

from ray.llm._internal.batch.stages import vllm_engine_stage

from ray_stream_llm.integrations.ray import engine_stage


def test_the_shims_put_rays_wrapper_back_when_they_end():
    original = vllm_engine_stage.vLLMEngineWrapper
    with engine_stage.engine_stage_shims():
        inside = vllm_engine_stage.vLLMEngineWrapper
        assert inside is (engine_stage._engine_wrapper() or original)
    assert vllm_engine_stage.vLLMEngineWrapper is original


def test_a_replaced_wrapper_is_one_of_rays():
    wrapper = engine_stage._engine_wrapper()
    assert wrapper is None or issubclass(wrapper, vllm_engine_stage.vLLMEngineWrapper)


def test_the_prompt_classes_build_vllms_prompts():
    tokens_prompt, text_prompt = engine_stage._prompt_classes()
    assert tokens_prompt(prompt_token_ids=[1, 2, 3])["prompt_token_ids"] == [1, 2, 3]
    assert text_prompt(prompt="hi")["prompt"] == "hi"
