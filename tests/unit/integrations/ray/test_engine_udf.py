"""The engine UDF's retry policy (ray_stream_llm/integrations/ray/engine_udf.py): which failed
starts are retried (``load_retries``), which fail at once, and which typed error the driver
gets, from real watcher reports and real region failure marks in tmp_path. The store check
(one listing of the model) is the edge replaced here."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ray_stream_llm import stores
from ray_stream_llm.errors import (
    EngineStartError,
    ObjectChangedError,
    StoreTimeoutError,
    StoreUnreachableError,
    WeightLoadError,
)
from ray_stream_llm.integrations.ray import engine_udf
from ray_stream_llm.integrations.ray.stream_watch import StreamWatcher
from ray_stream_llm.integrations.vllm.plugin import RAY_COPY_ENV
from ray_stream_llm.plan import Plan
from ray_stream_llm.stores.base import WAITED_OUT
from ray_stream_llm.uri import parse_model_uri
from ray_stream_llm.weights.marks import record_failure

URI = "s3://bucket/m/"
PLAN = Plan(parse_model_uri(URI), load_retries=2, load_retry_backoff_s=1.0)
STREAMER = {
    "chain": [
        {
            "type": "OSError",
            "message": "File access error",
            "module": "runai_model_streamer.file_streamer",
        }
    ]
}
SETTING = {
    "chain": [
        {
            "type": "ValueError",
            "message": "max_model_len 99999 is too large",
            "module": "vllm.config",
        }
    ]
}


@pytest.fixture
def store_up(monkeypatch):
    """The store answers the check's listing."""
    monkeypatch.setattr(stores, "list_model", lambda model, store: [])


def _watcher(*failures, sessions=()) -> StreamWatcher:
    watcher = StreamWatcher(URI, progress=False)
    watcher.failures, watcher.sessions = list(failures), list(sessions)
    return watcher


class _Region:
    """A weight source read from a region directory (what the helpers look at)."""

    def __init__(self, region: Path):
        self.region = str(region)


def test_a_streamer_failure_is_retried_until_the_last_attempt(store_up):
    watcher = _watcher(STREAMER)
    exc = RuntimeError("Engine core initialization failed")
    assert engine_udf._start_failure(URI, PLAN, exc, watcher, 1, 3) is None
    assert engine_udf._start_failure(URI, PLAN, exc, watcher, 2, 3) is None
    error = engine_udf._start_failure(URI, PLAN, exc, watcher, 3, 3)
    assert isinstance(error, WeightLoadError)
    message = str(error)
    assert "failed to load its weights 3 time(s)" in message
    assert "root cause: OSError: File access error" in message
    assert "object store now: reachable" in message
    assert "load_retries and load_retry_backoff_s" in message


def test_an_interrupted_stream_is_retried(store_up):
    watcher = _watcher(sessions=[{"planned_bytes": 8, "delivered_bytes": 2, "done": False}])
    assert engine_udf._start_failure(URI, PLAN, RuntimeError("x"), watcher, 1, 3) is None


def test_a_store_that_does_not_answer_now_is_retried_and_named(monkeypatch):
    def down(model, store):
        raise StoreUnreachableError("cannot reach the object store")

    monkeypatch.setattr(stores, "list_model", down)
    watcher = _watcher(SETTING)  # whatever vLLM logged: the store is down now
    assert engine_udf._start_failure(URI, PLAN, RuntimeError("x"), watcher, 1, 2) is None
    error = engine_udf._start_failure(URI, PLAN, RuntimeError("x"), watcher, 2, 2)
    assert "object store now: StoreUnreachableError: cannot reach" in str(error)


def test_a_setting_vllm_refused_fails_at_once_quoting_vllms_cause(store_up):
    error = engine_udf._start_failure(URI, PLAN, RuntimeError("x"), _watcher(SETTING), 1, 3)
    assert isinstance(error, EngineStartError)
    assert "ValueError: max_model_len 99999 is too large" in str(error)
    assert "(not retried)" in str(error) and "engine_kwargs" in str(error)


def test_without_a_plan_nothing_is_retried():
    error = engine_udf._start_failure(URI, None, KeyError("k"), _watcher(STREAMER), 1, 3)
    assert isinstance(error, EngineStartError)


def test_the_cause_is_vllms_root_cause_else_the_exception_redacted():
    assert engine_udf._cause(RuntimeError("x"), _watcher(SETTING)).startswith("ValueError:")
    cause = engine_udf._cause(RuntimeError("boom s3://AKIA:s3cr3t@bucket/m/"), _watcher())
    assert cause == "RuntimeError: boom s3://***@bucket/m/"


@pytest.mark.parametrize("cls", [StoreUnreachableError, StoreTimeoutError])
def test_a_pull_that_waited_the_store_out_is_not_retried(tmp_path, cls):
    record_failure(tmp_path, cls(f"the store did not answer; {WAITED_OUT} 300s"))
    error = engine_udf._budget_spent(URI, _Region(tmp_path))
    assert type(error) is cls
    assert "(not retried)" in str(error) and "ObjectStoreConfig.timeout_s" in str(error)


def test_a_pull_that_failed_early_or_no_region_leaves_the_retry_policy_to_decide(tmp_path):
    assert engine_udf._budget_spent(URI, _Region(tmp_path)) is None  # no failure mark
    record_failure(tmp_path, StoreUnreachableError("connection refused"))  # not waited out
    assert engine_udf._budget_spent(URI, _Region(tmp_path)) is None
    assert engine_udf._budget_spent(URI, None) is None


def test_an_object_that_changed_under_the_pull_is_raised_as_its_own_class(tmp_path):
    assert engine_udf._object_changed(URI, _Region(tmp_path), 2) is None
    record_failure(tmp_path, ObjectChangedError("model.safetensors changed (ETag a -> b)"))
    error = engine_udf._object_changed(URI, _Region(tmp_path), 2)
    assert isinstance(error, ObjectChangedError)
    assert "failed to load its weights 2 time(s)" in str(error)
    assert "ETag a -> b" in str(error)


def test_an_engine_variable_reaches_vllms_ray_workers_once(monkeypatch):
    monkeypatch.setenv(RAY_COPY_ENV, "A")
    monkeypatch.delenv("RSL_TEST_VAR", raising=False)
    engine_udf._engine_env("RSL_TEST_VAR", "1")
    engine_udf._engine_env("RSL_TEST_VAR", "2")
    assert os.environ["RSL_TEST_VAR"] == "2"
    assert os.environ[RAY_COPY_ENV] == "A,RSL_TEST_VAR"
    engine_udf._engine_env("RSL_TEST_VAR", None)
    assert "RSL_TEST_VAR" not in os.environ
