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


def test_the_same_metadata_under_two_uris_is_one_path(tmp_path):
    base = tmp_path / "content"
    first = _fetched(tmp_path, "one", '{"a": 1}')
    second = _fetched(tmp_path, "two", '{"a": 1}')
    other = _fetched(tmp_path, "three", '{"a": 2}')
    assert metadata_digest(first) == metadata_digest(second) != metadata_digest(other)
    link = content_dir(first, base)
    assert link == base / str(metadata_digest(first))
    assert (link / "config.json").read_text() == '{"a": 1}'
    assert content_dir(second, base) == link  # pointed at the second now: the same files
    assert os.path.realpath(link) == str(second.resolve())
    assert content_dir(other, base) != link
    assert sorted(p.name for p in base.iterdir()) == sorted(
        [link.name, content_dir(other, base).name]
    )  # no staging link left


def test_a_directory_the_library_did_not_fetch_is_given_as_it_is(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    assert metadata_digest(tmp_path) is None
    assert content_dir(tmp_path, tmp_path / "content") == tmp_path


def test_the_links_live_at_one_path_whatever_home_or_the_cache_is():
    """vLLM hashes the path: two HOMEs (two jobs, two nodes of one image) give one path."""
    from ray_stream_llm.fetch import CONTENT_BASE

    assert Path(f"/tmp/ray_stream_llm-{os.getuid()}/models") == CONTENT_BASE
