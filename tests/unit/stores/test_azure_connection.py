"""Azure connection strings and the variables the streamer's Azure reader needs instead
(ray_stream_llm/stores/azure_connection.py)."""

from __future__ import annotations

import pytest

from ray_stream_llm.stores.azure_connection import azure_connection_parts, azure_reader_env

KEY = "a2V5PT0="  # base64: ends in '=', which a naive split would cut


def test_parts_keep_values_that_hold_equals_signs():
    parts = azure_connection_parts(f"AccountName=acct; AccountKey={KEY};;EndpointSuffix=x")
    assert parts == {"AccountName": "acct", "AccountKey": KEY, "EndpointSuffix": "x"}


@pytest.mark.parametrize(
    ("connection", "suffix"),
    [
        (f"AccountName=acct;AccountKey={KEY}", "blob.core.windows.net"),
        (
            f"AccountName=acct;AccountKey={KEY};EndpointSuffix=core.chinacloudapi.cn",
            "blob.core.chinacloudapi.cn",
        ),
        (
            f"AccountName=acct;AccountKey={KEY};BlobEndpoint=https://acct.localhost:10000/",
            "localhost:10000",
        ),
        # path-style (Azurite's), plain http, or another account's host: the reader cannot
        (f"AccountName=acct;AccountKey={KEY};BlobEndpoint=https://127.0.0.1:10000/acct", None),
        (f"AccountName=acct;AccountKey={KEY};BlobEndpoint=http://acct.localhost:10000", None),
        (f"AccountName=acct;AccountKey={KEY};BlobEndpoint=https://other.localhost:10000", None),
    ],
)
def test_the_endpoint_suffix_the_reader_requests(connection, suffix):
    env = azure_reader_env(connection)
    assert env.get("AZURE_STORAGE_ENDPOINT_SUFFIX") == suffix
    assert env["AZURE_STORAGE_ACCOUNT_NAME"] == "acct"
    assert env["AZURE_STORAGE_ACCOUNT_KEY"] == KEY


def test_a_sas_token_is_passed_as_the_reader_reads_it():
    env = azure_reader_env("AccountName=acct;SharedAccessSignature=sv=2024&sig=abc%3D")
    assert env["AZURE_STORAGE_SAS_TOKEN"] == "sv=2024&sig=abc%3D"
    assert "AZURE_STORAGE_ACCOUNT_KEY" not in env
