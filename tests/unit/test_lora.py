"""The LoRA match rule (issue 35 item 2; ray_stream_llm/lora.py), no server: the base a
model's adapters must name, and the prefixes refused. Against the store:
tests/integration/test_lora.py; served by an engine: tests/e2e/test_lora.py."""

from __future__ import annotations

import pytest

from ray_stream_llm import errors
from ray_stream_llm.lora import base_matches, check_lora_prefix
from ray_stream_llm.uri import parse_model_uri


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
