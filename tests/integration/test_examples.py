"""examples/job_submission/'s entrypoint builds its store settings from the variables the
shipped ``runtime_env.yaml`` names (the job itself: tests/e2e/test_examples.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.examples import JOB_DIR, load_entrypoint

pytestmark = [pytest.mark.s3, pytest.mark.e2e]


def test_job_entrypoint_store_settings(monkeypatch):
    """Without Ray: where entrypoint.py takes the store settings from, and its early errors."""
    from ray_stream_llm import ObjectStoreConfig

    entry = load_entrypoint()
    for name in (
        "AWS_ENDPOINT_URL",
        "AWS_REGION",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "RAY_JOB_CONFIG_JSON_ENV_VAR",
        "RSL_MODEL_URI",
        "RSL_OUTPUT_DIR",
    ):
        monkeypatch.delenv(name, raising=False)
    args = entry.parse_args(["s3://m/x/", "/tmp/out"])
    assert entry.object_store_from(args) is None  # the environment is all there is
    # the shipped runtime_env's placeholders, unfilled: refused, naming them
    import yaml

    shipped = yaml.safe_load((JOB_DIR / "runtime_env.yaml").read_text())["env_vars"]
    for name in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(name, shipped[name])
    with pytest.raises(
        SystemExit, match="AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY"
    ):
        entry.object_store_from(args)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    # endpoint and region as arguments: an ObjectStoreConfig, path style for an IP endpoint
    args = entry.parse_args(
        [
            "s3://m/x/",
            "/tmp/out",
            "--endpoint-url",
            "http://127.0.0.1:9000",
            "--region",
            "eu-west-1",
        ]
    )
    store = entry.object_store_from(args)
    assert isinstance(store, ObjectStoreConfig)
    assert (store.endpoint_url, store.region_name, store.aws_access_key_id) == (
        "http://127.0.0.1:9000",
        "eu-west-1",
        None,
    )  # keys: from the environment only
    assert store.resolved_addressing_style() == "path"
    # ... and also in the job's runtime_env: refused before Ray's own, secret-printing error
    job = {"runtime_env": {"env_vars": {"AWS_REGION": "eu-west-1", "AWS_SECRET_ACCESS_KEY": "s"}}}
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", json.dumps(job))
    with pytest.raises(SystemExit, match="set AWS_REGION, which the job's runtime_env sets too"):
        entry.object_store_from(args)
    # a relative output directory would land in Ray's temporary copy of working_dir
    assert entry._output_path("results") == str(Path.cwd() / "results")
    with pytest.raises(SystemExit):
        entry.parse_args([])
