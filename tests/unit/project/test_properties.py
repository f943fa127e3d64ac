"""Property-based tests (issue 11): the URI parser, the key-safety rule, the safetensors
header parser, the index parser and the redaction rule, on arbitrary input: never an
untyped exception, never a path outside the destination, never a secret shown."""

from __future__ import annotations

import json
import os
import posixpath

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ray_stream_llm.errors import InvalidModelURIError, UnsafeObjectKeyError
from ray_stream_llm.manifest import index_problems, json_problem, parse_header
from ray_stream_llm.redact import redact
from ray_stream_llm.uri import ModelURI, parse_model_uri

SETTINGS = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
segment = st.text(alphabet=st.characters(codec="utf-8"), max_size=12)
uri_like = st.one_of(
    st.text(max_size=60),
    st.builds(
        lambda scheme, rest: f"{scheme}://{rest}",
        st.sampled_from(["s3", "gs", "az", "S3", "s3a", "http", "file", "x"]),
        st.lists(segment, max_size=5).map("/".join),
    ),
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)


@SETTINGS
@given(uri_like)
def test_uri_parser_raises_only_its_typed_error(text):
    try:
        uri = parse_model_uri(text)
    except InvalidModelURIError:
        return
    assert isinstance(uri, ModelURI)
    assert parse_model_uri(str(uri)) == uri  # normalised form parses to itself
    assert ".." not in uri.prefix.split("/") and "//" not in uri.prefix


@SETTINGS
@given(st.lists(segment, min_size=1, max_size=6).map("/".join) | st.text(max_size=40))
@example(".")  # found by this test once: the key "." named the destination itself
def test_key_safety_never_leaves_the_destination(path):
    uri = ModelURI("s3", "bucket", "model/")
    try:
        safe = uri.safe_relative(path)
    except UnsafeObjectKeyError as exc:
        assert repr(uri.key(path)) in str(exc)
        return
    dest = "/cache/models/abc"
    joined = posixpath.normpath(posixpath.join(dest, safe))
    assert joined.startswith(dest + "/") and "\x00" not in safe
    assert os.path.basename(joined)  # names a file, not the directory itself


@SETTINGS
@given(st.binary(max_size=200), st.integers(min_value=0, max_value=1 << 40))
def test_header_parser_on_arbitrary_bytes(raw, size):
    count, problem = parse_header("model.safetensors", size, len(raw), raw)
    assert isinstance(count, int) and count >= 0
    assert problem is None or "model.safetensors" in problem


@SETTINGS
@given(json_values, st.integers(min_value=8, max_value=1 << 20))
def test_header_parser_on_arbitrary_json(value, size):
    raw = json.dumps(value).encode()
    count, problem = parse_header("x.safetensors", size, len(raw), raw)
    assert count >= 0 and (problem is None or "x.safetensors" in problem)


@SETTINGS
@given(
    json_values | st.dictionaries(st.just("weight_map"), json_values),
    st.sets(st.sampled_from(["a.safetensors", "b.safetensors", "../c.safetensors"])),
)
def test_index_parser_on_arbitrary_json(value, shards):
    problems = index_problems(json.dumps(value).encode(), shards)
    assert all(isinstance(p, str) and p for p in problems)


@SETTINGS
@given(st.binary(max_size=300))
def test_index_and_config_parsers_on_arbitrary_bytes(raw):
    assert all(isinstance(p, str) for p in index_problems(raw, {"a.safetensors"}))
    problem = json_problem("config.json", raw, "model")
    assert problem is None or "config.json" in problem


@SETTINGS
@given(
    st.sampled_from(["s3", "gs", "az", "https", "http"]),
    st.text(alphabet="abcdefghijklmnopqrstuvwxyzABCDEF0123456789+/", min_size=8, max_size=30),
    st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-", min_size=3, max_size=20),
)
def test_redaction_hides_user_info_and_queries(scheme, secret, host):
    secret = "SeCrEt" + secret  # never a substring of the (lower-case) host
    token = secret.replace("/", "")  # a bare token with '/' would read as a path with '@'
    for text, hidden in (
        (f"{scheme}://AKIA:{secret}@{host}/m/", secret),
        (f"{scheme}://{host}/m/x?sig={secret}", secret),
        (f"got '{scheme}://{token}@{host}' here", token),
        (f"AccountName=a;AccountKey={secret};EndpointSuffix=core.windows.net", secret),
    ):
        assert hidden not in redact(text), text
    try:
        parse_model_uri(f"{scheme}://AKIA:{secret}@{host}/m/")
    except InvalidModelURIError as exc:
        assert secret not in str(exc)
