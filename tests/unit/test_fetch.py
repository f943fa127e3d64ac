"""The fetched metadata directory as vLLM is given it (fetch.py, issue 55): a path named by
the metadata's content, so that vLLM's own compile key is the same for the same model under
any URI."""

from __future__ import annotations

import json
import os
from pathlib import Path

from ray_stream_llm.fetch import MARKER, content_dir, metadata_digest


def _fetched(root: Path, name: str, config: str) -> Path:
    directory = root / "models" / name
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(config)
    files = {"config.json": {"size": len(config), "crc32": sum(config.encode())}}
    (directory / MARKER).write_text(json.dumps({"uri": f"s3://b/{name}/", "files": files}))
    return directory


def test_the_same_metadata_under_two_uris_is_one_path(monkeypatch, tmp_path):
    monkeypatch.setenv("RAY_STREAM_LLM_CACHE", str(tmp_path))
    first = _fetched(tmp_path, "one", '{"a": 1}')
    second = _fetched(tmp_path, "two", '{"a": 1}')
    other = _fetched(tmp_path, "three", '{"a": 2}')
    assert metadata_digest(first) == metadata_digest(second) != metadata_digest(other)
    link = content_dir(first)
    assert link == tmp_path / "content" / str(metadata_digest(first))
    assert (link / "config.json").read_text() == '{"a": 1}'
    assert content_dir(second) == link  # pointed at the second now: the same files
    assert os.path.realpath(link) == str(second.resolve())
    assert content_dir(other) != link
    assert sorted(p.name for p in (tmp_path / "content").iterdir()) == sorted(
        [link.name, content_dir(other).name]
    )  # no staging link left


def test_a_directory_the_library_did_not_fetch_is_given_as_it_is(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    assert metadata_digest(tmp_path) is None
    assert content_dir(tmp_path) == tmp_path
