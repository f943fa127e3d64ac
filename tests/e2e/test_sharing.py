"""The node's shared pull on the user's path (issues 12 and 19), end to end through Ray
Data, vLLM's CPU build and the real S3 server, with nothing set that a user would not set
(no Ray Data or vLLM variable, no TMPDIR): a model of four safetensors files whose last
one the link holds back until an engine streams its weights, so that engines wait on the
region while it fills;
the answers equal an unshared run's (greedy); each weight byte served once; no weight file
on a disk-backed path; and no region, lock, socket, segment or process left when the job
ends, whether or not an engine was still waiting."""

from __future__ import annotations

import contextlib
import glob
import json
import math
import os
import re
import stat
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from helpers.jobs import (
    SHARDED_MAX_TOKENS,
    SHARDED_QUESTIONS,
    fixed_pool,
    run_isolated,
    store_through,
)
from helpers.links import TappedLink
from helpers.s3log import AccessLog, copy_model, prefix_of
from helpers.waiting import wait_until

from ray_stream_llm.weights.pull import CHUNK
from ray_stream_llm.weights.region import DEFAULT_BASE

pytestmark = [pytest.mark.s3, pytest.mark.e2e, pytest.mark.engine]
QUESTIONS = SHARDED_QUESTIONS  # the control's (sharded_job)


@pytest.fixture(scope="module")
def sharded(s3_server, tiny_models):
    """The tiny Llama in four safetensors files, on a prefix of its own."""
    return copy_model(s3_server, tiny_models["sharded"], "user-path")


@pytest.fixture(scope="module")
def unshared_sums(sharded_job) -> list[dict]:
    """What the control's engine held once loaded (its ``weight_checksums``, one rank)."""
    [report] = sharded_job["out"]["load_reports"]
    return list(report["weight_checksums"])


@pytest.fixture(scope="module")
def unshared_answers(sharded_job) -> dict[str, str]:
    """The control: the same questions answered by one engine streaming the same model from
    the store (the session's sharded_job, tests/conftest.py)."""
    out = sharded_job["out"]
    assert [r["weight_sharing"] for r in out["load_reports"]] == ["off"]
    return {r["question"]: r["answer"] for r in out["rows"]}


def _tmp_entries() -> dict[str, bool]:
    """What /tmp holds at its top level now: name -> is a socket."""
    found = {}
    for name in os.listdir("/tmp"):
        try:
            found[name] = stat.S_ISSOCK(os.lstat(os.path.join("/tmp", name)).st_mode)
        except FileNotFoundError:
            continue
    return found


def _nothing_left() -> None:
    """No region or lock of the node's pull, and no engine IPC directory in /tmp."""

    def left() -> tuple[list[Path], list[str]]:
        regions = list(Path(DEFAULT_BASE).rglob("*")) if Path(DEFAULT_BASE).exists() else []
        return regions, [n for n in os.listdir("/tmp") if n.startswith("rsl-rpc-")]

    wait_until(lambda: not any(left()), 30, lambda: repr(left()), poll=0.5)


@contextlib.contextmanager
def _once_streaming(then: Callable[[], None]) -> Iterator[threading.Event]:
    """Calls ``then`` once an engine started streaming its weights: its load report (the
    first write, with the bytes it plans to read) in its actor's report directory, under
    /tmp (TMPDIR unset). The event is set once ``then`` ran."""
    ran, stop = threading.Event(), threading.Event()

    def watch() -> None:
        while not stop.wait(0.1):
            for path in glob.glob("/tmp/rsl-load-*/[0-9]*.json"):
                try:
                    planned = json.loads(Path(path).read_text()).get("planned_bytes")
                except (OSError, ValueError):  # being written
                    continue
                if planned:
                    then()
                    ran.set()
                    return

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        yield ran
    finally:
        stop.set()
        watcher.join()


def test_auto_shares_one_pull_on_the_users_path(
    s3_server, sharded, unshared_answers, unshared_sums, work
):
    sizes = {p.name: p.stat().st_size for p in sharded.local.glob("*.safetensors")}
    before = _tmp_entries()
    log = AccessLog(s3_server)
    # The engines read the region's files in the marker's order, one at a time. The last
    # comes at a trickle (256 B/s, in pieces that keep the pull's reads alive) until an
    # engine streams, then at 16 KB/s: its rest (about 0.4 MB) takes seconds after the
    # engine came to it, however long the engines took to start.
    last = sorted(sizes)[-1]
    with (
        TappedLink(s3_server.port) as link,
        _once_streaming(lambda: link.slow(re.escape(last), 16 << 10, piece=4 << 10)) as opened,
    ):
        link.slow(re.escape(last), 256, piece=512)
        out, written, seconds = run_isolated(
            s3_server,
            work,
            sharded.uri,
            "runai_streamer",
            QUESTIONS,
            max_tokens=SHARDED_MAX_TOKENS,
            # the store's default budget (the node's pull of the trickled file reads on)
            object_store=store_through(s3_server, link.endpoint_url),
            # weight_sharing="auto", the default
            config={"concurrency": fixed_pool(2), "weight_checksums": True},
            num_cpus=4,
            env={"TMPDIR": None, "VLLM_RPC_BASE_PATH": None},  # as a user who never set them
        )
        link_bytes = link.bytes_down
    assert {r["question"]: r["answer"] for r in out["rows"]} == unshared_answers
    reports = out["load_reports"]
    # what each engine holds once loaded is what the control's engine, streaming the store
    # itself, holds (a sha256 per parameter: integrations/vllm/checksums.py)
    assert len(reports) == 2, reports  # both engines of the pool loaded
    [control] = unshared_sums
    held = [[(c["parameters"], c["sha256"]) for c in r["weight_checksums"]] for r in reports]
    assert held == [[(control["parameters"], control["sha256"])]] * 2, held
    assert all(r["weight_sharing"] == "node" for r in reports), reports
    # the region was still filling when an engine came to its weights: it waited, file by
    # file, and read each only once complete (the answers above are the proof it read them)
    assert opened.is_set()
    assert max(r["weight_wait_seconds"] for r in reports) > 1.0, reports
    # each weight object in one ranged GET per 8 MiB, once for the node, plus the two reads
    # of the driver's preflight (the header's length, then the header)
    prefix = prefix_of(sharded.uri)
    gets = log.gets(prefix)
    assert {k: v for k, v in gets.items() if k.endswith(".safetensors")} == {
        prefix + name: math.ceil(size / CHUNK) + 2 for name, size in sizes.items()
    }
    weights = sum(sizes.values())
    assert weights <= link_bytes < weights + (1 << 20), (link_bytes, weights)
    assert {p: n for p, n in written.items() if not p.startswith(DEFAULT_BASE + "/")} == {}
    _nothing_left()
    # with TMPDIR unset vLLM would put its IPC sockets in /tmp; each engine kept them in a
    # directory of its own, removed with it
    new = {n for n, sock in _tmp_entries().items() if n not in before and sock}
    assert not new, new
    print(
        f"\n{len(reports)} engine(s) ready, shared: {link_bytes} bytes over the link for "
        f"{weights} weight bytes; waits {[round(r['weight_wait_seconds'], 2) for r in reports]}"
        f" s; {seconds:.1f}s"
    )


def test_tensor_parallel_ranks_read_the_nodes_one_pull(s3_server, sharded, work):
    """TP=2 with the default sharing ('auto'): the ranks are processes of the engine actor
    (the 'mp' executor), and each reads every weight file from the node's region, so the
    store serves the model once (the server's access log), where streaming served it once
    per rank (docs/sharded.md)."""
    sizes = {p.name: p.stat().st_size for p in sharded.local.glob("*.safetensors")}
    log = AccessLog(s3_server)
    out, written, seconds = run_isolated(
        s3_server,
        work,
        sharded.uri,
        "runai_streamer",
        QUESTIONS,
        max_tokens=SHARDED_MAX_TOKENS,
        engine_kwargs={"tensor_parallel_size": 2},
        num_cpus=4,
    )
    assert len(out["rows"]) == len(QUESTIONS) and all(r["answer"] for r in out["rows"])
    [report] = out["load_reports"]
    assert report["weight_sharing"] == "node", report
    ranks = report["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1] and len({r["pid"] for r in ranks}) == 2
    for rank in ranks:  # every rank read every file, from the region
        assert sorted(os.path.basename(f) for f in rank["objects"]) == sorted(sizes), rank
        assert all(f.startswith(DEFAULT_BASE + "/") for f in rank["objects"]), rank
    # each weight object once for the node (one ranged GET per 8 MiB), plus the two reads
    # of the driver's preflight: not once per rank
    prefix = prefix_of(sharded.uri)
    assert {k: v for k, v in log.gets(prefix).items() if k.endswith(".safetensors")} == {
        prefix + name: math.ceil(size / CHUNK) + 2 for name, size in sizes.items()
    }
    assert {p: n for p, n in written.items() if not p.startswith(DEFAULT_BASE + "/")} == {}
    # the ranks' segments too (psm_*, vllm_dist_*): a TP=2 job here once left two vllm_dist_*
    assert out["shm_left"] == [], out["agent_logs"]
    _nothing_left()
    print(
        f"\nTP=2 on the region: ranks {[round(r['seconds'], 2) for r in ranks]} s; {seconds:.1f}s"
    )


def test_an_engine_whose_node_would_not_run_the_plugin_fails_closed_before_vllm(
    s3_server, sharded, work
):
    """A node whose workers' VLLM_PLUGINS leaves this library's plugin out (the driver's
    environment does not, so the driver's own check passes): the node's region is read only
    through the plugin's loader, so the engine actor refuses with one typed line naming the
    reason and the fix, before vLLM starts; no weight is read from the store beyond the
    driver's preflight, and nothing is left."""
    log = AccessLog(s3_server)
    out, written, _ = run_isolated(
        s3_server,
        work,
        sharded.uri,
        "runai_streamer",
        QUESTIONS,
        max_tokens=SHARDED_MAX_TOKENS,
        config={"weight_sharing": "node"},
        nodes=[{"num_cpus": 2, "env_vars": {"VLLM_PLUGINS": "some_other_plugin"}}],
        expect_failure=True,
        timeout=300,
    )
    error = out.get("error")
    assert error and error["class"] == "PluginNotActiveError", out["log"][-3000:]
    assert "VLLM_PLUGINS='some_other_plugin'" in error["message"], error
    assert "ray_stream_llm_load_report" in error["message"], error  # the fix names it
    # vLLM never started: no engine-core process wrote its start line
    assert "EngineCore" not in out["log"], out["log"][-3000:]
    # the store served the driver's preflight (the header's length, then the header) and
    # no pull: the node's stage actors did not start one either
    gets = log.gets(prefix_of(sharded.uri))
    assert [n for k, n in gets.items() if k.endswith(".safetensors")] == [2] * 4, gets
    assert written == {}, written
    _nothing_left()
