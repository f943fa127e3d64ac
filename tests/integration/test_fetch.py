"""``fetch_model_metadata`` against the real local S3 server (SeaweedFS).

Nothing is mocked: objects live in the server, files land on the real
filesystem, and what was downloaded is measured twice, from the files on disk
and from the server's own access log (``LocalS3Server.served()``). Tests that
change objects work on private copies of a layout under a fresh prefix; the
session layouts under ``s3://models/tiny/<name>/`` are only read.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import textwrap
import time
import traceback
import uuid
import zlib
from collections import Counter
from pathlib import Path

import pytest
from botocore.exceptions import ClientError
from helpers.models import UploadedModel, is_weight, list_files
from helpers.paths import REPO
from helpers.s3log import BUCKET, AccessLog, copy_model, prefix_of
from helpers.waiting import wait_until

from ray_stream_llm import fetch
from ray_stream_llm.errors import (
    AccessDeniedError,
    ModelNotFoundError,
    RayStreamLLMError,
    StoreUnreachableError,
    UnsafeObjectKeyError,
)
from ray_stream_llm.fetch import MARKER, default_metadata_dir, fetch_model_metadata
from ray_stream_llm.integrations.ray.udfs import local_metadata
from ray_stream_llm.tools.localstore import LocalS3Server
from ray_stream_llm.uri import parse_model_uri

pytestmark = [pytest.mark.s3]


def _files(directory: Path) -> set[str]:
    return list_files(directory) - {MARKER}


def _tree(root: Path) -> set[str]:
    """Every path (files and dirs) under ``root``, relative, for before/after comparisons."""
    return {p.relative_to(root).as_posix() for p in root.rglob("*")}


def _assert_same_bytes(
    fetched: Path, model: UploadedModel, names: set[str] | frozenset[str]
) -> None:
    for name in names:
        assert (fetched / name).read_bytes() == (model.local / name).read_bytes(), name


def _model_dirs(cache: Path) -> list[str]:
    """The (non-hidden) model directories in the cache."""
    return [p.name for p in (cache / "models").iterdir() if not p.name.startswith(".")]


def _leftover_temp(root: Path) -> list[Path]:
    return [p for pattern in (".*.tmp-*", ".*.old-*") for p in root.rglob(pattern)]


# --- 1. exactly the metadata, never a weight ------------------------------------------------
@pytest.mark.parametrize("layout", ["single", "sharded", "hub-mirror"])
def test_fetch_brings_exactly_metadata_and_reads_no_weight(
    layout: str,
    s3_server: LocalS3Server,
    tiny_models: dict[str, UploadedModel],
    s3_env: dict[str, str],
) -> None:
    tiny = tiny_models[layout]
    prefix = prefix_of(tiny.uri)
    assert tiny.weights and tiny.metadata and "config.json" in tiny.metadata
    log = AccessLog(s3_server)

    path = fetch_model_metadata(tiny.uri)

    cache = Path(s3_env["RAY_STREAM_LLM_CACHE"])
    assert path == default_metadata_dir(tiny.uri)
    assert path.is_dir() and path.is_relative_to(cache)
    assert (path / MARKER).is_file()
    # on disk: exactly the metadata, byte for byte, and no weight file of any format
    assert _files(path) == tiny.metadata
    assert not [f for f in list_files(path) if is_weight(f)]
    assert not [f for f in list_files(cache) if is_weight(f)]
    _assert_same_bytes(path, tiny, tiny.metadata)
    # nothing else left in the cache: the model dir and its lock file, no staging dir
    assert not _leftover_temp(cache)
    assert {p.name for p in (cache / "models").iterdir()} <= {path.name, f".{path.name}.lock"}
    # the server's own log: each metadata object sent once, no weight object (nor README...)
    gets = log.gets(prefix)
    assert gets == Counter({prefix + m: 1 for m in tiny.metadata}), gets
    assert not {prefix + w for w in tiny.weights} & set(gets)


# --- 2. deterministic default dir, trailing slash or not -----------------------------------
def test_default_dir_is_deterministic_and_ignores_trailing_slash(
    s3_server: LocalS3Server, tiny_models: dict[str, UploadedModel], s3_env: dict[str, str]
) -> None:
    tiny = tiny_models["single"]
    with_slash = tiny.uri
    without = tiny.uri.rstrip("/")
    assert with_slash.endswith("/") and not without.endswith("/")
    expected = default_metadata_dir(with_slash)
    assert default_metadata_dir(without) == expected
    assert default_metadata_dir(with_slash + "/") == expected
    cache = Path(s3_env["RAY_STREAM_LLM_CACHE"])
    assert expected.parent == cache / "models"

    # another process (its own interpreter, hash seed, cwd) derives the same path
    code = (
        "import sys; from ray_stream_llm.fetch import default_metadata_dir as d; "
        "print(d(sys.argv[1]))"
    )
    other = subprocess.run(
        [sys.executable, "-c", code, without],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONHASHSEED": "12345"},
        cwd=cache.parent,
        timeout=120,
    )
    assert other.returncode == 0, other.stderr[-2000:]
    # the last line: on Ray 2.54 importing Ray's config imports vLLM, which logs to stdout
    assert Path(other.stdout.strip().splitlines()[-1]) == expected

    log = AccessLog(s3_server)
    first = fetch_model_metadata(with_slash)
    assert first == expected
    assert log.gets(prefix_of(tiny.uri)) == Counter(
        {prefix_of(tiny.uri) + m: 1 for m in tiny.metadata}
    )

    log = AccessLog(s3_server)
    second = fetch_model_metadata(without)
    report = fetch.fetch_metadata_report(without, None)
    assert second == first
    assert report.path == first
    assert report.downloaded is False
    assert report.files == len(tiny.metadata)
    assert report.skipped_weight_files == len(tiny.weights)
    assert log.gets() == Counter(), "a second fetch of an unchanged model downloaded objects"
    assert _files(first) == tiny.metadata
    assert _model_dirs(cache) == [first.name]


# --- 3. explicit dest ---------------------------------------------------------------------
def test_explicit_dest_gets_the_files(
    s3_server: LocalS3Server,
    tiny_models: dict[str, UploadedModel],
    s3_env: dict[str, str],
    tmp_path: Path,
) -> None:
    tiny = tiny_models["sharded"]
    dest = tmp_path / "mine" / "deep" / "sharded"  # parents do not exist yet
    path = fetch_model_metadata(tiny.uri, dest)
    assert path == dest
    assert _files(dest) == tiny.metadata
    _assert_same_bytes(dest, tiny, tiny.metadata)
    assert not default_metadata_dir(tiny.uri).exists()  # nothing went to the cache
    # the cache holds only the lock (kept there, not in the user's directories)
    cache = Path(s3_env["RAY_STREAM_LLM_CACHE"])
    assert [p.name for p in cache.iterdir()] == ["locks"]
    assert not _leftover_temp(dest.parent) and not list(dest.parent.glob("*.lock"))

    # a str dest, and an existing empty directory, are fine too
    empty = tmp_path / "empty"
    empty.mkdir()
    assert fetch_model_metadata(tiny.uri, str(empty)) == empty
    assert _files(empty) == tiny.metadata

    # again into a dest the fetch wrote: nothing downloaded
    log = AccessLog(s3_server)
    assert fetch.fetch_metadata_report(tiny.uri, dest).downloaded is False
    assert log.gets() == Counter()


def test_explicit_dest_not_written_by_fetch_is_refused_and_untouched(
    tiny_models: dict[str, UploadedModel], s3_env: dict[str, str], tmp_path: Path
) -> None:
    tiny = tiny_models["single"]
    dest = tmp_path / "users-dir"
    (dest / "sub").mkdir(parents=True)
    mine = {
        "config.json": b'{"mine": true}\n',
        "notes.txt": b"do not delete\n",
        "sub/data.bin": os.urandom(64),
    }
    for name, data in mine.items():
        (dest / name).write_bytes(data)
    before = {p: (dest / p).stat().st_mtime_ns for p in mine}
    parent_before = {p.name for p in tmp_path.iterdir()}

    with pytest.raises(FileExistsError) as info:
        fetch_model_metadata(tiny.uri, dest)
    assert str(dest) in str(info.value)

    assert list_files(dest) == set(mine)
    for name, data in mine.items():
        assert (dest / name).read_bytes() == data, name
        assert (dest / name).stat().st_mtime_ns == before[name], name
    assert not (dest / MARKER).exists()
    assert not _leftover_temp(tmp_path)
    # at most the lock file is new next to dest; no staging or half-moved directory
    assert {p.name for p in tmp_path.iterdir()} - parent_before <= {f".{dest.name}.lock"}


# --- 4. idempotent, and a changed store is fetched again ------------------------------------
def test_refetch_after_store_change_updates_files_and_marker(
    s3_server: LocalS3Server, tiny_models: dict[str, UploadedModel], s3_env: dict[str, str]
) -> None:
    copy = copy_model(s3_server, tiny_models["single"], "refresh")
    prefix = prefix_of(copy.uri)
    path = fetch_model_metadata(copy.uri)
    assert _files(path) == copy.metadata
    marker = json.loads((path / MARKER).read_text())
    assert marker["uri"] == copy.uri
    assert set(marker["files"]) == set(copy.metadata)

    # unchanged store: no download
    log = AccessLog(s3_server)
    report = fetch.fetch_metadata_report(copy.uri, None)
    assert (report.path, report.downloaded) == (path, False)
    assert log.gets() == Counter()

    # one metadata object changes in the store
    new = json.loads((copy.local / "config.json").read_bytes())
    new["refreshed"] = uuid.uuid4().hex
    new_bytes = json.dumps(new, indent=2).encode()
    s3_server.put(copy.uri + "config.json", new_bytes)
    log = AccessLog(s3_server)
    report = fetch.fetch_metadata_report(copy.uri, None)
    assert (report.path, report.downloaded) == (path, True)
    assert (path / "config.json").read_bytes() == new_bytes
    assert _files(path) == copy.metadata
    _assert_same_bytes(path, copy, copy.metadata - {"config.json"})
    updated = json.loads((path / MARKER).read_text())
    assert updated["files"]["config.json"] == {
        "size": len(new_bytes),
        "etag": hashlib.md5(new_bytes).hexdigest(),
        "crc32": zlib.crc32(new_bytes),
    }
    assert updated["files"]["config.json"] != marker["files"]["config.json"]
    assert log.gets(prefix)[prefix + "config.json"] == 1
    assert not {prefix + w for w in copy.weights} & set(log.gets(prefix))
    assert not _leftover_temp(Path(s3_env["RAY_STREAM_LLM_CACHE"]))

    # a metadata object deleted from the store disappears locally on the next fetch
    gone = "tokenizer_config.json"
    assert gone in copy.metadata
    s3_server.client().delete_object(Bucket=BUCKET, Key=prefix + gone)
    assert fetch_model_metadata(copy.uri) == path
    assert _files(path) == copy.metadata - {gone}

    # and then the store is unchanged again: no download
    log = AccessLog(s3_server)
    assert fetch.fetch_metadata_report(copy.uri, None).downloaded is False
    assert log.gets() == Counter()


# --- 5. many processes at once ------------------------------------------------------------
FETCHER = textwrap.dedent("""
    import json, os, sys, time
    from pathlib import Path
    ready, start, out, uri = sys.argv[1:5]
    from ray_stream_llm.fetch import fetch_metadata_report
    Path(ready).touch()
    deadline = time.monotonic() + 180
    while not os.path.exists(start):
        if time.monotonic() > deadline:
            sys.exit("never got the start signal")
        time.sleep(0.002)
    report = fetch_metadata_report(uri)
    Path(out).write_text(json.dumps({"path": str(report.path), "downloaded": report.downloaded}))
""")

# Polls the final directory; records every state in which it exists but is not complete.
CHECKER = textwrap.dedent("""
    import json, os, sys, time
    from pathlib import Path
    target, expected_file, ready, stop, out = sys.argv[1:6]
    target = Path(target)
    expected = set(json.loads(Path(expected_file).read_text()))
    absent = complete = 0
    bad = []
    first = True
    while True:
        stopping = os.path.exists(stop)
        if not os.path.exists(target):
            absent += 1
        else:
            try:
                found = {p.relative_to(target).as_posix() for p in target.rglob("*") if p.is_file()}
            except OSError as exc:
                bad.append(f"{type(exc).__name__}: {exc}")
            else:
                if found == expected:
                    complete += 1
                else:
                    bad.append(sorted(found))
        if first:
            Path(ready).touch()
            first = False
        if stopping:
            break
        time.sleep(0.001)
    Path(out).write_text(json.dumps({"absent": absent, "complete": complete, "bad": bad[:20],
                                     "bad_count": len(bad)}))
""")


def _wait_for(paths: list[Path], procs: list[subprocess.Popen[bytes]], timeout: float) -> None:
    def ready() -> bool:
        dead = [p.args for p in procs if p.poll() is not None]
        assert not dead, f"a child exited early: {dead}"
        return all(p.exists() for p in paths)

    wait_until(ready, timeout, "children did not get ready in time")


def test_concurrent_processes_download_once_and_never_show_a_partial_dir(
    s3_server: LocalS3Server,
    tiny_models: dict[str, UploadedModel],
    s3_env: dict[str, str],
    tmp_path: Path,
) -> None:
    n = 8
    copy = copy_model(s3_server, tiny_models["hub-mirror"], "concurrent")
    prefix = prefix_of(copy.uri)
    target = default_metadata_dir(copy.uri)
    cache = Path(s3_env["RAY_STREAM_LLM_CACHE"])
    sync = tmp_path / "sync"
    sync.mkdir()
    start, stop = sync / "start", sync / "stop"
    (sync / "expected.json").write_text(json.dumps(sorted(copy.metadata | {MARKER})))
    env = {**os.environ}
    log = AccessLog(s3_server)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        with open(sync / "checker.log", "wb") as out:
            checker = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    CHECKER,
                    str(target),
                    str(sync / "expected.json"),
                    str(sync / "checker.ready"),
                    str(stop),
                    str(sync / "checker.json"),
                ],
                env=env,
                cwd=REPO,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        procs.append(checker)
        for i in range(n):
            with open(sync / f"{i}.log", "wb") as out:
                procs.append(
                    subprocess.Popen(
                        [
                            sys.executable,
                            "-c",
                            FETCHER,
                            str(sync / f"{i}.ready"),
                            str(start),
                            str(sync / f"{i}.json"),
                            copy.uri,
                        ],
                        env=env,
                        cwd=REPO,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                    )
                )
        # every fetcher has imported the library and waits; the checker has polled once
        _wait_for([sync / "checker.ready", *(sync / f"{i}.ready" for i in range(n))], procs, 240)
        assert not target.exists()
        assert all(p.poll() is None for p in procs)  # all started, none finished
        start.touch()
        for p in procs[1:]:
            p.wait(timeout=240)
        stop.touch()
        checker.wait(timeout=60)
        logs = {p.name: p.read_text(errors="replace")[-2000:] for p in sync.glob("*.log")}
        assert [p.returncode for p in procs] == [0] * (n + 1), logs
    finally:
        stop.touch()
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()

    results = [json.loads((sync / f"{i}.json").read_text()) for i in range(n)]
    assert {r["path"] for r in results} == {str(target)}
    # released together by one signal, all 8 on one target: exactly one downloaded, the
    # other 7 found the directory complete (whatever order 2 busy cores ran them in)
    assert sorted(r["downloaded"] for r in results) == [False] * (n - 1) + [True], results
    # complete directory, byte-identical
    assert _files(target) == copy.metadata
    _assert_same_bytes(target, copy, copy.metadata)
    # one download in total: each metadata object GET once, no weight object at all
    gets = log.gets(prefix)
    assert gets == Counter({prefix + m: 1 for m in copy.metadata}), gets
    # no staging or swapped-out directory left behind
    assert not _leftover_temp(cache)
    assert _model_dirs(cache) == [target.name]
    # the checker never saw the final path exist without being complete
    seen = json.loads((sync / "checker.json").read_text())
    assert seen["bad_count"] == 0, seen
    assert seen["absent"] >= 1 and seen["complete"] >= 1, seen


# --- 6. object keys that would escape the destination ---------------------------------------
# relative path under the model prefix -> why it is hostile
HOSTILE_PATHS = {
    "../escape.json": "parent segment",
    "../../../../etc/evil.json": "parent segments",
    "sub/../../up.json": "parent segment after a subdir",
    "additional_chat_templates/../../x.jinja": "parent segment after a metadata subdir",
    "/abs.json": "absolute (a '//' after the prefix)",
    "additional_chat_templates//x.jinja": "empty segment",
    "./config.json": "dot segment",
    "..": "parent itself",
    "..\\evil.json": "backslash",
    "a\x00.json": "NUL",
}


def test_hostile_keys_are_refused_or_normalised_by_the_store(
    s3_server: LocalS3Server,
    tiny_models: dict[str, UploadedModel],
    s3_env: dict[str, str],
    tmp_path: Path,
) -> None:
    """SeaweedFS refuses keys with '.', '..' or '\\' segments and collapses '//', so a
    hostile key cannot be stored here; what it does store must be fetched inside the cache."""
    copy = copy_model(s3_server, tiny_models["single"], "hostile")
    prefix = prefix_of(copy.uri)
    client = s3_server.client()
    refused = [
        prefix + "../escape.json",
        prefix + "sub/../../up.json",
        prefix + "./dot.json",
        prefix + "..\\evil.json",
    ]
    for key in refused:
        with pytest.raises(ClientError) as info:
            client.put_object(Bucket=BUCKET, Key=key, Body=b"{}")
        assert info.value.response["Error"]["Code"] == "InvalidRequest", key
    collapsed = {
        prefix + "/abs.json": prefix + "abs.json",
        prefix + "additional_chat_templates//x.jinja": prefix + "additional_chat_templates/x.jinja",
    }
    for key in collapsed:
        client.put_object(Bucket=BUCKET, Key=key, Body=b'{"hostile": true}')
    # what the store really holds
    keys = {
        o["Key"]
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET)
        for o in page.get("Contents", ())
    }
    under = {k for k in keys if k.startswith(prefix)}
    assert set(collapsed.values()) <= under
    assert not {
        k for k in keys if ".." in k.split("/") or "." in k.split("/") or "//" in k or "\\" in k
    }
    assert "tiny/fetch-test/escape.json" not in keys and "tiny/fetch-test/up.json" not in keys

    cache = Path(s3_env["RAY_STREAM_LLM_CACHE"])
    outside_before = _tree(tmp_path)
    path = fetch_model_metadata(copy.uri)
    assert _files(path) == copy.metadata | {"abs.json", "additional_chat_templates/x.jinja"}
    assert all(p.resolve().is_relative_to(path.resolve()) for p in path.rglob("*"))
    # nothing new in tmp_path except inside the cache root, nothing next to tmp_path
    new = _tree(tmp_path) - outside_before
    assert all(p.startswith(cache.name + "/") or p == cache.name for p in new), sorted(new)
    assert not list(tmp_path.parent.glob("escape.json")) and not list(Path("/").glob("abs.json"))


@pytest.mark.parametrize("relative", sorted(HOSTILE_PATHS))
def test_safe_relative_refuses_hostile_paths(relative: str) -> None:
    """The library's own guard, for stores (AWS S3, GCS) that keep such keys verbatim. The
    SeaweedFS server cannot hold these keys (see above), so the guard is called directly:
    it refuses each one with UnsafeObjectKeyError (a ValueError) naming the full key."""
    uri = parse_model_uri("s3://models/tiny/hostile/")
    with pytest.raises(UnsafeObjectKeyError) as info:
        uri.safe_relative(relative)
    assert isinstance(info.value, ValueError) and isinstance(info.value, RayStreamLLMError)
    assert repr(uri.key(relative)) in str(info.value)


# --- 7. errors ------------------------------------------------------------------------------
def test_missing_bucket(s3_env: dict[str, str]) -> None:
    bucket = f"no-such-bucket-{uuid.uuid4().hex[:8]}"
    with pytest.raises(ModelNotFoundError) as info:
        fetch_model_metadata(f"s3://{bucket}/llama/")
    assert isinstance(info.value, FileNotFoundError)
    assert bucket in str(info.value)
    assert not Path(s3_env["RAY_STREAM_LLM_CACHE"]).exists()


def test_missingprefix_of(s3_env: dict[str, str], tiny_models: dict[str, UploadedModel]) -> None:
    uri = f"s3://{BUCKET}/tiny/no-such-model-{uuid.uuid4().hex[:8]}/"
    with pytest.raises(ModelNotFoundError) as info:
        fetch_model_metadata(uri)
    assert isinstance(info.value, FileNotFoundError)
    assert uri in str(info.value)
    assert not default_metadata_dir(uri).exists()


def test_prefix_without_config_json(
    s3_server: LocalS3Server, s3_env: dict[str, str], tiny_models: dict[str, UploadedModel]
) -> None:
    local = tiny_models["single"].local
    uri = f"s3://{BUCKET}/tiny/fetch-test/noconfig-{uuid.uuid4().hex[:8]}/"
    for name in ("tokenizer.json", "generation_config.json", "model.safetensors"):
        s3_server.put(uri + name, (local / name).read_bytes())
    s3_server.put(uri + "nested/config.json", (local / "config.json").read_bytes())
    with pytest.raises(ModelNotFoundError) as info:
        fetch_model_metadata(uri)
    assert isinstance(info.value, FileNotFoundError)
    assert "config.json" in str(info.value)
    assert not default_metadata_dir(uri).exists()
    assert not _leftover_temp(Path(s3_env["RAY_STREAM_LLM_CACHE"]))


def test_a_tokenizer_given_as_a_uri_is_fetched_without_a_config_and_a_local_one_kept(
    s3_server: LocalS3Server, s3_env: dict[str, str], tiny_models: dict[str, UploadedModel]
) -> None:
    """``engine_kwargs["tokenizer"]`` as the engine actor reads it
    (``integrations.ray.udfs.local_metadata``): a store prefix of tokenizer files alone (no
    config.json) comes down to the local metadata directory, its safetensors left in the
    store; a local directory and a Hub id stay as they were."""
    local = tiny_models["single"].local
    uri = f"s3://{BUCKET}/tiny/fetch-test/tokenizer-{uuid.uuid4().hex[:8]}/"
    for name in ("tokenizer.json", "tokenizer_config.json", "model.safetensors"):
        s3_server.put(uri + name, (local / name).read_bytes())
    log = AccessLog(s3_server)

    path = local_metadata(uri)

    assert Path(path) == default_metadata_dir(uri)
    assert _files(Path(path)) == {"tokenizer.json", "tokenizer_config.json"}
    assert set(log.gets(prefix_of(uri))) == {
        prefix_of(uri) + "tokenizer.json",
        prefix_of(uri) + "tokenizer_config.json",
    }
    assert local_metadata(path) == path
    assert (
        local_metadata("HuggingFaceTB/SmolLM2-135M-Instruct")
        == "HuggingFaceTB/SmolLM2-135M-Instruct"
    )


@pytest.mark.parametrize("wrong", ["secret", "key id"])
def test_wrong_credentials_are_access_denied_without_leaking_the_secret(
    wrong: str,
    monkeypatch: pytest.MonkeyPatch,
    s3_server: LocalS3Server,
    tiny_models: dict[str, UploadedModel],
    s3_env: dict[str, str],
) -> None:
    bad_secret = "WRONGSECRET" + uuid.uuid4().hex
    if wrong == "secret":
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", bad_secret)
        secrets = [bad_secret]
    else:
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKNOTKNOWN" + uuid.uuid4().hex[:10].upper())
        secrets = [s3_server.secret_access_key]
    uri = tiny_models["single"].uri
    with pytest.raises(AccessDeniedError) as info:
        fetch_model_metadata(uri)
    assert isinstance(info.value, PermissionError)
    text = "".join(traceback.format_exception(info.value))
    for secret in (*secrets, s3_server.secret_access_key):
        assert secret not in text
        assert secret not in repr(info.value.args)
    assert "AWS_SECRET_ACCESS_KEY" in str(info.value)  # says how to fix it
    assert not default_metadata_dir(uri).exists()


def test_unreachable_endpoint_fails_fast(
    monkeypatch: pytest.MonkeyPatch, s3_env: dict[str, str]
) -> None:
    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    t0 = time.monotonic()
    with pytest.raises(StoreUnreachableError) as info:
        fetch_model_metadata(f"s3://{BUCKET}/tiny/single/")
    elapsed = time.monotonic() - t0
    assert isinstance(info.value, ConnectionError)
    assert f"127.0.0.1:{port}" in str(info.value)
    assert elapsed < 30, f"took {elapsed:.1f}s"


# --- 8. a model whose prefix is a string-prefix of another's --------------------------------
@pytest.mark.parametrize("spelling", ["with-slash", "without-slash"])
def test_string_prefix_models_do_not_mix(
    spelling: str,
    s3_server: LocalS3Server,
    tiny_models: dict[str, UploadedModel],
    s3_env: dict[str, str],
) -> None:
    single = tiny_models["single"]
    assert single.uri == f"s3://{BUCKET}/tiny/single/"
    other_uri = f"s3://{BUCKET}/tiny/single-copy/"
    s3_server.upload_dir(tiny_models["sharded"].local, other_uri)
    s3_server.put(other_uri + "copy_only.json", b'{"copy": true}')
    other_metadata = tiny_models["sharded"].metadata | {"copy_only.json"}

    def spell(uri: str) -> str:
        return uri if spelling == "with-slash" else uri.rstrip("/")

    log = AccessLog(s3_server)
    a = fetch_model_metadata(spell(single.uri))
    b = fetch_model_metadata(spell(other_uri))
    assert a != b
    assert _files(a) == single.metadata
    _assert_same_bytes(a, single, single.metadata)
    assert _files(b) == other_metadata
    assert (b / "copy_only.json").read_bytes() == b'{"copy": true}'
    assert json.loads((a / MARKER).read_text())["uri"] == single.uri
    assert json.loads((b / MARKER).read_text())["uri"] == other_uri
    gets = log.gets("tiny/single")
    assert gets == Counter(
        {
            **{"tiny/single/" + m: 1 for m in single.metadata},
            **{"tiny/single-copy/" + m: 1 for m in other_metadata},
        }
    ), gets
