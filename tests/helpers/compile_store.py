"""The compile cache's store half, checked the same way against each store (SeaweedFS,
fake-gcs-server, Azurite): an artifact shipped is fetched whole and never replaced, a
damaged one is named and not used; an artifact compiled for another target is never
unpacked, and the fetch says why. No engine: the artifact is a directory shaped like
vLLM's ``torch_aot_compile/<hash>/``; the targets are written out as
``compile_target.target()`` reads them on an AMX machine and an AVX2 one."""

from __future__ import annotations

import json
import logging
import os
import uuid
from pathlib import Path
from typing import Any

import pytest

from ray_stream_llm import stores
from ray_stream_llm.integrations.vllm import compile_store
from ray_stream_llm.integrations.vllm.compile_store import CacheKey
from ray_stream_llm.stores.base import StoreDeadline
from ray_stream_llm.stores.settings import ObjectStoreConfig
from ray_stream_llm.uri import ModelURI, parse_model_uri

AMX = {
    "arch": "x86_64",
    "cpu_capability": "AVX512",
    "vec_isa": "avx512 avx512_vnni amx_tile",
    "vec_isa_flags": "-mavx512f -mavx512dq -mavx512vl -mavx512bw -mfma -mavx512vnni "
    "-mavx512vl -mamx-tile -mamx-bf16 -mamx-int8 -mavx512bf16",
    "device": "cpu",
    "device_capability": None,
    "torch": "2.13.0+cpu",
    "vllm": "0.29.0",
}
AVX2 = {**AMX, "cpu_capability": "AVX2", "vec_isa": "avx2", "vec_isa_flags": "-mavx2 -mfma -mf16c"}


def key(model: str, built_for: dict | None = None) -> CacheKey:
    """The store key of ``model`` for a node of target ``built_for`` (:data:`AMX`)."""
    return CacheKey(model, dict(built_for or AMX))


def artifact(root: Path, digest: str) -> Path:
    """A directory shaped like vLLM's torch_aot_compile/<hash>/, with a file being written."""
    (root / digest / "rank_0_0").mkdir(parents=True)
    (root / digest / "rank_0_0" / "model").write_bytes(os.urandom(3000))
    (root / digest / "inductor_cache").mkdir()
    (root / digest / "inductor_cache" / "graph.py").write_text("print('compiled')\n")
    (root / digest / "rank_0_0" / "model.123.tmp").write_text("being written")
    return root / digest


def files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def unique(prefix: str) -> str:
    """A fresh ``compile_cache_uri`` under ``prefix`` (``s3://bucket/``...)."""
    return f"{prefix.rstrip('/')}/unit-{uuid.uuid4().hex[:8]}/"


def shipped_is_fetched_whole_and_never_replaced(
    uri: str, store: ObjectStoreConfig | None, tmp_path: Path
) -> None:
    made = artifact(tmp_path / "node-a", "0a1b2c")
    k1 = key("k1")
    assert compile_store.ship(uri, k1, made, store)
    assert not compile_store.ship(uri, k1, made, store)  # a complete one is never replaced
    listed = _listing(uri + "k1/", store)
    # the tar and its marker, no more, under the model and the target
    assert sorted(listed) == [f"{k1.target_dir}/0a1b2c.done", f"{k1.target_dir}/0a1b2c.tar"]
    fresh = tmp_path / "node-b"
    got = compile_store.fetch(uri, key("k1"), fresh, store)
    assert got.hashes == ["0a1b2c"] and got.why_not is None
    expected = {k: v for k, v in files(made).items() if not k.endswith(".tmp")}
    assert files(fresh / "0a1b2c") == expected  # whole, without the file being written
    assert [p.name for p in fresh.iterdir()] == ["0a1b2c"]  # no staging left
    # a directory the node has is never touched; another key holds nothing
    (fresh / "0a1b2c" / "rank_0_0" / "model").write_bytes(b"vLLM's own")
    got = compile_store.fetch(uri, k1, fresh, store)
    assert got.hashes == [] and got.why_not is None  # the node has it: nothing to explain
    assert (fresh / "0a1b2c" / "rank_0_0" / "model").read_bytes() == b"vLLM's own"
    got = compile_store.fetch(uri, key("k2"), tmp_path / "node-c", store)
    assert got.hashes == [] and got.why_not is None  # nothing of that model anywhere


def damaged_is_named_and_not_used(
    uri: str,
    store: ObjectStoreConfig | None,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    k = key("k")
    assert compile_store.ship(uri, k, artifact(tmp_path / "a", "deadbeef"), store)
    bad = tmp_path / "bad.tar"
    bad.write_bytes(b"not the tar its marker describes")
    _put(uri + "k/", f"{k.target_dir}/deadbeef.tar", bad, store)  # behind the library's back
    with caplog.at_level(logging.WARNING):
        got = compile_store.fetch(uri, k, tmp_path / "b", store)
    assert got.hashes == [] and "deadbeef.tar: ValueError: the tar's size" in str(got.why_not)
    assert f"{uri}k/{k.target_dir}/deadbeef.tar not used" in caplog.text
    assert "vLLM compiles" in caplog.text
    b = tmp_path / "b"
    assert not b.exists() or list(b.iterdir()) == []  # nothing unpacked, no staging left


def other_target_is_never_unpacked(
    uri: str,
    store: ObjectStoreConfig | None,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An AMX node's artifact, as :func:`compile_store.ship` writes it: an AVX2 node of the
    same model fetches nothing and says why; the artifact moved under the AVX2 node's key
    (a tampered or hand-copied store) and a marker that records no target (written by an
    earlier version of this library) are refused by what their marker records; an AMX node
    still loads it."""
    made = artifact(tmp_path / "amx", "0a1b2c")
    amx, avx2 = key("m", AMX), key("m", AVX2)
    assert amx.model == avx2.model and amx.target_dir != avx2.target_dir
    assert compile_store.ship(uri, amx, made, store)
    older = tmp_path / "avx2"
    why = (
        "artifact for CPU AVX512, Inductor avx512 avx512_vnni amx_tile; "
        "this node CPU AVX2, Inductor avx2"
    )
    got = compile_store.fetch(uri, avx2, older, store)
    assert (got.hashes, got.why_not) == ([], why)
    assert not older.exists() or list(older.iterdir()) == []
    # the AMX node's tar and marker, byte for byte, under the AVX2 node's target
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    for suffix in (".tar", ".done"):
        _get(uri + "m/", f"{amx.target_dir}/0a1b2c{suffix}", shipped / suffix, store)
        _put(uri + "m/", f"{avx2.target_dir}/0a1b2c{suffix}", shipped / suffix, store)
    with caplog.at_level(logging.WARNING):
        got = compile_store.fetch(uri, avx2, older, store)
    assert got.hashes == [] and got.refused == [f"0a1b2c.tar: {why}"], got
    assert f"{uri}m/{avx2.target_dir}/0a1b2c.tar not used ({why})" in caplog.text
    assert not older.exists() or list(older.iterdir()) == []  # nothing unpacked
    # a marker as an earlier version wrote it: the tar's size and SHA-256, no target
    marker = json.loads((shipped / ".done").read_text())
    assert marker.pop("target") == AMX
    (shipped / ".done").write_text(json.dumps(marker))
    _put(uri + "m/", f"{avx2.target_dir}/0a1b2c.done", shipped / ".done", store)
    got = compile_store.fetch(uri, avx2, older, store)
    assert got.hashes == [] and "records no target" in str(got.why_not), got
    assert not older.exists() or list(older.iterdir()) == []
    # the same target still loads it
    got = compile_store.fetch(uri, key("m", dict(AMX)), tmp_path / "amx-too", store)
    assert got.hashes == ["0a1b2c"]


def _client(uri: str, store: ObjectStoreConfig | None) -> tuple[ModelURI, Any, Any]:
    target = parse_model_uri(uri)
    impl = stores.backend(target.scheme)
    return target, impl, impl.make_client(store, StoreDeadline())


def _put(uri: str, name: str, source: Path, store: ObjectStoreConfig | None) -> None:
    target, impl, client = _client(uri, store)
    impl.write(client, target, name, str(source))


def _get(uri: str, name: str, dest: Path, store: ObjectStoreConfig | None) -> None:
    target, _, client = _client(uri, store)
    dest.write_bytes(stores.read(client, target, name, StoreDeadline()))


def _listing(uri: str, store: ObjectStoreConfig | None) -> dict[str, int]:
    target = parse_model_uri(uri)
    impl = stores.backend(target.scheme)
    client = impl.make_client(store, StoreDeadline())
    return {o.path: o.size for o in impl.list_objects(client, target)}
