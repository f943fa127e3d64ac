"""The GCS backend's settings, client and error translation (ray_stream_llm/stores/gcs.py):
no request is sent."""

from __future__ import annotations

import pytest
import requests
from google.api_core import exceptions as gexc
from google.auth.credentials import AnonymousCredentials
from pydantic import ValidationError

from ray_stream_llm.errors import (
    AccessDeniedError,
    ModelNotFoundError,
    StoreTimeoutError,
    StoreUnreachableError,
)
from ray_stream_llm.stores import gcs
from ray_stream_llm.stores.settings import ObjectStoreConfig, derive_settings
from ray_stream_llm.uri import parse_model_uri

URI = parse_model_uri("gs://bucket/models/llama/")
EMULATOR = "http://127.0.0.1:4443"


@pytest.fixture(autouse=True)
def no_gcs_environment(monkeypatch):
    for name in [
        "STORAGE_EMULATOR_HOST",
        "CLOUD_STORAGE_EMULATOR_ENDPOINT",
        "RUNAI_STREAMER_GCS_USE_ANONYMOUS_CREDENTIALS",
        "RUNAI_STREAMER_GCS_CREDENTIAL_FILE",
        "GOOGLE_APPLICATION_CREDENTIALS",
    ]:
        monkeypatch.delenv(name, raising=False)


def test_an_emulator_reaches_both_clients_unsigned():
    env = derive_settings(ObjectStoreConfig(gcs_emulator_endpoint=EMULATOR)).env
    assert env["STORAGE_EMULATOR_HOST"] == EMULATOR  # google-cloud-storage
    assert env["CLOUD_STORAGE_EMULATOR_ENDPOINT"] == EMULATOR  # the streamer's C++ reader
    assert env["RUNAI_STREAMER_GCS_USE_ANONYMOUS_CREDENTIALS"] == "1"
    assert "GOOGLE_APPLICATION_CREDENTIALS" not in env


def test_a_credentials_file_reaches_the_listing_and_the_streamer(tmp_path):
    keyfile = str(tmp_path / "sa.json")
    env = derive_settings(ObjectStoreConfig(gcs_credentials_file=keyfile)).env
    assert env["RUNAI_STREAMER_GCS_CREDENTIAL_FILE"] == keyfile
    assert env["GOOGLE_APPLICATION_CREDENTIALS"] == keyfile
    assert "RUNAI_STREAMER_GCS_USE_ANONYMOUS_CREDENTIALS" not in env


@pytest.mark.parametrize("other", [{"anonymous": True}, {"gcs_emulator_endpoint": EMULATOR}])
def test_a_credentials_file_with_unsigned_requests_is_refused(tmp_path, other):
    with pytest.raises(ValidationError) as info:
        ObjectStoreConfig(gcs_credentials_file=str(tmp_path / "sa.json"), **other)
    assert "gcs_credentials_file cannot go with" in str(info.value)


def test_the_client_of_an_emulator_is_anonymous_and_points_there():
    client = gcs.make_client(ObjectStoreConfig(gcs_emulator_endpoint=EMULATOR))
    assert isinstance(client._credentials, AnonymousCredentials)
    assert gcs.endpoint_of(client) == EMULATOR


def test_an_unreadable_credentials_file_is_access_denied_naming_the_file(tmp_path):
    keyfile = tmp_path / "sa.json"
    keyfile.write_text("{}")  # JSON, but no credentials type
    with pytest.raises(AccessDeniedError) as info:
        gcs.make_client(ObjectStoreConfig(gcs_credentials_file=str(keyfile)))
    assert repr(str(keyfile)) in str(info.value)
    assert "service-account JSON file" in str(info.value)


@pytest.mark.parametrize(
    ("etag", "precondition"),
    [
        ("1712345678901234", {"if_generation_match": 1712345678901234}),
        ("CJbQ6r3Z9YQDEAE=", {"if_etag_match": "CJbQ6r3Z9YQDEAE="}),
        ("", {}),
        (None, {}),
    ],
)
def test_a_read_is_pinned_to_the_listed_version(etag, precondition):
    assert gcs._pinned(etag) == precondition


@pytest.mark.parametrize(
    ("exc", "what", "cls", "words"),
    [
        (gexc.NotFound("no"), "listing", ModelNotFoundError, "bucket 'bucket' does not exist"),
        (gexc.NotFound("no"), "reading", ModelNotFoundError, "check the path"),
        (gexc.Forbidden("no"), "listing", AccessDeniedError, "gcs_credentials_file"),
        (requests.ConnectionError("refused"), "listing", StoreUnreachableError, "listing"),
        (requests.ReadTimeout("slow"), "listing", StoreTimeoutError, "listing"),
        (gexc.RetryError("gave up", cause=gexc.Forbidden("no")), "listing", AccessDeniedError, ""),
    ],
)
def test_errors_become_typed_errors_naming_the_uri_and_endpoint(exc, what, cls, words):
    client = gcs.make_client(ObjectStoreConfig(gcs_emulator_endpoint=EMULATOR))
    error = gcs.translate(exc, URI, client, what)
    assert type(error) is cls
    assert words in str(error)
    assert "gs://bucket/models/llama" in str(error) and EMULATOR in str(error)
