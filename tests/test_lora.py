"""LoRA adapters from the model's store (issue 35 item 2): ``dynamic_lora_loading_path`` under
the same ``ObjectStoreConfig`` as the model, checked on the driver before any actor starts,
and served by a real CPU vLLM engine that fetched the adapter with the config's settings.

The adapters are made for the tiny Llama of tests/helpers/models.py by
tests/helpers/adapters.py (safetensors and json, no peft). ``loud`` has a large
``lora_B`` (its answers must differ from the base model's); ``zero`` has ``lora_B = 0`` (its
answers must equal the base model's: the difference is the weights', not the LoRA path's).
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from pathlib import Path

import pytest
from helpers.adapters import RANK, upload_adapters
from helpers.jobs import wait_regions_released, weight_files_written
from helpers.models import UploadedModel
from helpers.s3log import AccessLog
from helpers.waiting import wait_until

from ray_stream_llm import errors
from ray_stream_llm.lora import base_matches, check_lora_prefix
from ray_stream_llm.tools.isolated import run_isolated
from ray_stream_llm.tools.localstore import LocalS3Server
from ray_stream_llm.uri import parse_model_uri

DRIVER = Path(__file__).parent / "helpers" / "lora_driver.py"


def _store(server: LocalS3Server) -> dict[str, str]:
    """The server as a user's ObjectStoreConfig names it: ``localhost`` (path-style
    addressing derived by this library; a plain boto3 client would address
    ``models.localhost``, which does not resolve)."""
    return {
        "endpoint_url": f"http://localhost:{server.port}",
        "region_name": server.region,
        "aws_access_key_id": server.access_key_id,
        "aws_secret_access_key": server.secret_access_key,
    }


def _build(model: UploadedModel, lora_path: str, server: LocalS3Server, **engine: object):
    """Build the processor as a user would; the typed error the build raises."""
    import ray

    from ray_stream_llm import StreamingvLLMEngineProcessorConfig, build_llm_processor
    from ray_stream_llm.stores.settings import ObjectStoreConfig

    config = StreamingvLLMEngineProcessorConfig(
        model_source=model.uri,
        engine_kwargs={"load_format": "runai_streamer", "enable_lora": True, **engine},
        dynamic_lora_loading_path=lora_path,
        object_store=ObjectStoreConfig(**_store(server)),
        concurrency=1,
    )
    with pytest.raises(errors.RayStreamLLMError) as info:
        build_llm_processor(config)
    assert not ray.is_initialized(), "the driver's check must fail before Ray (and any actor)"
    message = str(info.value)
    assert "\n" not in message, message
    assert server.secret_access_key not in message
    return info.value


# --- the match rule, no server ----------------------------------------------------------------
def test_base_matches_names_the_model():
    uri = parse_model_uri("s3://bkt/hub/meta-llama/Llama-3.1-8B/")
    names = {str(uri).rstrip("/")}
    assert base_matches("s3://bkt/hub/meta-llama/Llama-3.1-8B", uri, names)
    assert base_matches("s3://bkt/hub/meta-llama/Llama-3.1-8B/", uri, names)
    assert base_matches("meta-llama/Llama-3.1-8B", uri, names)
    assert base_matches("/home/me/llama-3.1-8b", uri, names)
    assert not base_matches("meta-llama/Llama-3.1-70B", uri, names)
    assert not base_matches("s3://bkt/hub/meta-llama/Llama-3.1-70B/", uri, names)
    assert not base_matches("s3://other/hub/meta-llama/Llama-3.1-8B/", uri, names)
    assert not base_matches("", uri, names)
    renamed = parse_model_uri("s3://bkt/llama8b/")
    assert base_matches("org/base-v2", renamed, {"s3://bkt/llama8b", "org/base-v2"})


@pytest.mark.parametrize(
    ("value", "part"),
    [
        ("loras/", "give the store prefix"),
        ("az://container/loras/", "adapters are served from s3://, gs:// only"),
        ("s3:/models/loras", "malformed"),
    ],
)
def test_lora_prefix_refused(value, part):
    with pytest.raises(errors.InvalidSettingError) as info:
        check_lora_prefix(value)
    assert part in str(info.value) and repr(value) in str(info.value)


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
    store = ObjectStoreConfig(**_store(s3_server))
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


# --- one engine: the adapter served, fetched with the config's settings -----------------------
@pytest.mark.e2e
@pytest.mark.engine
@pytest.mark.s3
def test_engine_serves_the_adapter_from_the_same_store(s3_server, tiny_models, work, tmp_path):
    """Real Ray, real CPU vLLM, the store set only in the config: each question asked of
    the base model, of ``loud`` and of ``zero``. ``loud``'s answers differ from the base
    model's, ``zero``'s equal them; the store served each adapter's files, signed with the
    config's keys, and no adapter weight was left on local disk."""
    model = tiny_models["single"]
    lora_path = upload_adapters(
        s3_server, tmp_path, model.uri, {"loud": {"b_scale": 1.0}, "zero": {"b_scale": 0.0}}
    )
    questions = ["What is 2+2?", "Name three primary colors.", "Say hello in French."]
    spec = {
        "model": model.uri,
        "lora_path": lora_path,
        "adapters": ["loud", "zero"],
        "questions": questions,
        "max_tokens": 8,
        "ray_temp_dir": str(work / "ray"),
        "object_store": _store(s3_server),
    }
    (work / "spec.json").write_text(json.dumps(spec))
    log = AccessLog(s3_server)
    start = time.time()
    proc = run_isolated(
        [sys.executable, str(DRIVER), str(work / "spec.json"), str(work / "out.json")],
        work,
        timeout=600,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    rows = json.loads((work / "out.json").read_text())["rows"]
    assert len(rows) == 3 * len(questions)
    answers = {(r["model"], r["question"]): r["answer"] for r in rows}
    base = {q: answers[(model.uri, q)] for q in questions}
    loud = {q: answers[("loud", q)] for q in questions}
    zero = {q: answers[("zero", q)] for q in questions}
    assert all(base.values()), base
    assert zero == base, (zero, base)
    assert all(loud[q] != base[q] for q in questions), (loud, base)

    prefix = lora_path[len("s3://models/") :]
    served = [r for r in log.requests() if r.key.startswith(prefix) and r.method == "GET"]
    got = {r.key for r in served if r.status == 200}
    for name in ("loud", "zero"):
        assert f"{prefix}{name}/adapter_model.safetensors" in got, sorted(got)
        assert f"{prefix}{name}/adapter_config.json" in got, sorted(got)
    assert {r.identity for r in served} == {"admin"}, served
    wait_regions_released(start)

    def adapter_files() -> list[str]:
        return [p for p in weight_files_written([work, Path("/tmp")], start) if "adapter" in p]

    # the engine's directory is removed by its janitor once the engine's processes are gone
    wait_until(lambda: not adapter_files(), 60, lambda: f"adapter files left: {adapter_files()}")
