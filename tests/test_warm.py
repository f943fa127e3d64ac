"""A node's weights kept warm between jobs (issue 20, item 5), without Ray: against the real
S3 server, measured by its access log, the region's files and its reaper process."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import psutil
import pytest
from helpers.s3log import AccessLog, copy_model, prefix_of

from ray_stream_llm.fetch import fetch_metadata_report
from ray_stream_llm.uri import parse_model_uri
from ray_stream_llm.weights import region as node_weights
from ray_stream_llm.weights.region import NodeWeights, Sharing, wait_for

pytestmark = [pytest.mark.s3]


@pytest.fixture
def base():
    path = Path("/dev/shm") / f"rsl-warm-{os.getpid()}-{time.monotonic_ns()}"
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _job(uri: str, objects, base: Path, keep_warm_s: float) -> Path:
    """What one job's engine does with the node's region: acquire, stream, release."""
    weights = NodeWeights(parse_model_uri(uri), objects, Sharing("node", base=str(base),
                          keep_warm_s=keep_warm_s))  # fmt: skip
    region = Path(weights.acquire())
    for obj in objects:
        wait_for(str(region / obj.path))
    weights.release()
    return region


def _reaper_of(region: Path) -> list[psutil.Process]:
    return [
        p
        for p in psutil.process_iter(["cmdline"])
        if "reap" in (p.info["cmdline"] or []) and str(region) in (p.info["cmdline"] or [])
    ]


def _weight_gets(log: AccessLog, uri: str) -> dict[str, int]:
    return {k: n for k, n in log.gets(prefix_of(uri)).items() if k.endswith(".safetensors")}


def test_the_next_job_streams_warm_weights_and_reads_no_weight_byte(
    s3_server, s3_env, tiny_models, base
):
    model = copy_model(s3_server, tiny_models["sharded"], "warm")
    objects = fetch_metadata_report(model.uri).weight_objects
    log = AccessLog(s3_server)
    region = _job(model.uri, objects, base, keep_warm_s=60)
    assert len(_weight_gets(log, model.uri)) == len(objects)  # the first job pulled
    # the last engine is gone: the region stays, complete, with its deadline (set at once,
    # or by the reaper once the pull's thread has let its lock go) and its reaper
    deadline = time.monotonic() + 30
    while not (region / node_weights.WARM_UNTIL).exists():
        assert time.monotonic() < deadline and region.exists(), "never kept warm"
        time.sleep(0.2)
    assert _reaper_of(region)
    assert all(node_weights.done(region, o.path) for o in objects)

    log = AccessLog(s3_server)
    assert _job(model.uri, objects, base, keep_warm_s=60) == region
    assert _weight_gets(log, model.uri) == {}  # the second job: no weight byte from the store
    for obj in objects:
        assert (region / obj.path).read_bytes() == (model.local / obj.path).read_bytes()


def test_warm_weights_are_removed_when_their_time_is_up(s3_server, s3_env, tiny_models, base):
    model = copy_model(s3_server, tiny_models["single"], "warm-expiry")
    objects = fetch_metadata_report(model.uri).weight_objects
    region = _job(model.uri, objects, base, keep_warm_s=3)
    assert region.exists()
    deadline = time.monotonic() + 30
    while region.exists() or _reaper_of(region):
        assert time.monotonic() < deadline, (region.exists(), _reaper_of(region))
        time.sleep(0.2)


def test_warm_weights_left_by_an_earlier_ray_session_are_adopted(
    s3_server, s3_env, tiny_models, base
):
    """Ray gives a node a new id each session, and the region's path holds it: a warm
    region under another node id with the same weights is taken over, not pulled again."""
    model = copy_model(s3_server, tiny_models["single"], "warm-adopt")
    objects = fetch_metadata_report(model.uri).weight_objects
    region = _job(model.uri, objects, base, keep_warm_s=60)
    old = base / "earlier-session" / region.name
    old.parent.mkdir(parents=True)
    os.rename(region, old)
    log = AccessLog(s3_server)
    assert _job(model.uri, objects, base, keep_warm_s=60) == region
    assert _weight_gets(log, model.uri) == {}
    assert not old.exists() and not old.parent.exists()


def test_a_region_not_kept_warm_goes_with_its_last_engine(s3_server, s3_env, tiny_models, base):
    model = copy_model(s3_server, tiny_models["single"], "not-warm")
    objects = fetch_metadata_report(model.uri).weight_objects
    region = _job(model.uri, objects, base, keep_warm_s=0)
    # removed by the release, or by the reaper once the pull's thread let its lock go
    deadline = time.monotonic() + 30
    while region.exists():
        assert time.monotonic() < deadline, "the region outlived its last engine"
        time.sleep(0.2)
    assert not (region.parent / region.name / node_weights.WARM_UNTIL).exists()
