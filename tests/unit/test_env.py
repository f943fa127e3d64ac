"""The one helper that sets variables for a block (env.py, issue 56)."""

from __future__ import annotations

import os

import pytest

from ray_stream_llm.env import scoped


def test_a_block_sets_and_unsets_and_everything_is_restored_after(monkeypatch):
    monkeypatch.setenv("RSL_TEST_KEPT", "before")
    monkeypatch.setenv("RSL_TEST_UNSET", "there")
    monkeypatch.delenv("RSL_TEST_NEW", raising=False)
    with scoped({"RSL_TEST_KEPT": "during", "RSL_TEST_UNSET": None, "RSL_TEST_NEW": "1"}):
        assert os.environ["RSL_TEST_KEPT"] == "during"
        assert "RSL_TEST_UNSET" not in os.environ
        assert os.environ["RSL_TEST_NEW"] == "1"
    assert os.environ["RSL_TEST_KEPT"] == "before"
    assert os.environ["RSL_TEST_UNSET"] == "there"
    assert "RSL_TEST_NEW" not in os.environ


def test_the_environment_is_restored_when_the_block_raises(monkeypatch):
    monkeypatch.setenv("RSL_TEST_KEPT", "before")
    with pytest.raises(RuntimeError), scoped({"RSL_TEST_KEPT": "during"}):
        raise RuntimeError("the block failed")
    assert os.environ["RSL_TEST_KEPT"] == "before"
