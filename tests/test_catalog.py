"""The catalog of bad inputs (issue 4): each ends in its typed error on the driver, within
seconds, before Ray starts (so before any actor or GPU is taken). Run against the real S3
server with the settings only in the config.

docs/errors.md is this catalog as a table; ``test_docs_table_matches_catalog`` keeps them in
step. Regenerate it from real messages with: RSL_WRITE_CATALOG=1 make test
"""

from __future__ import annotations

import http.server
import os
import re
import shutil
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ray_stream_llm import (
    ObjectStoreConfig,
    StreamingvLLMEngineProcessorConfig,
    build_llm_processor,
    errors,
)

pytestmark = [pytest.mark.s3]

DOCS = Path(__file__).resolve().parent.parent / "docs" / "errors.md"
MESSAGES: dict[str, tuple[str, str]] = {}


@dataclass
class Case:
    id: str
    input: str  # for the docs table
    error: type
    fragment: str  # must appear in the message
    model: str = "s3://models/tiny/single/"
    prepare: Callable | None = None  # (server, tiny_models) -> model uri
    engine_kwargs: dict = field(default_factory=dict)
    store: Callable | None = None  # (server) -> ObjectStoreConfig


def _upload_variant(server, tiny, name: str, edit: Callable[[Path], None]) -> str:
    root = Path(server.root) / "variants" / name
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(tiny.local, root)
    edit(root)
    uri = f"s3://models/bad/{name}/"
    server.upload_dir(root, uri)
    return uri


def _variant(source: str, edit: Callable[[Path], None]):
    def prepare(server, tiny_models, name):
        return _upload_variant(server, tiny_models[source], name, edit)

    return prepare


def _keep(*names):
    def edit(root: Path):
        for p in list(root.rglob("*")):
            if p.is_file() and str(p.relative_to(root)) not in names:
                p.unlink()

    return edit


def _drop_one_shard(root: Path):
    sorted(root.glob("model-*.safetensors"))[-1].unlink()


def _truncate(root: Path):
    p = root / "model.safetensors"
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])


def _bad_header(root: Path):
    (root / "model.safetensors").write_bytes(
        struct.pack("<Q", 16) + b"this is not json" + b"\0" * 64
    )


def _empty(root: Path):
    (root / "model.safetensors").write_bytes(b"")


def _bin_only(root: Path):
    (root / "model.safetensors").rename(root / "pytorch_model.bin")


def _no_weights(root: Path):
    (root / "model.safetensors").unlink()
    (root / "README.md").write_text("weights elsewhere\n")


def _pre_sharded(root: Path):
    data = (root / "model.safetensors").read_bytes()
    (root / "model.safetensors").unlink()
    for rank in (0, 1):
        (root / f"model-rank-{rank}-part-0.safetensors").write_bytes(data)


def _closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def _good(server, **overrides):
    fields = dict(
        endpoint_url=server.endpoint_url,
        region_name=server.region,
        aws_access_key_id=server.access_key_id,
        aws_secret_access_key=server.secret_access_key,
    )
    fields.update(overrides)
    return ObjectStoreConfig(**fields)


STREAM = {"load_format": "runai_streamer"}
CASES = [
    Case(
        "malformed-uri",
        "`model_source='s3:/models/m'`",
        errors.InvalidModelURIError,
        "malformed",
        model="s3:/models/tiny/single",
    ),
    Case(
        "unsupported-scheme",
        "`model_source='ftp://models/m/'`",
        errors.InvalidModelURIError,
        "unsupported scheme",
        model="ftp://models/tiny/single/",
    ),
    Case(
        "hadoop-scheme",
        "`model_source='s3a://models/m/'`",
        errors.InvalidModelURIError,
        "use s3://models/tiny/single/",
        model="s3a://models/tiny/single/",
    ),
    Case(
        "http-url",
        "a presigned `https://...?X-Amz-Signature=...` URL",
        errors.InvalidModelURIError,
        "endpoint separately",
        model="https://127.0.0.1/models/m?X-Amz-Signature=SIG",
    ),
    Case(
        "bucket-missing",
        "`s3://no-such-bucket/m/`",
        errors.ModelNotFoundError,
        "bucket 'no-such-bucket' does not exist",
        model="s3://no-such-bucket/m/",
    ),
    Case(
        "prefix-missing",
        "`s3://models/does/not/exist/`",
        errors.ModelNotFoundError,
        "no objects under",
        model="s3://models/does/not/exist/",
    ),
    Case(
        "no-config-json",
        "a prefix with weights but no `config.json`",
        errors.ModelNotFoundError,
        "has no config.json",
        prepare=_variant("single", _keep("model.safetensors")),
    ),
    Case(
        "no-weights",
        "`config.json` and a README, no weights",
        errors.NotStreamableError,
        "no weight files at all",
        prepare=_variant("single", _no_weights),
    ),
    Case(
        "bin-only",
        "only `pytorch_model.bin`",
        errors.NotStreamableError,
        "save_pretrained(dir, safe_serialization=True)",
        prepare=_variant("single", _bin_only),
    ),
    Case(
        "index-missing-shard",
        "the index names a shard that is not in the store",
        errors.NotStreamableError,
        "names shard(s) missing",
        prepare=_variant("sharded", _drop_one_shard),
    ),
    Case(
        "truncated-shard",
        "a shard cut to half its length",
        errors.NotStreamableError,
        "truncated",
        prepare=_variant("single", _truncate),
    ),
    Case(
        "header-not-json",
        "a shard whose header is not JSON",
        errors.NotStreamableError,
        "not valid JSON",
        prepare=_variant("single", _bad_header),
    ),
    Case(
        "empty-object",
        "`model.safetensors` of 0 bytes",
        errors.NotStreamableError,
        "too short to be safetensors",
        prepare=_variant("single", _empty),
    ),
    Case(
        "endpoint-unreachable",
        "`endpoint_url` on a closed port",
        errors.StoreUnreachableError,
        "cannot reach the object store",
        store=lambda s: _good(s, endpoint_url=_closed_port()),
    ),
    Case(
        "endpoint-not-s3",
        "`endpoint_url` of a plain HTTP server",
        errors.StoreUnreachableError,
        "does not look like an S3 API endpoint",
        store="plain-http",
    ),
    Case(
        "wrong-secret",
        "a wrong `aws_secret_access_key`",
        errors.AccessDeniedError,
        "secret key does not match",
        store=lambda s: _good(s, aws_secret_access_key="wrong" * 8),
    ),
    Case(
        "unknown-key",
        "an access key id the store does not know",
        errors.AccessDeniedError,
        "access key id is not known",
        store=lambda s: _good(s, aws_access_key_id="AKUNKNOWN", aws_secret_access_key="x" * 40),
    ),
    Case(
        "anonymous-private",
        "`anonymous=True` against a private bucket",
        errors.AccessDeniedError,
        "access denied",
        store=lambda s: _good(
            s, aws_access_key_id=None, aws_secret_access_key=None, anonymous=True
        ),
    ),
    Case(
        "load-format-dash",
        "`load_format='runai-streamer'`",
        errors.UnsupportedLoadFormatError,
        "did you mean 'runai_streamer'",
        engine_kwargs={"load_format": "runai-streamer"},
    ),
    Case(
        "load-format-short",
        "`load_format='runai_stream'`",
        errors.UnsupportedLoadFormatError,
        "did you mean 'runai_streamer'",
        engine_kwargs={"load_format": "runai_stream"},
    ),
    Case(
        "tuning-out-of-range",
        "`model_loader_extra_config={'concurrency': 0}`",
        errors.InvalidSettingError,
        "must be a positive integer, got 0",
        engine_kwargs={**STREAM, "model_loader_extra_config": {"concurrency": 0}},
    ),
    Case(
        "tuning-unknown-key",
        "`model_loader_extra_config={'threads': 8}`",
        errors.InvalidSettingError,
        "unknown key(s) ['threads']",
        engine_kwargs={**STREAM, "model_loader_extra_config": {"threads": 8}},
    ),
    Case(
        "sharded-tp-mismatch",
        "`runai_streamer_sharded` files for 2 ranks, tensor_parallel_size=4",
        errors.NotStreamableError,
        "tensor_parallel_size is 4",
        prepare=_variant("single", _pre_sharded),
        engine_kwargs={"load_format": "runai_streamer_sharded", "tensor_parallel_size": 4},
    ),
    Case(
        "sharded-plain-checkpoint",
        "`runai_streamer_sharded` on a plain checkpoint",
        errors.NotStreamableError,
        "model-rank-<rank>-part-<part>.safetensors",
        engine_kwargs={"load_format": "runai_streamer_sharded"},
    ),
]


@pytest.fixture(scope="module")
def plain_http():
    """A plain HTTP server on 127.0.0.1: not an S3 endpoint."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_fails_fast_on_the_driver(case, s3_server, tiny_models, plain_http, no_aws_env):
    import ray

    model = case.prepare(s3_server, tiny_models, case.id) if case.prepare else case.model
    if case.store == "plain-http":
        store = _good(s3_server, endpoint_url=plain_http)
    else:
        store = case.store(s3_server) if case.store else _good(s3_server)
    start = time.monotonic()
    with pytest.raises(case.error) as err:
        config = StreamingvLLMEngineProcessorConfig(
            model_source=model, engine_kwargs=case.engine_kwargs or STREAM, object_store=store
        )
        build_llm_processor(config)
    elapsed = time.monotonic() - start
    message = str(err.value)
    assert case.fragment in message, message
    assert s3_server.secret_access_key not in message
    assert not ray.is_initialized(), "Ray started before the error: an actor could have been taken"
    assert elapsed < 30, f"{elapsed:.1f}s to fail"  # a hang guard, not a speed target
    MESSAGES[case.id] = (
        type(err.value).__name__,
        re.sub(r"127\.0\.0\.1:\d+", "127.0.0.1:PORT", message),
    )


def test_hostile_object_keys(s3_server, no_aws_env):
    """Keys that would resolve outside the model directory: SeaweedFS refuses to store them
    (so the fetch never sees one here); the guard that stops them on stores that keep such
    keys is checked on the real server's refusal and on the guard itself."""
    from botocore.exceptions import ClientError

    from ray_stream_llm.uri import parse_model_uri

    client = s3_server.client()
    with pytest.raises(ClientError):
        client.put_object(Bucket="models", Key="bad/hostile/../escape.json", Body=b"{}")
    uri = parse_model_uri("s3://models/bad/hostile/")
    for key in ("../escape.json", "/etc/passwd.json", "a/../../b.json"):
        with pytest.raises(errors.UnsafeObjectKeyError) as err:
            uri.safe_relative(key)
        assert key in str(err.value)


def test_docs_table_matches_catalog():
    """Runs after the cases (file order): every case is a row of docs/errors.md."""
    if os.environ.get("RSL_WRITE_CATALOG") == "1" and len(MESSAGES) == len(CASES):
        rows = ["| input | error class | message |", "|---|---|---|"]
        for case in CASES:
            cls, message = MESSAGES[case.id]
            rows.append(f"| {case.input} | `{cls}` | {message.replace('|', '&#124;')} |")
        rows.append(
            "| an object key with `..` or an absolute path (on stores that keep such keys; "
            "SeaweedFS refuses to store them) | `UnsafeObjectKeyError` | object key "
            "'models/m/../escape.json' under 's3://models/m/' would be written outside the "
            "metadata directory (absolute path, '..', '.', '//' or '\\'); rename or delete that "
            "object in the store |"
        )
        DOCS.parent.mkdir(exist_ok=True)
        DOCS.write_text(
            "# Bad inputs and their errors\n\nEach row is a test in `tests/test_catalog.py`, "
            "run against a real S3 server (SeaweedFS): the error is raised on the driver "
            "when the processor is built, before Ray starts. Messages as raised (the "
            "endpoint's port replaced by PORT).\n\n" + "\n".join(rows) + "\n"
        )
    text = DOCS.read_text()
    for case in CASES:
        assert f"| {case.input} | `{case.error.__name__}` |" in text, case.id
