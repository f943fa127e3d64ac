"""Faults while an engine streams its weights (issue 4), injected by a TCP proxy between
the job and the real S3 server. Each job runs as a user's script (tests/helpers/e2e_driver.py)."""

from __future__ import annotations

import time

import pytest
from helpers.faultproxy import FaultProxy
from helpers.jobs import run_isolated, store_through

pytestmark = [pytest.mark.s3, pytest.mark.e2e]
QUESTIONS = ["What is 2+2?", "Name three primary colors.", "Say hello in French."]


def test_store_drops_mid_stream_and_returns_within_retry_budget(s3_server, smollm2, work):
    """The store goes away after 100 MB of the 269 MB weights and comes back 20 s later:
    the engine start fails, is retried after the backoff, and every row comes back."""
    with FaultProxy(s3_server.port, cut_after_bytes=100_000_000, down_for=20) as proxy:
        start = time.monotonic()
        out, written, seconds = run_isolated(
            s3_server,
            work,
            smollm2.uri,
            "runai_streamer",
            QUESTIONS,
            max_tokens=16,
            object_store=store_through(s3_server, proxy.endpoint_url),
            config={"load_retries": 2, "load_retry_backoff_s": 5.0},
        )
        assert proxy.cut_at is not None and proxy.refused > 0, "the fault was not injected"
        cut_after = proxy.cut_at - start
    rows = out["rows"]
    assert sorted(r["question"] for r in rows) == sorted(QUESTIONS)
    assert all(r["answer"].strip() for r in rows)
    assert written == {} and out["shm_left"] == []
    log = (work / "job.log").read_text()
    assert "failed to start while loading its weights (attempt 1/3" in log
    print(
        f"\nstore cut at {cut_after:.1f}s, job complete at {seconds:.1f}s, "
        f"{len(rows)}/{len(QUESTIONS)} rows"
    )


def test_store_stays_away_fails_with_the_cause(s3_server, smollm2, work):
    """The store goes away mid-stream for good: the job fails, within the retry budget, with
    the store's state in the message; no row is reported as done."""
    with FaultProxy(s3_server.port, cut_after_bytes=100_000_000, down_for=None) as proxy:
        start = time.monotonic()
        out, written, seconds = run_isolated(
            s3_server,
            work,
            smollm2.uri,
            "runai_streamer",
            QUESTIONS,
            max_tokens=16,
            object_store=store_through(s3_server, proxy.endpoint_url),
            config={"load_retries": 1, "load_retry_backoff_s": 1.0},
            expect_failure=True,
        )
        cut_after = proxy.cut_at - start if proxy.cut_at else None
    # the driver's `except WeightLoadError` ran (ray_stream_llm.typed_errors), Ray's
    # ActorDiedError as its cause
    assert out["error"]["class"] == "WeightLoadError", out["log"][-3000:]
    assert out["error"]["cause"] == "ActorDiedError"
    assert "failed to load its weights 2 time(s)" in out["error"]["message"]
    assert "cannot reach the object store" in out["error"]["message"]
    assert not (work / "out.json").exists()  # no partial output passed off as complete
    assert written == {} and out["shm_left"] == []
    print(f"\nstore cut at {cut_after:.1f}s, job failed at {seconds:.1f}s")


def test_slow_store_still_completes(s3_server, tiny_models, work):
    """50 ms added to every request chunk: slower, and every row comes back."""
    with FaultProxy(s3_server.port, latency=0.05) as proxy:
        out, written, seconds = run_isolated(
            s3_server,
            work,
            tiny_models["sharded"].uri,
            "runai_streamer",
            ["hello world", "ray data", "object store"],
            max_tokens=4,
            object_store=store_through(s3_server, proxy.endpoint_url),
        )
        assert proxy.bytes_down > 0
    assert len(out["rows"]) == 3 and all(r["num_generated_tokens"] == 4 for r in out["rows"])
    print(f"\nslow store: {len(out['rows'])} rows in {seconds:.1f}s")


def test_engine_failing_for_another_reason_is_not_retried_and_names_the_cause(
    s3_server, tiny_models, work
):
    """vLLM's CPU memory check refuses the engine (gpu_memory_utilization=0.99 of the node):
    not the store, so no retry; the typed error quotes vLLM's own message, which otherwise
    only the engine's log has (issue 11, class 6)."""
    start = time.monotonic()
    out, written, seconds = run_isolated(
        s3_server,
        work,
        tiny_models["sharded"].uri,
        "runai_streamer",
        QUESTIONS[:1],
        max_tokens=4,
        engine_kwargs={"gpu_memory_utilization": 0.99},
        config={"load_retries": 2, "load_retry_backoff_s": 30.0},
        expect_failure=True,
    )
    error = out["error"]
    assert error["class"] == "EngineStartError", out["log"][-3000:]
    assert "not because of the object store (not retried)" in error["message"]
    assert "less than desired CPU memory utilization" in error["message"]  # vLLM's words
    assert "retrying" not in out["log"]
    assert written == {}
    print(
        f"\nfailed in {seconds:.1f}s (started {time.monotonic() - start:.1f}s ago): "
        f"{error['message'][:300]}"
    )
