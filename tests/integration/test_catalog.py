"""The catalog of bad inputs (issue 4): each ends in its typed error on the driver, within
seconds, before Ray starts (so before any actor or GPU is taken). Run against the real S3
server with the settings only in the config.

docs/errors.md is this catalog as a table; ``test_docs_table_matches_catalog`` keeps them in
step. Regenerate it from real messages with: RSL_WRITE_CATALOG=1 make test
"""

from __future__ import annotations

import http.server
import json
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
from helpers.adapters import make_adapter, upload_adapters
from helpers.jobs import store_through
from helpers.paths import REPO

from ray_stream_llm import (
    ObjectStoreConfig,
    StreamingvLLMEngineProcessorConfig,
    build_llm_processor,
    errors,
)

pytestmark = [pytest.mark.s3]

DOCS = REPO / "docs" / "errors.md"
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
    store: Callable | str | None = None  # (server) -> ObjectStoreConfig, or a named endpoint
    env: dict = field(default_factory=dict)  # the driver's environment for this case
    # dynamic_lora_loading_path, or (server, tiny_models, name) -> it after uploading adapters
    lora: Callable | str | None = None


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


def _partial_shard_output(root: Path):
    _pre_sharded(root)
    (root / "ray-stream-llm-shard.partial").write_text('{"tensor_parallel_size": 2}')


def _write(name: str, data: str | bytes):
    def edit(root: Path):
        path = root / name
        path.write_bytes(data.encode() if isinstance(data, str) else data)

    return edit


def _index_map(value) -> Callable[[Path], None]:
    """The index's weight_map with its first entry pointing at ``value``."""

    def edit(root: Path):
        index = json.loads((root / "model.safetensors.index.json").read_text())
        first = next(iter(index["weight_map"]))
        index["weight_map"][first] = value
        (root / "model.safetensors.index.json").write_text(json.dumps(index))
        if value == "pytorch_model.bin":
            (root / "pytorch_model.bin").write_bytes(b"\0" * 64)

    return edit


def _header(text: bytes) -> Callable[[Path], None]:
    def edit(root: Path):
        (root / "model.safetensors").write_bytes(struct.pack("<Q", len(text)) + text + b"\0" * 8)

    return edit


def _adapters(specs: dict[str, dict], *, without_config: tuple[str, ...] = ()):
    """``dynamic_lora_loading_path`` of adapters made for the tiny single-file model (specs:
    name -> make_adapter kwargs, as tests/integration/test_lora.py writes them), uploaded to
    s3://models/bad-loras/<case>/<name>/; the adapters named in ``without_config`` are
    uploaded without their adapter_config.json."""

    def prepare(server, tiny_models, name):
        root = Path(server.root) / "variants" / name
        shutil.rmtree(root, ignore_errors=True)
        base = tiny_models["single"].uri
        prefix = upload_adapters(server, root, base, specs, prefix=f"s3://models/bad-loras/{name}/")
        for stray in without_config:
            local = make_adapter(root / "stray" / stray, base, b_scale=1.0)
            (local / "adapter_config.json").unlink()
            server.upload_dir(local, f"{prefix}{stray}/")
        return prefix

    return prepare


def _closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def _good(server, **overrides):
    return ObjectStoreConfig(**{**store_through(server), **overrides})


STREAM = {"load_format": "runai_streamer"}
LORA = {**STREAM, "enable_lora": True}
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
        "sharded-tuning-key",
        "`runai_streamer_sharded` with `model_loader_extra_config={'concurrency': 4}`",
        errors.InvalidSettingError,
        "load_format 'runai_streamer_sharded' accepts ['pattern']",
        engine_kwargs={
            "load_format": "runai_streamer_sharded",
            "model_loader_extra_config": {"concurrency": 4},
        },
    ),
    Case(
        "sharded-bad-pattern",
        "`runai_streamer_sharded` with `model_loader_extra_config={'pattern': 'rank-{rank}.bin'}`",
        errors.InvalidSettingError,
        "must end with .safetensors",
        engine_kwargs={
            "load_format": "runai_streamer_sharded",
            "model_loader_extra_config": {"pattern": "rank-{rank}.bin"},
        },
    ),
    Case(
        "sharded-tp-mismatch",
        "`runai_streamer_sharded` files for 2 ranks, tensor_parallel_size=4",
        errors.TensorParallelMismatchError,
        "ranks [0, 1], but tensor_parallel_size is 4",
        prepare=_variant("single", _pre_sharded),
        engine_kwargs={"load_format": "runai_streamer_sharded", "tensor_parallel_size": 4},
    ),
    Case(
        "sharded-partial-output",
        "a `ray-stream-llm shard` output its writer did not finish (the partial marker, no "
        "completion marker)",
        errors.IncompleteShardedCheckpointError,
        "is a partial output of `ray-stream-llm shard`",
        prepare=_variant("single", _partial_shard_output),
        engine_kwargs={"load_format": "runai_streamer_sharded", "tensor_parallel_size": 2},
    ),
    Case(
        "sharded-plain-checkpoint",
        "`runai_streamer_sharded` on a plain checkpoint",
        errors.NotStreamableError,
        "model-rank-<rank>-part-<part>.safetensors",
        engine_kwargs={"load_format": "runai_streamer_sharded"},
    ),
    # --- issue 11: broken metadata, credentials in URIs, bounded and typed store calls ---
    Case(
        "config-not-json",
        "`config.json` that is not JSON",
        errors.NotStreamableError,
        "config.json is not valid JSON",
        prepare=_variant("single", _write("config.json", "{not json")),
    ),
    Case(
        "config-empty",
        "an empty `config.json`",
        errors.NotStreamableError,
        "config.json is empty",
        prepare=_variant("single", _write("config.json", "")),
    ),
    Case(
        "config-list",
        "`config.json` holding a JSON list",
        errors.NotStreamableError,
        "config.json holds a JSON list, not an object",
        prepare=_variant("single", _write("config.json", "[1, 2]")),
    ),
    Case(
        "config-no-model-type",
        "`config.json` without `model_type` or `architectures`",
        errors.NotStreamableError,
        "neither 'model_type' nor 'architectures'",
        prepare=_variant("single", _write("config.json", '{"hidden_size": 8}')),
    ),
    Case(
        "tokenizer-config-not-json",
        "`tokenizer_config.json` that is not JSON",
        errors.NotStreamableError,
        "tokenizer_config.json is not valid JSON",
        prepare=_variant("single", _write("tokenizer_config.json", "oops")),
    ),
    Case(
        "generation-config-list",
        "`generation_config.json` holding a JSON list",
        errors.NotStreamableError,
        "generation_config.json holds a JSON list",
        prepare=_variant("single", _write("generation_config.json", "[]")),
    ),
    Case(
        "index-not-json",
        "a safetensors index that is not JSON",
        errors.NotStreamableError,
        "model.safetensors.index.json is not valid JSON",
        prepare=_variant("sharded", _write("model.safetensors.index.json", "xx")),
    ),
    Case(
        "index-no-weight-map",
        "a safetensors index without `weight_map`",
        errors.NotStreamableError,
        "no 'weight_map' object",
        prepare=_variant("sharded", _write("model.safetensors.index.json", '{"metadata": {}}')),
    ),
    Case(
        "index-non-string",
        "an index whose `weight_map` values are not strings",
        errors.NotStreamableError,
        "values that are not file names (int)",
        prepare=_variant("sharded", _index_map(7)),
    ),
    Case(
        "index-names-bin",
        "an index naming a `pytorch_model.bin` that exists",
        errors.NotStreamableError,
        "names non-safetensors file(s) pytorch_model.bin",
        prepare=_variant("sharded", _index_map("pytorch_model.bin")),
    ),
    Case(
        "index-path-escape",
        "an index naming `../other/model.safetensors`",
        errors.NotStreamableError,
        "names file(s) outside the model directory",
        prepare=_variant("sharded", _index_map("../other/model.safetensors")),
    ),
    Case(
        "header-is-list",
        "a shard whose header is valid JSON but a list",
        errors.NotStreamableError,
        "header is a JSON list, not an object",
        prepare=_variant("single", _header(b"[1, 2]")),
    ),
    Case(
        "header-bad-offsets",
        "a shard header whose `data_offsets` are not two integers",
        errors.NotStreamableError,
        "without valid 'data_offsets'",
        prepare=_variant("single", _header(b'{"w": {"dtype": "F32", "data_offsets": "ab"}}')),
    ),
    Case(
        "uri-credentials",
        "`model_source='s3://KEY:SECRET@models/m/'`",
        errors.InvalidModelURIError,
        "carries credentials",
        model="s3://AKIAEXAMPLE:SECRETVALUE@models/tiny/single/",
    ),
    Case(
        "uri-dot-segments",
        "`model_source='s3://models/a/../m/'`",
        errors.InvalidModelURIError,
        "'.' or '..' path segments",
        model="s3://models/tiny/../tiny/single/",
    ),
    Case(
        "uri-empty-segment",
        "`model_source='s3://models//m/'`",
        errors.InvalidModelURIError,
        "empty path segment",
        model="s3://models/tiny//single/",
    ),
    Case(
        "partial-credentials",
        "`AWS_ACCESS_KEY_ID` set without `AWS_SECRET_ACCESS_KEY`",
        errors.AccessDeniedError,
        "partial AWS credentials: AWS_SECRET_ACCESS_KEY is missing",
        store=lambda s: ObjectStoreConfig(endpoint_url=s.endpoint_url, region_name=s.region),
        env={"AWS_ACCESS_KEY_ID": "AKIAONLY"},
    ),
    Case(
        "profile-missing",
        "`profile_name` that no AWS config file has",
        errors.AccessDeniedError,
        "AWS profile 'nowhere' is not in",
        store=lambda s: ObjectStoreConfig(endpoint_url=s.endpoint_url, profile_name="nowhere"),
    ),
    Case(
        "endpoint-never-answers",
        "an endpoint that accepts TCP and never answers (`timeout_s=5`)",
        errors.StoreTimeoutError,
        "did not answer within 5s",
        store="silent",
    ),
    Case(
        "cache-not-writable",
        "`RAY_STREAM_LLM_CACHE` that cannot be written",
        errors.CacheNotWritableError,
        "set RAY_STREAM_LLM_CACHE (the metadata cache) to a writable directory",
        env={"RAY_STREAM_LLM_CACHE": "/sys/ray-stream-llm-cache"},
    ),
    Case(
        "vllm-plugins-leave-it-out",
        "`VLLM_PLUGINS=lora_filesystem_resolver` in the job's environment",
        errors.PluginNotActiveError,
        "add it (VLLM_PLUGINS=lora_filesystem_resolver,ray_stream_llm_load_report) or unset",
        env={"VLLM_PLUGINS": "lora_filesystem_resolver"},
    ),
    Case(
        "load-format-not-string",
        "`load_format=1`",
        errors.UnsupportedLoadFormatError,
        "must be a string, got 1",
        engine_kwargs={"load_format": 1},
    ),
    Case(
        "tuning-memory-limit",
        "`model_loader_extra_config={'memory_limit': -5}`",
        errors.InvalidSettingError,
        "must be an integer >= -1, got -5",
        engine_kwargs={**STREAM, "model_loader_extra_config": {"memory_limit": -5}},
    ),
    # --- issue 35 item 2: LoRA adapters from the model's store (dynamic_lora_loading_path) ---
    Case(
        "lora-prefix-empty",
        "`dynamic_lora_loading_path` naming a prefix that holds no objects",
        errors.AdapterNotFoundError,
        "holds no objects; check the prefix",
        engine_kwargs=LORA,
        lora="s3://models/bad-loras/no-such-prefix/",
    ),
    Case(
        "lora-no-adapter-config",
        "an adapter sub-folder without `adapter_config.json` (its weights only)",
        errors.InvalidAdapterError,
        "has no adapter_config.json",
        engine_kwargs=LORA,
        lora=_adapters({"fine": {"b_scale": 1.0}}, without_config=("weights-only",)),
    ),
    Case(
        "lora-other-base",
        "an adapter whose `base_model_name_or_path` is another model",
        errors.AdapterBaseMismatchError,
        "was made for base model 's3://models/tiny/sharded/', not 's3://models/tiny/single/'",
        engine_kwargs=LORA,
        lora=_adapters({"foreign": {"b_scale": 1.0, "base": "s3://models/tiny/sharded/"}}),
    ),
    Case(
        "lora-rank-above-max",
        "an adapter of rank `r=32`, `max_lora_rank` not set (vLLM's default, 16)",
        errors.InvalidAdapterError,
        "set engine_kwargs['max_lora_rank'] to 32",
        engine_kwargs=LORA,
        lora=_adapters({"r32": {"b_scale": 1.0, "rank": 32}}),
    ),
    Case(
        "lora-without-enable-lora",
        "`dynamic_lora_loading_path` without `engine_kwargs['enable_lora']`",
        errors.InvalidSettingError,
        "set engine_kwargs={'enable_lora': True, ...}",
        engine_kwargs=STREAM,
        lora=_adapters({"fine": {"b_scale": 1.0}}),
    ),
    Case(
        "lora-az-prefix",
        "`dynamic_lora_loading_path='az://container/loras/'`",
        errors.InvalidSettingError,
        "adapters are served from s3://, gs:// only",
        engine_kwargs=LORA,
        lora="az://container/loras/",
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
def test_bad_input_fails_fast_on_the_driver(
    case, s3_server, tiny_models, plain_http, silent_endpoint, no_aws_env, monkeypatch
):
    import ray

    model = case.prepare(s3_server, tiny_models, case.id) if case.prepare else case.model
    for name, value in case.env.items():
        monkeypatch.setenv(name, value)
    if case.store == "plain-http":
        store = _good(s3_server, endpoint_url=plain_http)
    elif case.store == "silent":
        store = _good(s3_server, endpoint_url=silent_endpoint, timeout_s=5)
    else:
        store = case.store(s3_server) if case.store else _good(s3_server)
    lora = case.lora(s3_server, tiny_models, case.id) if callable(case.lora) else case.lora
    extra = {"dynamic_lora_loading_path": lora} if lora is not None else {}
    start = time.monotonic()
    with pytest.raises(case.error) as err:
        config = StreamingvLLMEngineProcessorConfig(
            model_source=model,
            engine_kwargs=case.engine_kwargs or STREAM,
            object_store=store,
            **extra,
        )
        build_llm_processor(config)
    elapsed = time.monotonic() - start
    message = str(err.value)
    assert case.fragment in message, message
    assert "\n" not in message, message  # one line
    if lora is not None:
        assert lora in message, message  # names the value
    assert s3_server.secret_access_key not in message
    assert not ray.is_initialized(), "Ray started before the error: an actor could have been taken"
    assert elapsed < 30, f"{elapsed:.1f}s to fail"  # a hang guard, not a speed target
    print(f"\nCASE {case.id} {type(err.value).__name__} {elapsed:.2f}s")
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
    """Runs after the cases (file order): every case is a row of docs/errors.md, its
    message as this run raised it."""
    if os.environ.get("RSL_WRITE_CATALOG") == "1" and len(MESSAGES) == len(CASES):
        rows = ["| input | error class | message |", "|---|---|---|"]
        for case in CASES:
            cls, message = MESSAGES[case.id]
            rows.append(f"| {case.input} | `{cls}` | {message.replace('|', '&#124;')} |")
        rows.append(
            "| an object key with `..` or an absolute path (on stores that keep such keys; "
            "SeaweedFS refuses to store them) | `UnsafeObjectKeyError` | object key "
            "'models/m/../escape.json' under 's3://models/m/' would be written outside the "
            "model directory (absolute path, '..', '.', '//', '\\' or NUL); rename or delete "
            "that object in the store |"
        )
        DOCS.parent.mkdir(exist_ok=True)
        DOCS.write_text(
            "# Bad inputs and their errors\n\n"
            "Each row is a test in `tests/integration/test_catalog.py`, "
            "run against a real S3 server (SeaweedFS): the error is raised on the driver "
            "when the processor is built, before Ray starts. Messages as raised (the "
            "endpoint's port replaced by PORT).\n\n" + "\n".join(rows) + "\n"
        )
    text = DOCS.read_text()
    for case in CASES:
        assert f"| {case.input} | `{case.error.__name__}` |" in text, case.id
    # each message as raised this run, word for word (the cases ran first, in file order)
    stale = [
        case.id
        for case in CASES
        if case.id in MESSAGES
        and f"| {case.input} | `{MESSAGES[case.id][0]}` | "
        f"{MESSAGES[case.id][1].replace('|', '&#124;')} |"
        not in text
    ]
    assert stale == [], f"docs/errors.md differs from the raised messages: {stale}"
