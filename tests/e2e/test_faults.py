"""Faults while an engine streams its weights (issue 4), injected by a TCP proxy between
the job and the real S3 server. Each job runs as a user's script (tests/helpers/e2e_driver.py).

The jobs use the tiny model (tests/helpers/models.py): what is under test is the library's
handling of the store, not the model's answers, and a cut placed by the model's own sizes
lands inside the weight stream as surely as 100 MB into SmolLM2's 269 MB did."""

from __future__ import annotations

import time

import pytest
from helpers.jobs import (
    ENGINE_ONLY,
    SHARDED_MAX_TOKENS,
    SHARDED_QUESTIONS,
    run_isolated,
    store_through,
)
from helpers.links import TappedLink
from helpers.models import UploadedModel

pytestmark = [pytest.mark.s3, pytest.mark.e2e, pytest.mark.engine]
QUESTIONS = ["What is 2+2?", "Name three primary colors.", "Say hello in French."]


def _mid_weights(model: UploadedModel) -> tuple[int, int, int]:
    """(cut_after_bytes, metadata bytes, weight bytes): the proxy cuts once the metadata and
    half the weights have gone through it, so the cut falls inside the engine's stream.
    Everything else that crosses the proxy before the weights (listings, safetensors
    headers, HTTP headers) is a few KiB, against a margin of half the weights."""
    metadata = sum((model.local / m).stat().st_size for m in model.metadata)
    weights = sum(
        (model.local / w).stat().st_size for w in model.weights if w.endswith(".safetensors")
    )
    return metadata + weights // 2, metadata, weights


def _assert_cut_inside_the_weights(proxy: TappedLink, model: UploadedModel, weights: int) -> None:
    """Measured by the proxy: the fault was injected, the request whose answer it cut was
    the engine's read of a weight file, and not all the weight bytes had come down by then."""
    assert proxy.cut_at is not None and proxy.bytes_at_cut is not None, "no fault injected"
    gets = [r for r in proxy.requests_at_cut if r.startswith("GET ")]
    assert gets and gets[-1].split("?")[0].endswith(".safetensors"), proxy.requests_at_cut
    assert proxy.bytes_at_cut < weights + sum(
        (model.local / m).stat().st_size for m in model.metadata
    ), (proxy.bytes_at_cut, proxy.requests_at_cut)


def _pull_ranges(
    ranges: list[tuple[str, tuple[int, int] | None]], sizes: dict[str, int]
) -> list[str]:
    """The weight files, in order, of the ranged GETs the node's pull sent (its 8 MiB
    ranges: the driver's preflight reads only each file's header)."""
    from ray_stream_llm.weights.pull import CHUNK

    pulled = []
    for path, span in ranges:
        for name, size in sizes.items():
            if path.endswith("/" + name) and span is not None and span[0] % CHUNK == 0:
                pulled += [name] if span[1] == min(span[0] + CHUNK, size) - 1 else []
    return pulled


def test_store_drops_mid_pull_and_returns_within_the_budget(s3_server, tiny_models, work):
    """The library's defaults (the node's region, 'auto'): the store goes away while the
    node's pull is under way (every connection reset, new ones refused) and comes back
    8 s later, within the store's budget (the pull's waits, 0.5 s doubling to 5 s, knock on
    it meanwhile). The pull, and every stage actor's metadata step, wait for it instead of
    failing: every row comes back, no engine start is retried, and the pull resumes where it
    was (no file it had whole is read again). Measured by the link: the cut fell between the
    pull's first range and its last."""
    model = tiny_models["sharded"]
    sizes = {
        w: (model.local / w).stat().st_size for w in model.weights if w.endswith(".safetensors")
    }
    assert len(sizes) >= 3, sizes  # a cut between files, with whole files before it
    cut_after_bytes, metadata, weights = _mid_weights(model)
    with TappedLink(s3_server.port, cut_after_bytes=cut_after_bytes, down_for=8) as proxy:
        start = time.monotonic()
        out, written, seconds = run_isolated(
            s3_server,
            work,
            model.uri,
            "runai_streamer",
            QUESTIONS,
            max_tokens=16,
            object_store=store_through(s3_server, proxy.endpoint_url),
        )
        assert proxy.cut_at is not None, "no fault injected"
        cut_after = proxy.cut_at - start
        refused = proxy.refused
        before = _pull_ranges(proxy.ranges_at_cut, sizes)
        after = _pull_ranges(proxy.ranges[len(proxy.ranges_at_cut) :], sizes)
    # mid-pull: the pull had asked for a range before the cut, and asked for more after it
    assert before and after, (before, after, proxy.ranges)
    assert proxy.bytes_at_cut is not None and proxy.bytes_at_cut < metadata + weights
    assert refused >= 1  # it knocked while the store was down
    # resumed: what was whole before the cut (all but the file in flight) is not read again
    assert not set(after) & set(before[:-1]), (before, after)
    assert set(before) | set(after) == set(sizes), (before, after)
    rows = out["rows"]
    assert sorted(r["question"] for r in rows) == sorted(QUESTIONS)
    assert all(r["answer"].strip() for r in rows)
    assert [r["weight_sharing"] for r in out["load_reports"]] == ["node"], out["load_reports"]
    assert written == {} and out["shm_left"] == [], out["agent_logs"]
    log = (work / "job.log").read_text()
    assert "The object store did not answer" in log  # the library waited, and said so
    assert "failed to start while loading its weights" not in log  # the pull did not fail
    print(
        f"\nstore cut at {cut_after:.1f}s (after {proxy.bytes_at_cut} bytes down: "
        f"{metadata} metadata + {weights} weight bytes in the store), the pull's files "
        f"before the cut {before}, after {after}; {refused} connection(s) refused while it "
        f"was down; job complete at {seconds:.1f}s, {len(rows)}/{len(QUESTIONS)} rows"
    )


def test_store_stays_away_fails_with_the_cause(s3_server, tiny_models, work):
    """The store goes away mid-stream for good: the job fails, within the retry budget, with
    the store's state in the message; no row is reported as done."""
    model = tiny_models["single"]
    cut_after_bytes, metadata, weights = _mid_weights(model)
    with TappedLink(s3_server.port, cut_after_bytes=cut_after_bytes, down_for=None) as proxy:
        start = time.monotonic()
        out, written, seconds = run_isolated(
            s3_server,
            work,
            model.uri,
            "runai_streamer",
            QUESTIONS,
            max_tokens=16,
            object_store=store_through(s3_server, proxy.endpoint_url),
            config={
                "load_retries": 1,
                "load_retry_backoff_s": 1.0,
                "weight_sharing": "off",
                **ENGINE_ONLY,
            },
            expect_failure=True,
        )
        _assert_cut_inside_the_weights(proxy, model, weights)
        assert proxy.cut_at is not None
        cut_after = proxy.cut_at - start
        # the retry (load_retries=1) knocked on the store while it was down, and was refused
        assert proxy.refused >= 1, proxy.refused
    # the driver's `except WeightLoadError` ran (ray_stream_llm.typed_errors), Ray's
    # ActorDiedError as its cause
    assert out["error"]["class"] == "WeightLoadError", out["log"][-3000:]
    assert out["error"]["cause"] == "ActorDiedError"
    assert "failed to load its weights 2 time(s)" in out["error"]["message"]
    assert "cannot reach the object store" in out["error"]["message"]
    assert not (work / "out.json").exists()  # no partial output passed off as complete
    assert written == {} and out["shm_left"] == [], out["agent_logs"]
    print(f"\nstore cut at {cut_after:.1f}s, job failed at {seconds:.1f}s")


def test_store_left_down_mid_pull_fails_within_the_budget_naming_it(s3_server, tiny_models, work):
    """The library's defaults, the store gone mid-pull for good, a store budget of 15 s
    (ObjectStoreConfig.timeout_s): the node's pull waits for it for that budget and gives
    up; the job ends in one typed store error naming the endpoint, without an engine start
    retried to wait the budget again, and leaves nothing in /dev/shm."""
    model = tiny_models["sharded"]
    sizes = {
        w: (model.local / w).stat().st_size for w in model.weights if w.endswith(".safetensors")
    }
    budget = 15.0
    cut_after_bytes, metadata, weights = _mid_weights(model)
    with TappedLink(s3_server.port, cut_after_bytes=cut_after_bytes, down_for=None) as proxy:
        start = time.monotonic()
        out, written, seconds = run_isolated(
            s3_server,
            work,
            model.uri,
            "runai_streamer",
            QUESTIONS,
            max_tokens=16,
            object_store={**store_through(s3_server, proxy.endpoint_url), "timeout_s": budget},
            expect_failure=True,
        )
        assert proxy.cut_at is not None, "no fault injected"
        cut_after = proxy.cut_at - start
        failed_after = time.monotonic() - proxy.cut_at
        before = _pull_ranges(proxy.ranges_at_cut, sizes)
        assert before and set(before) != set(sizes), before  # the cut fell inside the pull
        assert proxy.refused >= 2, proxy.refused  # it knocked again while waiting
        endpoint = proxy.endpoint_url.removeprefix("http://")
    error = out.get("error")
    assert error and error["class"] in ("StoreUnreachableError", "StoreTimeoutError"), out["log"][
        -3000:
    ]
    assert endpoint in error["message"] and f"store's budget of {budget:g}s" in error["message"]
    assert "failed to start while loading its weights" not in out["log"]  # not retried
    assert not (work / "out.json").exists()
    assert written == {} and out["shm_left"] == [], out["agent_logs"]
    print(
        f"\nstore cut at {cut_after:.1f}s (pull's files before it {before}), job failed "
        f"{failed_after:.1f}s after the cut ({seconds:.1f}s in all), budget {budget:g}s: "
        f"{error['class']}: {error['message'][:300]}"
    )


# --- one job, two proofs: a slow store, and store settings given only in the config --------
# (the session's sharded_job, tests/conftest.py, which test_sharing also takes as its control)
def test_slow_store_still_completes(sharded_job):
    """50 ms added to every request chunk: slower, and every row comes back. Measured by the
    proxy: every shard the engine streamed was asked for through it, and it held every piece
    of every request 50 ms or more."""
    out, model = sharded_job["out"], sharded_job["model"]
    proxy = sharded_job["through_proxy"]
    assert sharded_job["bytes_down"] > 0
    bucket, _, prefix = model.uri.removeprefix("s3://").partition("/")
    asked = {r.split()[1].split("?")[0] for r in proxy["requests"] if r.startswith("GET ")}
    shards = {w for w in model.weights if w.endswith(".safetensors")}
    assert {f"/{bucket}/{prefix}{w}" for w in shards} <= asked, sorted(asked)
    # the link held every piece of every request the 50 ms before passing it on
    assert len(proxy["held"]) >= len(proxy["requests"]) > 0
    assert min(proxy["held"]) >= 0.05, sorted(proxy["held"])[:5]
    assert sorted(r["question"] for r in out["rows"]) == sorted(SHARDED_QUESTIONS)
    assert all(r["num_generated_tokens"] == SHARDED_MAX_TOKENS for r in out["rows"])
    print(
        f"\nslow store: {len(out['rows'])} rows in {sharded_job['seconds']:.1f}s, "
        f"{len(proxy['held'])} request pieces held {min(proxy['held']) * 1000:.0f}-"
        f"{max(proxy['held']) * 1000:.0f} ms ({len(proxy['requests'])} requests)"
    )


def test_settings_only_in_config_reach_every_actor_and_no_secret_leaks(s3_server, sharded_job):
    """Issue 3: the store set once, in the config; the driver's environment has no AWS
    variable. A secret must not appear in any output or any file the run wrote."""
    out, model, work = sharded_job["out"], sharded_job["model"], sharded_job["work"]
    secret = sharded_job["secret"]
    assert len(out["rows"]) == len(SHARDED_QUESTIONS)
    assert sharded_job["written"] == {}
    shards = {w for w in model.weights if w.endswith(".safetensors")}
    assert len(shards) >= 3
    reads = {u.removeprefix(model.uri) for u in sharded_job["reads"]}
    assert shards <= reads  # every shard was streamed by the engine, with the config's settings
    # the secret: nowhere in the driver's output, Ray's session logs, or any file written
    leaks = []
    driver_log = (work / "job.log").read_text(errors="replace")
    if secret in driver_log:
        leaks.append("driver output")
    for path in work.rglob("*"):
        if path.is_file() and path.name != "spec.json":  # the test's own input to the script
            try:
                if secret.encode() in path.read_bytes():
                    leaks.append(str(path))
            except OSError:
                continue
    assert leaks == [], leaks
    assert any((work / "ray").rglob("*.log")) or any((work / "ray").rglob("*.err"))


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
        config={"load_retries": 2, "load_retry_backoff_s": 30.0, **ENGINE_ONLY},
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
