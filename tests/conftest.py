"""Shared pytest fixtures."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from models import LAYOUTS, UploadedModel, build_layout, metadata_files, weight_files
from ray_stream_llm._localstore import LocalS3Server

# --- local S3 server (SeaweedFS) and tiny models on it ------------------------------------
MODELS_BUCKET = "models"


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalS3Server]:
    """A real S3 server on 127.0.0.1 for the whole session, stopped (by PID) at the end."""
    server = LocalS3Server(tmp_path_factory.mktemp("s3server"))
    with server:
        pid = server.pid
        yield server
    assert pid is not None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


@pytest.fixture(scope="session")
def tiny_models(s3_server: LocalS3Server,
                tmp_path_factory: pytest.TempPathFactory) -> dict[str, UploadedModel]:
    """Each layout of tests/models.py, built once and uploaded to s3://models/tiny/<name>/."""
    root = tmp_path_factory.mktemp("tiny-models")
    uploaded = {}
    for name in LAYOUTS:
        local = build_layout(name, root / name)
        uri = f"s3://{MODELS_BUCKET}/tiny/{name}/"
        s3_server.upload_dir(local, uri)
        uploaded[name] = UploadedModel(name=name, uri=uri, local=local,
                                       metadata=metadata_files(local), weights=weight_files(local))
    return uploaded


@pytest.fixture
def s3_env(monkeypatch: pytest.MonkeyPatch, s3_server: LocalS3Server,
           tmp_path: Path) -> dict[str, str]:
    """os.environ pointed at the test S3 server (and nothing else), with a private cache dir."""
    for var in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN",
                "AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE"):
        monkeypatch.delenv(var, raising=False)
    env = {**s3_server.env(),
           "AWS_CONFIG_FILE": str(tmp_path / "no-aws-config"),
           "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "no-aws-credentials"),
           "RAY_STREAM_LLM_CACHE": str(tmp_path / "cache")}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return env
