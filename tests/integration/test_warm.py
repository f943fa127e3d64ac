"""A node's weights kept warm between jobs (issue 20, item 5), without Ray: against the real
S3 server, measured by its access log and the region's files (kept by a thread of the
holding process, the keeper outside Ray)."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest
from helpers.s3log import AccessLog, copy_model, prefix_of
from helpers.waiting import wait_until

from ray_stream_llm.fetch import fetch_metadata_report
from ray_stream_llm.uri import parse_model_uri
from ray_stream_llm.weights import marks, pull
from ray_stream_llm.weights.reading import wait_for
from ray_stream_llm.weights.region import NodeWeights, Sharing

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
        wait_for(region, obj.path)
    weights.release()
    return region


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
    # or by its keeper once the pull's thread has let its lock go)
    wait_until((region / marks.WARM_UNTIL).exists, 30, "never kept warm")
    assert all(marks.done(region, o.path) for o in objects)

    log = AccessLog(s3_server)
    assert _job(model.uri, objects, base, keep_warm_s=30) == region
    assert _weight_gets(log, model.uri) == {}  # the second job: no weight byte from the store
    # what its engines' reports say (pull_source, pull_bytes), and kept for ITS keep_warm_s
    status = marks.pull_record(region)
    assert status is not None and (status.read.source, status.bytes) == ("kept warm", 0)
    assert json.loads((region / marks.CREATED).read_text())["keep_warm_s"] == 30
    for obj in objects:
        assert (region / obj.path).read_bytes() == (model.local / obj.path).read_bytes()


def test_warm_weights_are_removed_when_their_time_is_up(s3_server, s3_env, tiny_models, base):
    """Kept for keep_warm_s after the last engine, not less (the deadline the region records
    is that long after the release, and the region is there until it), removed after it
    (not much later: its keeper polls)."""
    keep = 3.0
    model = copy_model(s3_server, tiny_models["single"], "warm-expiry")
    objects = fetch_metadata_report(model.uri).weight_objects
    region = _job(model.uri, objects, base, keep_warm_s=keep)
    released = time.time()
    warm_until = region / marks.WARM_UNTIL
    wait_until(warm_until.exists, 30, "never kept warm")
    deadline = float(warm_until.read_text())
    # set at the release, or by its keeper after its 2 s grace once the pull's thread is done
    assert released - 1 <= deadline - keep <= released + 10, (deadline - released, keep)
    seen_until = wait_until(lambda: None if region.exists() else time.time(), 30, "never removed")
    assert seen_until >= deadline, f"removed {deadline - seen_until:.1f} s before its time"
    assert seen_until <= deadline + 10, f"removed {seen_until - deadline:.1f} s after its time"


def test_warm_weights_left_by_an_earlier_ray_session_are_adopted(
    s3_server, s3_env, tiny_models, base
):
    """Ray gives a node a new id each session, and the region's path holds it: a warm
    region under another node id with the same weights is taken over, not pulled again."""
    model = copy_model(s3_server, tiny_models["single"], "warm-adopt")
    objects = fetch_metadata_report(model.uri).weight_objects
    region = _job(model.uri, objects, base, keep_warm_s=60)
    # what an earlier session's job leaves once it has ended: its pull's record written (the
    # pull's thread can still be writing it after the engine saw its files whole; moved
    # then, the pull fails) and the region kept warm
    assert pull.finished_pull(region) is not None
    wait_until((region / marks.WARM_UNTIL).exists, 30, "never kept warm")
    old = base / "earlier-session" / region.name
    old.parent.mkdir(parents=True)
    os.rename(region, old)
    log = AccessLog(s3_server)
    assert _job(model.uri, objects, base, keep_warm_s=60) == region
    assert _weight_gets(log, model.uri) == {}
    assert not old.exists() and not old.parent.exists()
    status = marks.pull_record(region)
    assert status is not None and (status.read.source, status.bytes) == ("kept warm", 0)


def test_a_region_not_kept_warm_goes_with_its_last_engine(s3_server, s3_env, tiny_models, base):
    model = copy_model(s3_server, tiny_models["single"], "not-warm")
    objects = fetch_metadata_report(model.uri).weight_objects
    region = _job(model.uri, objects, base, keep_warm_s=0)
    released = time.time()
    # removed by the release, or by its keeper once the pull's thread let its lock go (its
    # 2 s grace), and never kept warm meanwhile: no deadline was ever written while it stood
    kept_warm: list[str] = []

    def gone() -> float | None:
        if (region / marks.WARM_UNTIL).exists():
            kept_warm.append((region / marks.WARM_UNTIL).read_text())
        return None if region.exists() else time.time()

    removed = wait_until(gone, 30, "the region outlived its last engine", poll=0.02)
    assert kept_warm == [], kept_warm
    assert removed - released < 10, f"removed {removed - released:.1f} s after the release"
