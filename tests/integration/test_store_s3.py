"""ObjectStoreConfig against the real S3 server: the settings alone, no AWS variable in the
environment, drive the metadata fetch and the Run:ai streamer itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.jobs import store_through

from ray_stream_llm import fetch_model_metadata
from ray_stream_llm.errors import AccessDeniedError, MissingBackendError
from ray_stream_llm.stores.settings import ObjectStoreConfig, derive_settings

pytestmark = [pytest.mark.s3]


def _store(server, host="127.0.0.1", **overrides):
    endpoint = server.endpoint_url.replace("127.0.0.1", host)
    return ObjectStoreConfig(**{**store_through(server, endpoint), **overrides})


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
def test_fetch_with_settings_only_in_config(s3_server, tiny_models, no_aws_env, host):
    model = tiny_models["single"]
    path = fetch_model_metadata(model.uri, object_store=_store(s3_server, host))
    got = {str(p.relative_to(path)) for p in path.rglob("*") if p.is_file()}
    assert got - {".ray_stream_llm.json"} == set(model.metadata)


@pytest.mark.parametrize(
    "overrides, fragment",
    [
        ({"aws_secret_access_key": "wrong-secret-0123456789"}, "secret key does not match"),
        (
            {"aws_access_key_id": "AKUNKNOWN0000000", "aws_secret_access_key": "x" * 40},
            "access key id is not known",
        ),
        (
            {"aws_access_key_id": None, "aws_secret_access_key": None, "anonymous": True},
            "access denied",
        ),
    ],
    ids=["wrong-secret", "unknown-key", "anonymous-private-bucket"],
)
def test_bad_credentials_in_config(s3_server, tiny_models, no_aws_env, overrides, fragment):
    store = _store(s3_server, **overrides)
    with pytest.raises(AccessDeniedError) as err:
        fetch_model_metadata(tiny_models["single"].uri, object_store=store)
    assert fragment in str(err.value)
    assert s3_server.secret_access_key not in str(err.value)
    assert "wrong-secret-0123456789" not in str(err.value)


STREAM = """
import json, sys
from runai_model_streamer import SafetensorsStreamer, list_safetensors
files = list_safetensors(sys.argv[1])
with SafetensorsStreamer() as streamer:
    streamer.stream_files(files)
    n = sum(1 for _ in streamer.get_tensors())
print(json.dumps({"files": len(files), "tensors": n}))
"""


def _stream(uri: str, env: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess:
    clean = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), **env}
    return subprocess.run(
        [sys.executable, "-c", STREAM, uri], env=clean, capture_output=True, text=True, timeout=120
    )


def test_derived_env_drives_the_streamer_against_localhost(s3_server, tiny_models, tmp_path):
    """The streamer, given only the derived variables, reads every shard from 'localhost'."""
    model = tiny_models["sharded"]
    env = derive_settings(_store(s3_server, "localhost")).env
    assert env["RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING"] == "0"
    proc = _stream(model.uri, env, tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    shards = [w for w in model.weights if w.endswith(".safetensors")]
    assert result["files"] == len(shards) and result["tensors"] > 0


def test_virtual_addressing_against_localhost_fails_as_documented(s3_server, tiny_models, tmp_path):
    """Why 'auto' picks path style for localhost: the streamer's default fails there."""
    env = derive_settings(_store(s3_server, "localhost", addressing_style="virtual")).env
    proc = _stream(tiny_models["single"].uri, env, tmp_path)
    # the streamer itself failed to reach the object (not an import or a usage error): its
    # C++ reader's answer, relayed by the Python package
    assert proc.returncode != 0
    assert "Could not receive response from libstreamer" in proc.stderr, proc.stderr[-2000:]
    assert "File access error" in proc.stderr.splitlines()[-1], proc.stderr[-2000:]


@pytest.mark.parametrize(
    "uri, package",
    [
        ("gs://bkt/model/", "runai-model-streamer-gcs"),
        ("az://container/model/", "runai-model-streamer-azure"),
    ],
)
def test_missing_backend_names_the_pip_line(uri, package, no_aws_env, monkeypatch):
    monkeypatch.setitem(sys.modules, package.replace("-", "_"), None)  # as if not installed
    with pytest.raises(MissingBackendError) as err:
        fetch_model_metadata(uri)
    assert package in str(err.value) and "pip install" in str(err.value)
    assert isinstance(err.value, ImportError)


def test_gcs_through_s3_interoperability(s3_server, tiny_models, no_aws_env):
    """A GCS bucket through its S3 endpoint and HMAC keys is an s3:// URI with an endpoint
    (here the local server stands in for storage.googleapis.com)."""
    model = tiny_models["single"]
    store = _store(s3_server, addressing_style="path")
    path = fetch_model_metadata(model.uri, object_store=store)
    got = {str(p.relative_to(path)) for p in path.rglob("*") if p.is_file()}
    assert got - {".ray_stream_llm.json"} == set(model.metadata)


BUILD_IN_JOB = """
import json, sys
import ray
from ray_stream_llm import ObjectStoreConfig, StreamingvLLMEngineProcessorConfig
from ray_stream_llm import build_llm_processor
uri, store = sys.argv[1], json.loads(sys.argv[2])
config = StreamingvLLMEngineProcessorConfig(
    model_source=uri, engine_kwargs={"load_format": "runai_streamer"},
    object_store=ObjectStoreConfig(**store))
processor = build_llm_processor(config)
print(json.dumps({name: {"env": stage.map_batches_kwargs["runtime_env"]["env_vars"],
                         "kwargs": repr(stage.map_batches_kwargs),
                         "secret_env": repr(stage.fn_constructor_kwargs.get("secret_env"))}
                  for name, stage in processor.stages.items()}))
ray.shutdown()
"""


@pytest.mark.e2e
def test_builds_inside_a_ray_job_whose_runtime_env_sets_the_same_variable(s3_server, tiny_models):
    """Regression: the derived variables went into the processor's runtime_env, which Ray's
    builder hands to ray.init, and Ray refuses to merge that with a job's runtime_env that
    sets the same variable (even to the same value). They now go into each stage's own.
    The driver runs as a job's driver does (RAY_JOB_CONFIG_JSON_ENV_VAR), in a subprocess
    whose temporary files stay in one short directory."""
    import shutil
    import tempfile

    work = tempfile.mkdtemp(prefix="rsl-job-", dir="/tmp")  # short: Ray socket paths
    store = store_through(s3_server)
    env = {
        "PATH": os.environ["PATH"],
        "HOME": work,
        "TMPDIR": work,
        "RAY_TMPDIR": work,
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_STREAM_LLM_CACHE": f"{work}/cache",
        "RAY_JOB_CONFIG_JSON_ENV_VAR": json.dumps(
            {"runtime_env": {"env_vars": {"AWS_REGION": s3_server.region}}}
        ),
    }
    try:
        proc = subprocess.run(
            [sys.executable, "-c", BUILD_IN_JOB, tiny_models["single"].uri, json.dumps(store)],
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        stages = json.loads(proc.stdout.strip().splitlines()[-1])
        assert len(stages) >= 3
        for name, stage in stages.items():
            assert stage["env"]["AWS_ENDPOINT_URL"] == s3_server.endpoint_url, name
            assert "AWS_SECRET_ACCESS_KEY" not in stage["env"]
            assert s3_server.secret_access_key not in stage["kwargs"] + stage["secret_env"]
            assert "AWS_SECRET_ACCESS_KEY" in stage["secret_env"]
        assert s3_server.secret_access_key not in proc.stdout + proc.stderr
    finally:
        shutil.rmtree(work, ignore_errors=True)


# --- an object replaced between the listing and the read: ObjectChangedError, by name ------
@pytest.mark.parametrize("name", ["config.json", "model.safetensors"])
def test_an_object_replaced_after_the_listing_is_refused_by_name(
    s3_server, tiny_models, no_aws_env, tmp_path, name
):
    from helpers.emulators import check_replaced_after_listing

    uri = f"s3://models/tiny/changed/{name}-{os.urandom(4).hex()}/"
    local = tiny_models["single"].local
    check_replaced_after_listing(s3_server, local, uri, _store(s3_server), name, tmp_path / name)


def test_metadata_replaced_between_the_listing_and_its_download_is_never_published(
    s3_server, tiny_models, no_aws_env, tmp_path
):
    """The metadata fetch lists the model, then downloads each file: config.json replaced in
    that gap by bytes of the same size (its GET held by the link until the new version is
    in) ends the fetch with ObjectChangedError naming it, and nothing lands in the
    destination. (Before: the download was not pinned to the listed ETag, and the new
    version was published under the old one's ETag, beside the old version's other files.)"""
    import threading

    from helpers.links import TappedLink
    from helpers.s3log import copy_model
    from helpers.waiting import wait_until

    from ray_stream_llm.errors import ObjectChangedError
    from ray_stream_llm.fetch import fetch_metadata_report

    model = copy_model(s3_server, tiny_models["single"], "changed-fetch")
    dest = tmp_path / "out" / "meta"
    size = (model.local / "config.json").stat().st_size
    # the same size: only the ETag tells the versions apart
    new = b'{"pad": "' + os.urandom(size).hex().encode()[: size - 11] + b'"}'
    assert len(new) == size
    outcome: list[BaseException | object] = []
    with TappedLink(s3_server.port) as link:
        store = _store(s3_server, endpoint_url=link.endpoint_url)
        link.hold(r"^GET \S*/config\.json(\?|$)")

        def fetch() -> None:
            try:
                outcome.append(fetch_metadata_report(model.uri, dest, object_store=store))
            except BaseException as exc:
                outcome.append(exc)

        thread = threading.Thread(target=fetch, daemon=True)
        thread.start()
        wait_until(lambda: link.held_requests, 15, lambda: f"no GET held: {link.requests}")
        assert any(r.startswith("GET") and "list-type=2" in r for r in link.requests)
        s3_server.put(model.uri + "config.json", new)  # straight to the store
        link.release()
        thread.join(timeout=30)
    assert not thread.is_alive()
    [error] = outcome
    assert isinstance(error, ObjectChangedError), error
    assert "'config.json'" in str(error) and repr(model.uri) in str(error)
    written = [p for p in (tmp_path / "out").rglob("*") if p.is_file()]
    assert [p for p in written if new in p.read_bytes()] == []
    assert not dest.exists(), sorted(map(str, written))
