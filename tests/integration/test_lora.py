"""LoRA adapters from the model's store (issue 35 item 2): ``dynamic_lora_loading_path`` under
the same ``ObjectStoreConfig`` as the model, checked on the driver before any actor starts
(served by a real CPU vLLM engine: tests/e2e/test_lora.py; the match rule:
tests/unit/test_lora.py).

The adapters are made for the tiny Llama of tests/helpers/models.py by
tests/helpers/adapters.py (safetensors and json, no peft). ``loud`` has a large
``lora_B`` (its answers must differ from the base model's); ``zero`` has ``lora_B = 0`` (its
answers must equal the base model's: the difference is the weights', not the LoRA path's).
"""

from __future__ import annotations

import uuid

import pytest
from helpers.adapters import RANK, store_fields, upload_adapters
from helpers.models import UploadedModel
from helpers.s3log import AccessLog

from ray_stream_llm import errors
from ray_stream_llm.tools.localstore import LocalS3Server
from ray_stream_llm.uri import parse_model_uri


def _build(model: UploadedModel, lora_path: str, server: LocalS3Server, **engine: object):
    """Build the processor as a user would; the typed error the build raises."""
    import ray

    from ray_stream_llm import StreamingvLLMEngineProcessorConfig, build_llm_processor
    from ray_stream_llm.stores.settings import ObjectStoreConfig

    config = StreamingvLLMEngineProcessorConfig(
        model_source=model.uri,
        engine_kwargs={"load_format": "runai_streamer", "enable_lora": True, **engine},
        dynamic_lora_loading_path=lora_path,
        object_store=ObjectStoreConfig(**store_fields(server)),
        concurrency=1,
    )
    with pytest.raises(errors.RayStreamLLMError) as info:
        build_llm_processor(config)
    assert not ray.is_initialized(), "the driver's check must fail before Ray (and any actor)"
    message = str(info.value)
    assert "\n" not in message, message
    assert server.secret_access_key not in message
    return info.value


# --- the driver's checks against the real store, no engine ------------------------------------
@pytest.mark.s3
def test_driver_checks_the_adapters_with_the_configs_settings(
    s3_server, tiny_models, no_aws_env, tmp_path
):
    """The preflight lists the prefix and reads each adapter_config.json, signed with the
    config's keys (the process environment has none); it reads no adapter weights."""
    from ray_stream_llm import StreamingvLLMEngineProcessorConfig
    from ray_stream_llm.lora import check_adapters
    from ray_stream_llm.preflight import preflight
    from ray_stream_llm.stores.settings import ObjectStoreConfig

    model = tiny_models["single"]
    lora_path = upload_adapters(
        s3_server,
        tmp_path,
        model.uri,
        {"loud": {"b_scale": 1.0}, "hub-named": {"b_scale": 0.0, "base": "org/single"}},
    )
    store = ObjectStoreConfig(**store_fields(s3_server))
    config = StreamingvLLMEngineProcessorConfig(
        model_source=model.uri,
        engine_kwargs={"load_format": "runai_streamer", "enable_lora": True},
        dynamic_lora_loading_path=lora_path,
        object_store=store,
    )
    log = AccessLog(s3_server)
    preflight(config)
    prefix = lora_path[len("s3://models/") :]
    reads = [r for r in log.requests() if r.key.startswith(prefix)]
    assert {r.key for r in reads if r.method == "GET" and r.status == 200} >= {
        f"{prefix}loud/adapter_config.json",
        f"{prefix}hub-named/adapter_config.json",
    }
    assert not [r for r in reads if r.key.endswith(".safetensors")], reads
    assert {r.identity for r in reads} == {"admin"}, reads  # signed with the config's keys
    adapters = check_adapters(
        lora_path,
        parse_model_uri(model.uri),
        engine_kwargs=config.engine_kwargs,
        object_store=store,
    )
    assert [(a.name, a.base_model, a.rank) for a in adapters] == [
        ("hub-named", "org/single", RANK),
        ("loud", model.uri, RANK),
    ]


@pytest.mark.s3
def test_a_bad_prefix_fails_on_the_driver_in_one_line(s3_server, tiny_models, no_aws_env, tmp_path):
    model = tiny_models["single"]
    wrong = f"s3://models/loras-typo/{uuid.uuid4().hex[:8]}/"
    error = _build(model, wrong, s3_server)
    assert isinstance(error, errors.AdapterNotFoundError)
    assert isinstance(error, FileNotFoundError)
    assert repr(wrong) in str(error) and "check the prefix" in str(error)


@pytest.mark.s3
def test_the_prefix_of_one_adapter_is_refused(s3_server, tiny_models, no_aws_env, tmp_path):
    model = tiny_models["single"]
    lora_path = upload_adapters(s3_server, tmp_path, model.uri, {"only": {"b_scale": 1.0}})
    error = _build(model, lora_path + "only/", s3_server)
    assert isinstance(error, errors.AdapterNotFoundError)
    assert "is one adapter" in str(error) and "give its parent prefix" in str(error)


@pytest.mark.s3
def test_a_mismatched_base_fails_on_the_driver_in_one_line(
    s3_server, tiny_models, no_aws_env, tmp_path
):
    model = tiny_models["single"]
    other = "s3://models/tiny/sharded/"
    lora_path = upload_adapters(
        s3_server,
        tmp_path,
        model.uri,
        {"fine": {"b_scale": 1.0}, "foreign": {"b_scale": 1.0, "base": other}},
    )
    error = _build(model, lora_path, s3_server)
    assert isinstance(error, errors.AdapterBaseMismatchError)
    assert isinstance(error, ValueError)
    text = str(error)
    assert f"{lora_path}foreign/" in text and repr(other) in text and repr(model.uri) in text
    assert "base_model_name_or_path" in text


@pytest.mark.s3
def test_an_adapter_without_config_or_with_too_high_a_rank_is_refused(
    s3_server, tiny_models, no_aws_env, tmp_path
):
    model = tiny_models["single"]
    lora_path = upload_adapters(s3_server, tmp_path, model.uri, {"fine": {"b_scale": 1.0}})
    s3_server.put(f"{lora_path}stray/adapter_model.safetensors", b"not an adapter folder")
    error = _build(model, lora_path, s3_server)
    assert isinstance(error, errors.InvalidAdapterError)
    assert f"{lora_path}stray/" in str(error) and "adapter_config.json" in str(error)

    wide = upload_adapters(
        s3_server, tmp_path / "wide", model.uri, {"r32": {"b_scale": 1.0, "rank": 32}}
    )
    error = _build(model, wide, s3_server, max_lora_rank=16)
    assert isinstance(error, errors.InvalidAdapterError)
    assert "r=32" in str(error) and "max_lora_rank" in str(error)


@pytest.mark.s3
def test_lora_path_without_enable_lora_is_refused(s3_server, tiny_models, no_aws_env, tmp_path):
    model = tiny_models["single"]
    lora_path = upload_adapters(s3_server, tmp_path, model.uri, {"fine": {"b_scale": 1.0}})
    error = _build(model, lora_path, s3_server, enable_lora=False)
    assert isinstance(error, errors.InvalidSettingError)
    assert "enable_lora" in str(error) and repr(lora_path) in str(error)
