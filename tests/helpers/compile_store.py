"""The compile cache's store half, checked the same way against each store (SeaweedFS,
fake-gcs-server, Azurite): an artifact shipped is fetched whole and never replaced, a
damaged one is named and not used. No engine: the artifact is a directory shaped like
vLLM's ``torch_aot_compile/<hash>/``."""

from __future__ import annotations

import logging
import os
import uuid
from pathlib import Path

import pytest

from ray_stream_llm import stores
from ray_stream_llm.integrations.vllm import compile_store
from ray_stream_llm.stores.base import StoreDeadline
from ray_stream_llm.stores.settings import ObjectStoreConfig
from ray_stream_llm.uri import parse_model_uri


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
    assert compile_store.ship(uri, "k1", made, store)
    assert not compile_store.ship(uri, "k1", made, store)  # a complete one is never replaced
    listed = _listing(uri + "k1/", store)
    assert sorted(listed) == ["0a1b2c.done", "0a1b2c.tar"]  # the tar and its marker, no more
    fresh = tmp_path / "node-b"
    assert compile_store.fetch(uri, "k1", fresh, store) == ["0a1b2c"]
    expected = {k: v for k, v in files(made).items() if not k.endswith(".tmp")}
    assert files(fresh / "0a1b2c") == expected  # whole, without the file being written
    assert [p.name for p in fresh.iterdir()] == ["0a1b2c"]  # no staging left
    # a directory the node has is never touched; another key holds nothing
    (fresh / "0a1b2c" / "rank_0_0" / "model").write_bytes(b"vLLM's own")
    assert compile_store.fetch(uri, "k1", fresh, store) == []
    assert (fresh / "0a1b2c" / "rank_0_0" / "model").read_bytes() == b"vLLM's own"
    assert compile_store.fetch(uri, "k2", tmp_path / "node-c", store) == []


def damaged_is_named_and_not_used(
    uri: str,
    store: ObjectStoreConfig | None,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert compile_store.ship(uri, "k", artifact(tmp_path / "a", "deadbeef"), store)
    bad = tmp_path / "bad.tar"
    bad.write_bytes(b"not the tar its marker describes")
    target = parse_model_uri(uri + "k/")  # the tar replaced behind the library's back
    impl = stores.backend(target.scheme)
    impl.write(impl.make_client(store, StoreDeadline()), target, "deadbeef.tar", str(bad))
    with caplog.at_level(logging.WARNING):
        assert compile_store.fetch(uri, "k", tmp_path / "b", store) == []
    assert f"{uri}k/deadbeef.tar not used" in caplog.text and "vLLM compiles" in caplog.text
    b = tmp_path / "b"
    assert not b.exists() or list(b.iterdir()) == []  # nothing unpacked, no staging left


def _listing(uri: str, store: ObjectStoreConfig | None) -> dict[str, int]:
    target = parse_model_uri(uri)
    impl = stores.backend(target.scheme)
    client = impl.make_client(store, StoreDeadline())
    return {o.path: o.size for o in impl.list_objects(client, target)}
