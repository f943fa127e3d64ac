"""az:// against Azurite (npm azurite, blob service over HTTPS on 127.0.0.1): the metadata
fetch, inspect_model, the typed errors, and the Run:ai streamer's Azure backend
(runai-model-streamer-azure 0.17.0 beside streamer 0.17.1) reading the weights, each
driven by ObjectStoreConfig alone (no Azure or AWS variable in the environment).

The streamer's C++ reader ignores connection strings, requests https://<account>.<suffix>
only and trusts only the system CA bundle (/etc/ssl/certs/ca-certificates.crt;
SSL_CERT_FILE and CURL_CA_BUNDLE are ignored). So Azurite runs over HTTPS with a
certificate made here; the Python clients reach it path-style through the connection
string, the reader at https://devstoreaccount1.localhost:<port> (azure_endpoint_suffix;
curl resolves *.localhost to 127.0.0.1), and the streaming test runs the reader in a
private mount namespace where that bundle also holds the certificate (skipped where
unshare cannot). What was read is taken from Azurite's access log."""

from __future__ import annotations

import os
import time

# Installed by `make setup` (requirements/azure.txt): missing, these tests fail, never skip.
import azure.storage.blob  # noqa: F401
import pytest
import runai_model_streamer_azure  # noqa: F401
from helpers.emulators import (
    AZURITE_ACCOUNT,
    AZURITE_KEY,
    Azurite,
    check_inspect,
    check_metadata_fetch,
    check_stream,
    parsed_metadata,
    trusting,
)

from ray_stream_llm import fetch_model_metadata, inspect_model
from ray_stream_llm.errors import AccessDeniedError, ModelNotFoundError, StoreUnreachableError
from ray_stream_llm.stores.settings import ObjectStoreConfig, derive_settings
from ray_stream_llm.tools.localstore import free_ports

pytestmark = [pytest.mark.azure]

CONTAINER = "models"


# the fixtures azurite, az_models and no_store_env: tests/conftest.py


def _store(azurite: Azurite, **overrides) -> ObjectStoreConfig:
    fields = dict(
        azure_connection_string=azurite.connection_string,
        ca_bundle=str(azurite.cert),
        azure_endpoint_suffix=azurite.reader_suffix,
    )
    return ObjectStoreConfig(**{**fields, **overrides})


@pytest.mark.parametrize("layout", ["sharded", "hub-mirror"])
def test_fetch_writes_exactly_the_metadata_and_reads_no_weight(
    azurite, az_models, no_store_env, tmp_path, layout
):
    check_metadata_fetch(azurite, az_models[layout], _store(azurite), tmp_path / "meta")


def test_inspect_model_reads_only_the_shard_headers(azurite, az_models, no_store_env):
    model = az_models["sharded"]
    served: dict[str, int] = {}
    for r in check_inspect(azurite, model, _store(azurite)):
        served[r.uri] = served.get(r.uri, 0) + (r.bytes or 0)
    # the JSON files the engines parse, whole; each shard's header (two ranged GETs)
    assert served == {
        model.uri + name: (model.local / name).stat().st_size
        for name in parsed_metadata(model.local)
    } | {
        model.uri + p.name: 8 + int.from_bytes(p.read_bytes()[:8], "little")
        for p in model.local.glob("*.safetensors")
    }


def test_derived_settings_reach_the_streamer_reader(azurite):
    """The reader ignores AZURE_STORAGE_CONNECTION_STRING: its account and key are derived
    from the connection string, its endpoint from azure_endpoint_suffix."""
    settings = derive_settings(_store(azurite))
    assert settings.env == {
        "AWS_CA_BUNDLE": str(azurite.cert),
        "AZURE_STORAGE_CONNECTION_STRING": azurite.connection_string,
        "AZURE_STORAGE_ACCOUNT_NAME": AZURITE_ACCOUNT,
        "AZURE_STORAGE_ACCOUNT_KEY": AZURITE_KEY,
        "AZURE_STORAGE_ENDPOINT_SUFFIX": f"localhost:{azurite.port}",
        "REQUESTS_CA_BUNDLE": str(azurite.cert),  # the actors' client, the streamer's listing
    }
    assert settings.secret_env == {"AZURE_STORAGE_CONNECTION_STRING", "AZURE_STORAGE_ACCOUNT_KEY"}


def test_streamer_reads_every_tensor_from_azurite(azurite, az_models, tmp_path):
    """The streamer's Azure backend (Python listing, C++ reader), given the derived variables
    (with ca_bundle as REQUESTS_CA_BUNDLE, for the Python listing) and, for Azurite's
    self-signed certificate, the system bundle (in a private mount namespace) for the
    reader."""
    prefix = trusting(azurite.cert, tmp_path)
    if prefix is None:
        pytest.skip(
            "no private mount namespace here (unshare --mount --map-root-user), so the "
            "reader cannot be made to trust Azurite's certificate"
        )
    model = az_models["sharded"]
    env = derive_settings(_store(azurite)).env
    served: dict[str, int] = {}
    for r in check_stream(azurite, model, env, tmp_path, prefix):
        served[r.uri] = served.get(r.uri, 0) + (r.bytes or 0)
    assert served == {
        model.uri + p.name: p.stat().st_size  # each weight byte served once
        for p in model.local.glob("*.safetensors")
    }


def test_missing_container(azurite, az_models, no_store_env):
    with pytest.raises(ModelNotFoundError) as err:
        fetch_model_metadata("az://no-such-container/tiny/sharded/", object_store=_store(azurite))
    assert "container 'no-such-container' does not exist" in str(err.value)
    assert azurite.endpoint in str(err.value)


def test_missing_prefix(azurite, az_models, no_store_env):
    with pytest.raises(ModelNotFoundError) as err:
        inspect_model(f"az://{CONTAINER}/tiny/Sharded/", object_store=_store(azurite))
    assert f"no objects under 'az://{CONTAINER}/tiny/Sharded/'" in str(err.value)


def test_wrong_key_is_access_denied(azurite, az_models, no_store_env):
    wrong = azurite.connection_string.replace(AZURITE_KEY, "d3Jvbmcta2V5" * 8)
    with pytest.raises(AccessDeniedError) as err:
        inspect_model(
            az_models["sharded"].uri, object_store=_store(azurite, azure_connection_string=wrong)
        )
    assert "access denied" in str(err.value) and "d3Jvbmcta2V5" not in str(err.value)


def test_closed_port_is_unreachable_within_seconds(azurite, no_store_env):
    (port,) = free_ports(1)
    closed = azurite.connection_string.replace(f":{azurite.port}/", f":{port}/")
    start = time.monotonic()
    with pytest.raises(StoreUnreachableError) as err:
        fetch_model_metadata(
            f"az://{CONTAINER}/m/", object_store=_store(azurite, azure_connection_string=closed)
        )
    assert (
        "cannot reach the object store (listing 'az://models/m/' at endpoint "
        f"'https://127.0.0.1:{port}/{AZURITE_ACCOUNT}')" in str(err.value)
    )
    # a refused connection is reported at once, not after the store's budget (30 s) runs
    # out: the typed error above is not a timeout, and it came before the budget
    assert time.monotonic() - start < ObjectStoreConfig().timeout_s


# --- the compile cache's store half (tests/helpers/compile_store.py), through this backend ---
def test_a_compile_artifact_shipped_to_az_is_fetched_whole_and_never_replaced(
    azurite, az_models, no_store_env, tmp_path
):
    from helpers import compile_store

    uri = compile_store.unique(f"az://{CONTAINER}/compile-cache/")
    compile_store.shipped_is_fetched_whole_and_never_replaced(uri, _store(azurite), tmp_path)


def test_a_damaged_compile_artifact_on_az_is_named_and_not_used(
    azurite, az_models, no_store_env, tmp_path, caplog
):
    from helpers import compile_store

    uri = compile_store.unique(f"az://{CONTAINER}/compile-cache/")
    compile_store.damaged_is_named_and_not_used(uri, _store(azurite), tmp_path, caplog)


# --- an object replaced between the listing and the read: ObjectChangedError, by name ------
@pytest.mark.parametrize("name", ["config.json", "model.safetensors"])
def test_an_object_replaced_after_the_listing_is_refused_by_name(
    azurite, tiny_layout, no_store_env, tmp_path, name
):
    from helpers.emulators import check_replaced_after_listing

    uri = f"az://{CONTAINER}/changed/{name}-{os.urandom(4).hex()}/"
    local = tiny_layout("single")
    check_replaced_after_listing(azurite, local, uri, _store(azurite), name, tmp_path / name)


# --- a store that stops answering: StoreTimeoutError naming the call, within the budget -----
def test_a_store_that_stops_answering_is_a_timeout_naming_the_call(
    azurite, az_models, no_store_env, tmp_path
):
    """Azurite behind a link that answers, then keeps everything a client sends from Azurite
    (HTTPS: the link cannot tell requests apart): the metadata fetch ends in
    StoreTimeoutError naming the listing, within the budget, one attempt's timeouts and 2 s
    for a back-off and this loaded machine's scheduling."""
    from helpers.links import TappedLink

    from ray_stream_llm.errors import StoreTimeoutError
    from ray_stream_llm.stores import StoreDeadline

    budget = 2.0  # below the clients' own timeouts: only the budget ends a call in the bound
    model = az_models["hub-mirror"]
    with TappedLink(azurite.port) as link:
        linked = azurite.connection_string.replace(f":{azurite.port}/", f":{link.port}/")
        inspect_model(model.uri, object_store=_store(azurite, azure_connection_string=linked))
        store = _store(azurite, azure_connection_string=linked, timeout_s=budget)
        link.hold()
        start = time.monotonic()
        with pytest.raises(StoreTimeoutError) as err:
            fetch_model_metadata(model.uri, tmp_path / "meta", object_store=store)
        elapsed = time.monotonic() - start
        assert link.held_requests
    message = str(err.value)
    assert f"listing {model.uri!r}" in message and "timeout_s" in message, message
    deadline = StoreDeadline(budget)
    bound = budget + deadline.connect_timeout + deadline.read_timeout + 2.0
    assert elapsed <= bound, f"{elapsed:.1f}s, budget {budget}s: {message}"
    assert not (tmp_path / "meta").exists()
