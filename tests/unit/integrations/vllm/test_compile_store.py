"""vLLM's compile cache shipped through the store
(ray_stream_llm/integrations/vllm/compile_store.py), its own logic without a store server or an
engine: the key (the model's fetched metadata, not its path; none without the library's marker
or with part of the target unknown), the artifact directories taken from the compile records,
and the ship and fetch rules (the tar first and the marker last, never replacing a complete
artifact, never unpacking another target's or a damaged one, never touching a directory the
node holds). The store there is a local directory with the interface of
``compile_store._Prefix`` (listing, read, download, write), so that the rules, not a store's
client, are what is measured; the same through a real S3 server:
tests/integration/test_compile_store.py."""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import tarfile
import zlib
from pathlib import Path
from typing import Any

import pytest

from ray_stream_llm.fetch import MARKER
from ray_stream_llm.integrations.vllm import compile_store, compile_target
from ray_stream_llm.stores.base import ObjectInfo

TARGET: dict[str, str | None] = {
    "arch": "x86_64",
    "cpu_capability": "AVX2",
    "vec_isa": "avx2",
    "vec_isa_flags": "-mavx2",
    "device": "cpu",
    "device_capability": None,
    "torch": "2.9.0",
    "vllm": "0.29.0",
}
OTHER = {**TARGET, "cpu_capability": "AVX512", "vec_isa": "avx512", "vec_isa_flags": "-mavx512f"}


def fetched_metadata(directory: Path, files: dict[str, bytes]) -> Path:
    """``directory`` holding ``files`` and the marker the library's fetch writes for them."""
    directory.mkdir(parents=True)
    recorded = {}
    for name, data in files.items():
        (directory / name).write_bytes(data)
        recorded[name] = {"size": len(data), "crc32": zlib.crc32(data)}
    (directory / MARKER).write_text(json.dumps({"files": recorded}))
    return directory


class LocalPrefix:
    """``<uri>/<key>/`` of a store kept in the local directory ``uri``: what ``_Prefix``
    offers ``fetch`` and ``ship``, counting what is read and written."""

    def __init__(self, uri: str, key: str, store: Any) -> None:
        self.root = Path(uri) / key
        self.uri = f"{uri}/{key}/"
        self.listing: dict[str, ObjectInfo] = {}
        self.reads: list[str] = []
        self.writes: list[str] = []
        PREFIXES.append(self)

    def names(self) -> dict[str, ObjectInfo]:
        self.listing = {
            str(p.relative_to(self.root)): ObjectInfo(
                str(p.relative_to(self.root)), str(p), p.stat().st_size, ""
            )
            for p in sorted(self.root.rglob("*"))
            if p.is_file()
        }
        return self.listing

    def get(self, name: str, dest: Path) -> None:
        self.reads.append(name)
        shutil.copyfile(self.root / self.listing[name].path, dest)

    def get_json(self, name: str) -> dict[str, Any]:
        self.reads.append(name)
        return dict(json.loads((self.root / name).read_text()))

    def put(self, local: Path, name: str) -> None:
        self.writes.append(name)
        (self.root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(local, self.root / name)


PREFIXES: list[LocalPrefix] = []


@pytest.fixture
def store(tmp_path, monkeypatch) -> str:
    """The URI of an empty local store, which ``compile_store`` reaches through
    :class:`LocalPrefix`."""
    PREFIXES.clear()
    monkeypatch.setattr(compile_store, "_Prefix", LocalPrefix)
    (tmp_path / "store").mkdir()
    return str(tmp_path / "store")


def artifact(root: Path, digest: str, content: bytes = b"compiled") -> Path:
    """vLLM's AOT artifact directory ``<root>/<digest>``, with a temporary file and a lock that
    another process is still writing."""
    directory = root / digest
    (directory / "sub").mkdir(parents=True)
    (directory / "model.bin").write_bytes(content)
    (directory / "sub" / "part.bin").write_bytes(content * 2)
    (directory / "model.bin.tmp").write_bytes(b"half")
    (directory / ".lock").write_bytes(b"")
    return directory


def files_of(directory: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(directory)): p.read_bytes()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


# --- the key -----------------------------------------------------------------------------------
def test_the_metadata_identity_is_the_fetched_content_not_the_path(tmp_path):
    files = {"config.json": b'{"a": 1}', "tokenizer.json": b"{}"}
    first = fetched_metadata(tmp_path / "uri-a" / "model", files)
    second = fetched_metadata(tmp_path / "uri-b" / "elsewhere", files)
    changed = fetched_metadata(tmp_path / "uri-c" / "model", {**files, "config.json": b'{"a": 2}'})
    identity = compile_store.metadata_identity(str(first))
    assert identity is not None and identity.startswith("ray_stream_llm-metadata:")
    assert compile_store.metadata_identity(str(second)) == identity
    (tmp_path / "link").symlink_to(first)
    assert compile_store.metadata_identity(str(tmp_path / "link")) == identity
    assert compile_store.metadata_identity(str(changed)) != identity
    # a directory this library did not fetch, or no directory at all: nothing to key it by
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "config.json").write_text("{}")
    for other in (str(plain), str(tmp_path / "absent"), "", None, 3, tmp_path):
        assert compile_store.metadata_identity(other) is None


def test_the_cache_key_names_the_metadata_and_the_target_or_is_none(tmp_path, monkeypatch, caplog):
    files = {"config.json": b"{}"}
    first = fetched_metadata(tmp_path / "a", files)
    second = fetched_metadata(tmp_path / "b", files)
    monkeypatch.setattr(compile_target, "target", lambda: dict(TARGET))
    key = compile_store.cache_key(str(first))
    assert key is not None and key == compile_store.cache_key(str(second))
    assert key.target == TARGET and key.target_dir == compile_target.digest(TARGET)
    assert len(key.model) == 32 and str(key) == f"{key.model}/{key.target_dir}"
    # another target: the same model, another directory
    monkeypatch.setattr(compile_target, "target", lambda: dict(OTHER))
    other = compile_store.cache_key(str(first))
    assert other is not None and other.model == key.model and other.target_dir != key.target_dir
    # part of the target unknown: nothing vouches for the code, so no key (and one warning)
    monkeypatch.setattr(compile_target, "target", lambda: {**TARGET, "vec_isa": None})
    with caplog.at_level(logging.WARNING, logger=compile_store.__name__):
        assert compile_store.cache_key(str(first)) is None
    assert "vec_isa could not be read" in caplog.text
    assert compile_store.cache_key(str(tmp_path)) is None  # no marker: not the library's


# --- the records -------------------------------------------------------------------------------
def test_compiled_dirs_are_the_saved_artifacts_that_exist(tmp_path):
    saved = artifact(tmp_path, "aaa")
    other = artifact(tmp_path, "bbb")
    records = [
        {"aot_saved": True, "artifacts": [str(saved / "sub" / "part.bin")]},
        {"aot_saved": True, "artifacts": [str(saved / "sub" / "x"), str(other / "sub" / "y")]},
        {"aot_saved": False, "artifacts": [str(tmp_path / "ccc" / "sub" / "z")]},  # not saved
        {"aot_saved": True, "artifacts": [str(tmp_path / "gone" / "sub" / "z")]},  # removed
        {"aot_saved": True, "artifacts": None},
        {},
    ]
    (tmp_path / "ccc").mkdir()
    assert compile_store.compiled_dirs(records) == [saved, other]
    assert compile_store.compiled_dirs([]) == []


def test_why_not_says_the_first_refusal_and_how_many_more():
    assert compile_store.Fetched().why_not is None
    assert compile_store.Fetched(hashes=["a"], refused=["b.tar: x"]).why_not is None
    assert compile_store.Fetched(refused=["b.tar: x"]).why_not == "b.tar: x"
    three = compile_store.Fetched(refused=["b.tar: x", "c.tar: y", "d.tar: z"])
    assert three.why_not == "b.tar: x (and 2 more not used)"


# --- shipping and fetching ---------------------------------------------------------------------
def test_a_shipped_artifact_is_fetched_whole_on_another_node(store, tmp_path):
    key = compile_store.CacheKey("m" * 32, dict(TARGET))
    compiled = artifact(tmp_path / "node-a", "abc123")
    assert compile_store.ship(store, key, compiled, None)
    assert PREFIXES[-1].writes == [f"{key.target_dir}/abc123.tar", f"{key.target_dir}/abc123.done"]
    marker = json.loads((Path(store) / key.model / key.target_dir / "abc123.done").read_text())
    tar_path = Path(store) / key.model / key.target_dir / "abc123.tar"
    assert marker == {
        "size": tar_path.stat().st_size,
        "sha256": hashlib.sha256(tar_path.read_bytes()).hexdigest(),
        "target": TARGET,
    }
    # a complete artifact is never replaced
    assert not compile_store.ship(store, key, artifact(tmp_path / "node-c", "abc123", b"x"), None)
    assert PREFIXES[-1].writes == []

    fresh = tmp_path / "node-b" / "torch_aot_compile"
    result = compile_store.fetch(store, key, fresh, None)
    assert result.hashes == ["abc123"] and result.why_not is None
    expected = {n: b for n, b in files_of(compiled).items() if n not in ("model.bin.tmp", ".lock")}
    assert files_of(fresh / "abc123") == expected  # what another process still wrote: left out
    assert [p.name for p in fresh.iterdir()] == ["abc123"]  # no staging left
    # held now: the node's directory is never touched again, nothing downloaded
    (fresh / "abc123" / "model.bin").write_bytes(b"vLLM's own")
    again = compile_store.fetch(store, key, fresh, None)
    assert again.hashes == [] and again.refused == []
    assert not any(r.endswith(".tar") for r in PREFIXES[-1].reads)
    assert (fresh / "abc123" / "model.bin").read_bytes() == b"vLLM's own"


def test_another_targets_artifact_is_never_unpacked_and_the_miss_says_why(store, tmp_path):
    theirs = compile_store.CacheKey("m" * 32, dict(OTHER))
    ours = compile_store.CacheKey("m" * 32, dict(TARGET))
    assert compile_store.ship(store, theirs, artifact(tmp_path / "avx512", "abc123"), None)
    root = tmp_path / "node" / "torch_aot_compile"
    result = compile_store.fetch(store, ours, root, None)
    assert result.hashes == [] and not root.exists()
    assert result.why_not == compile_target.mismatch(OTHER, TARGET)
    assert "artifact for CPU AVX512" in result.why_not and "this node CPU AVX2" in result.why_not

    # the same artifact moved under this node's target directory: its marker still refuses it
    ours_dir = Path(store) / ours.model / ours.target_dir
    shutil.copytree(Path(store) / theirs.model / theirs.target_dir, ours_dir)
    moved = compile_store.fetch(store, ours, root, None)
    assert moved.hashes == [] and not (root / "abc123").exists()
    assert moved.refused == [f"abc123.tar: {compile_target.mismatch(OTHER, TARGET)}"]
    assert not any(r.endswith(".tar") for r in PREFIXES[-1].reads)  # not even downloaded


@pytest.mark.parametrize(
    ("damage", "why"),
    [
        ("size", "the tar's size is"),
        ("bytes", "the tar's SHA-256 differs from its marker's"),
        ("no target", "the artifact records no target"),
    ],
)
def test_a_damaged_artifact_is_refused_and_leaves_nothing(store, tmp_path, damage, why):
    key = compile_store.CacheKey("m" * 32, dict(TARGET))
    assert compile_store.ship(store, key, artifact(tmp_path / "a", "abc123"), None)
    where = Path(store) / key.model / key.target_dir
    tar_path, done = where / "abc123.tar", where / "abc123.done"
    marker = json.loads(done.read_text())
    if damage == "size":
        tar_path.write_bytes(tar_path.read_bytes() + b"\0")
    elif damage == "bytes":  # the same size, other bytes
        data = bytearray(tar_path.read_bytes())
        data[-1] ^= 0xFF
        tar_path.write_bytes(bytes(data))
    else:  # a marker of an earlier library: no target recorded
        del marker["target"]
        done.write_text(json.dumps(marker))
    root = tmp_path / "b" / "torch_aot_compile"
    result = compile_store.fetch(store, key, root, None)
    assert result.hashes == [] and len(result.refused) == 1
    assert result.refused[0].startswith("abc123.tar: ") and why in result.refused[0]
    assert not (root / "abc123").exists()
    assert not root.exists() or list(root.iterdir()) == []  # no staging left behind


def test_a_tar_without_the_artifact_directory_or_leaving_it_is_refused(store, tmp_path):
    key = compile_store.CacheKey("m" * 32, dict(TARGET))
    where = Path(store) / key.model / key.target_dir
    where.mkdir(parents=True)
    (tmp_path / "payload").write_bytes(b"x")
    for digest, arcname in (("wrongdir", "otherdir/payload"), ("escapes", "../../escaped")):
        tar_path = where / f"{digest}.tar"
        with tarfile.open(tar_path, "w") as tar:
            tar.add(tmp_path / "payload", arcname=arcname)
        marker = {
            "size": tar_path.stat().st_size,
            "sha256": hashlib.sha256(tar_path.read_bytes()).hexdigest(),
            "target": TARGET,
        }
        (where / f"{digest}.done").write_text(json.dumps(marker))
    root = tmp_path / "node" / "aot"
    result = compile_store.fetch(store, key, root, None)
    assert result.hashes == []
    refused = dict(r.split(": ", 1) for r in result.refused)
    assert sorted(refused) == ["escapes.tar", "wrongdir.tar"]
    assert "outside the destination" in refused["escapes.tar"]
    assert "the tar holds no directory 'wrongdir'" in refused["wrongdir.tar"]
    assert not (tmp_path / "node" / "escaped").exists() and not (tmp_path / "escaped").exists()
    assert list(root.iterdir()) == []


def test_a_store_that_cannot_be_read_is_a_miss_not_an_error(tmp_path):
    key = compile_store.CacheKey("m" * 32, dict(TARGET))
    # no backend serves this scheme: the store is unreachable, and vLLM compiles
    result = compile_store.fetch("file:///nowhere", key, tmp_path, None)
    assert result.hashes == [] and result.why_not is None
    assert not compile_store.ship("file:///nowhere", key, artifact(tmp_path, "abc"), None)
