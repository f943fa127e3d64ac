"""The Azure backend's settings, client and error translation (ray_stream_llm/stores/azure.py):
no request is sent."""

from __future__ import annotations

import pytest
from azure.core import exceptions as aexc
from pydantic import ValidationError

from ray_stream_llm.errors import AccessDeniedError, ModelNotFoundError, StoreUnreachableError
from ray_stream_llm.stores import azure
from ray_stream_llm.stores.settings import ObjectStoreConfig, derive_settings
from ray_stream_llm.uri import parse_model_uri

KEY = "c2VjcmV0LWtleQ=="
URI = parse_model_uri("az://models/llama/")


@pytest.fixture(autouse=True)
def no_azure_environment(monkeypatch):
    for name in [
        "AZURE_STORAGE_CONNECTION_STRING",
        "AZURE_STORAGE_ACCOUNT_NAME",
        "AZURE_STORAGE_ACCOUNT_KEY",
        "AZURE_STORAGE_SAS_TOKEN",
        "AZURE_STORAGE_ENDPOINT_SUFFIX",
        azure.CA_ENV,
    ]:
        monkeypatch.delenv(name, raising=False)


def test_a_connection_string_gives_the_reader_its_parts_as_secrets():
    connection = f"AccountName=acct;AccountKey={KEY};EndpointSuffix=core.windows.net"
    settings = derive_settings(ObjectStoreConfig(azure_connection_string=connection))
    assert settings.env["AZURE_STORAGE_CONNECTION_STRING"] == connection
    assert settings.env["AZURE_STORAGE_ACCOUNT_NAME"] == "acct"
    assert settings.env["AZURE_STORAGE_ACCOUNT_KEY"] == KEY
    assert settings.env["AZURE_STORAGE_ENDPOINT_SUFFIX"] == "blob.core.windows.net"
    assert {"AZURE_STORAGE_CONNECTION_STRING", "AZURE_STORAGE_ACCOUNT_KEY"} <= settings.secret_env
    assert "AZURE_STORAGE_ACCOUNT_NAME" not in settings.secret_env


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        (
            {
                "azure_connection_string": f"AccountName=a;AccountKey={KEY}",
                "azure_account_key": KEY,
            },
            "not both",
        ),
        (
            {
                "azure_connection_string": f"AccountName=a;AccountKey={KEY}",
                "azure_account_name": "b",
            },
            "'b' but the connection string names account 'a'",
        ),
        (
            {
                "azure_connection_string": (
                    f"AccountName=a;AccountKey={KEY};BlobEndpoint=http://127.0.0.1:10000/a"
                )
            },
            "set azure_endpoint_suffix",
        ),
    ],
)
def test_contradicting_settings_are_refused_with_the_fix(fields, words):
    with pytest.raises(ValidationError) as info:
        ObjectStoreConfig(**fields)
    assert words in str(info.value)
    assert KEY not in str(info.value)


def test_a_path_style_endpoint_passes_with_a_suffix_given():
    connection = f"AccountName=a;AccountKey={KEY};BlobEndpoint=http://127.0.0.1:10000/a"
    store = ObjectStoreConfig(azure_connection_string=connection, azure_endpoint_suffix="x:1")
    assert derive_settings(store).env["AZURE_STORAGE_ENDPOINT_SUFFIX"] == "x:1"


def test_the_client_requests_the_account_url_the_streamer_requests():
    store = ObjectStoreConfig(
        azure_account_name="acct", azure_account_key=KEY, azure_endpoint_suffix="localhost:10000"
    )
    client = azure.make_client(store)
    assert client.url.rstrip("/") == "https://acct.localhost:10000"
    assert client.credential.account_name == "acct"
    assert azure.endpoint_of(client) == "https://acct.localhost:10000"


def test_no_account_is_a_typed_error_with_the_fix():
    with pytest.raises(AccessDeniedError) as info:
        azure.make_client(ObjectStoreConfig())
    assert "no Azure storage account given" in str(info.value)
    assert "azure_account_name" in str(info.value)


def _container_missing() -> aexc.ResourceNotFoundError:
    exc = aexc.ResourceNotFoundError("The specified container does not exist.")
    exc.error_code = "ContainerNotFound"
    return exc


@pytest.mark.parametrize(
    ("exc", "cls", "words"),
    [
        (_container_missing(), ModelNotFoundError, "container 'models' does not exist"),
        (aexc.ResourceNotFoundError("gone"), ModelNotFoundError, "check the path"),
        (aexc.ClientAuthenticationError("no"), AccessDeniedError, "Storage Blob Data Reader"),
        (aexc.ServiceRequestError("refused"), StoreUnreachableError, "az://models/llama"),
    ],
)
def test_errors_become_typed_errors_naming_the_uri_and_endpoint(exc, cls, words):
    client = azure.make_client(ObjectStoreConfig(azure_account_name="acct", azure_account_key=KEY))
    error = azure.translate(exc, URI, client, "listing")
    assert type(error) is cls
    assert words in str(error) and "https://acct.blob.core.windows.net" in str(error)
