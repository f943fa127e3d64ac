"""Where the cache is (``cache_root``) and how a directory appears there whole
(``publishing``, ``replace``, ``sweep``: ray_stream_llm/cache.py), in tmp_path."""

from __future__ import annotations

from pathlib import Path

import pytest

from ray_stream_llm.cache import CACHE_ENV, cache_root, make_dirs, publishing, replace, sweep
from ray_stream_llm.errors import CacheNotWritableError


def test_cache_root_prefers_the_library_variable_then_xdg_then_home(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv(CACHE_ENV, "~/mine")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "home" / "mine"
    monkeypatch.delenv(CACHE_ENV)
    assert cache_root() == tmp_path / "xdg" / "ray_stream_llm"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache_root() == tmp_path / "home" / ".cache" / "ray_stream_llm"


def test_an_unwritable_cache_names_the_setting_that_chose_it(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    with pytest.raises(CacheNotWritableError) as info:
        make_dirs(blocker / "cache", setting="MY_SETTING")
    assert "MY_SETTING" in str(info.value) and repr(str(blocker / "cache")) in str(info.value)


def _publish(target: Path, locks: Path, content: str) -> None:
    with publishing(target, lock_dir=locks) as staging:
        (staging / "file").write_text(content)
        replace(staging, target)


def test_a_published_directory_replaces_the_old_one_whole(tmp_path):
    target, locks = tmp_path / "models" / "m", tmp_path / "locks"
    _publish(target, locks, "one")
    _publish(target, locks, "two")
    assert (target / "file").read_text() == "two"
    assert sorted(p.name for p in target.parent.iterdir()) == ["m"]  # no staging, no old copy


def test_a_publisher_that_fails_leaves_no_target_and_no_staging(tmp_path):
    target, locks = tmp_path / "models" / "m", tmp_path / "locks"
    with pytest.raises(RuntimeError), publishing(target, lock_dir=locks) as staging:
        (staging / "half").write_text("x")
        raise RuntimeError("killed mid-way")
    assert not target.exists()
    assert list(target.parent.iterdir()) == []


def test_sweep_removes_what_a_killed_publisher_left(tmp_path):
    target, locks = tmp_path / "models" / "m", tmp_path / "locks"
    _publish(target, locks, "one")
    left = [target.parent / ".m.tmp-abc", target.parent / ".m.old-def"]
    for stale in left:
        stale.mkdir()
    other = target.parent / ".n.tmp-abc"  # another target's staging: not this one's to remove
    other.mkdir()
    sweep(target, lock_dir=locks)
    assert not any(p.exists() for p in left)
    assert other.exists() and (target / "file").read_text() == "one"
