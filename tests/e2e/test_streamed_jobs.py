"""End to end: Ray Data + vLLM (CPU build) + the Run:ai streamer + a real S3 server.

Each job runs as a user's script in a subprocess whose HOME, caches, TMPDIR, Ray
session dir, vLLM sockets and inductor cache all live in one temporary directory,
so "which weight files appeared on local disk" is answered by walking it (plus
/dev/shm and /tmp for anything written outside).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.jobs import SHARDED_MAX_TOKENS, SHARDED_QUESTIONS, metric, reads_under, run_isolated
from helpers.models import is_weight, tensor_bytes

pytestmark = [pytest.mark.s3, pytest.mark.e2e, pytest.mark.engine]


def test_a_streamed_job_reports_what_it_read_and_writes_no_weight_file(sharded_job):
    """The session's job on the sharded tiny model (tests/conftest.py: ``sharded_job``, the
    engine streaming the store itself) as its report, Ray's metrics and its console tell it,
    each against what the store's own log says it served. (The real model's answers, on the
    default path: tests/e2e/test_readme.py, `make demo` and the quickstart.)"""
    out, model, work = sharded_job["out"], sharded_job["model"], sharded_job["work"]
    assert sorted(r["question"] for r in out["rows"]) == sorted(SHARDED_QUESTIONS)
    assert all(r["num_generated_tokens"] == SHARDED_MAX_TOKENS for r in out["rows"])
    # no weight file of any format appeared on local disk, no shared memory left behind
    assert sharded_job["written"] == {}, sharded_job["written"]
    assert out["shm_left"] == [], out["agent_logs"]
    # the store's own access log: the safetensors objects were read, no other weight object
    shards = sorted(w for w in model.weights if w.endswith(".safetensors"))
    assert len(shards) >= 3
    reads = sharded_job["reads"]
    assert {u for u in reads if is_weight(u.rsplit("/", 1)[1])} == {model.uri + w for w in shards}
    # metadata fetched once per node: each metadata object GET exactly once
    meta_gets = [
        r.uri
        for r in sharded_job["served"]
        if r.method == "GET"
        and r.status == 200
        and r.uri.startswith(model.uri)
        and not r.uri.endswith(".safetensors")
    ]
    assert sorted(meta_gets) == sorted(model.uri + m for m in model.metadata)
    # the load report: its bytes are the objects the store served (their sizes in the
    # store), and the tensors the streamer delivered are those objects less their headers
    size = sum((model.local / w).stat().st_size for w in shards)
    [report] = out["load_reports"]
    assert report["streamed"] and report["model"] == model.uri and report["attempt"] == 1
    assert (report["weight_files"], report["weight_bytes"]) == (len(shards), size)
    assert report["streamed_tensor_bytes"] == sum(tensor_bytes(model.local / w) for w in shards)
    assert 0 < report["stream_seconds"] < report["ready_seconds"]
    assert report["gib_per_s"] == pytest.approx(size / 2**30 / report["stream_seconds"])
    assert report["metadata_files"] == len(model.metadata)
    assert report["metadata_bytes"] == sum((model.local / m).stat().st_size for m in model.metadata)
    # the same figures through Ray's metrics, as Prometheus scrapes them
    metrics = out["metrics"]
    assert metric(metrics, "weight_bytes_streamed_total", model.uri) == size
    assert metric(metrics, "metadata_bytes_total", model.uri) == report["metadata_bytes"]
    assert metric(metrics, "engines_ready_total", model.uri) == 1
    assert metric(metrics, "engine_ready_seconds", model.uri) == pytest.approx(
        report["ready_seconds"]
    )
    assert metric(metrics, "weight_stream_seconds", model.uri) == pytest.approx(
        report["stream_seconds"]
    )
    # the log line and the progress bars in the driver's console
    log = (work / "job.log").read_text()
    assert f"Engine ready for {model.uri}" in log
    assert f"{size} bytes streamed in {report['stream_seconds']:.2f}s" in log
    assert f"Streaming weights of {model.uri}: 100%" in log
    assert f"Fetching metadata of {model.uri}: 100%" in log
    print(
        f"\nstreamed: {len(out['rows'])} rows, first row {out['first_row_seconds']:.1f}s, "
        f"weight bytes on disk 0, metadata {out['metadata_files']} files "
        f"{out['metadata_bytes']} B; engine ready {report['ready_seconds']:.1f}s, "
        f"streamed {size} B in {report['stream_seconds']:.2f}s"
    )


def test_rays_own_loader_downloads_every_weight_file_into_the_jobs_home(
    s3_server, tiny_models, work
):
    """The control of the suite's "no weight file on local disk" checks, on this Ray: the same
    job with Ray's own load format (vLLM's default, not streaming) wrote every weight file
    of the model to local disk, in the job's HOME, and the engine reported nothing
    streamed. (On Ray 2.48: tests/e2e/test_reporters_script.py; with the 1 GiB model and the
    figures: `ray-stream-llm bench`, make bench.)"""
    model = tiny_models["sharded"]
    before = s3_server.served()
    out, written, _ = run_isolated(
        s3_server, work, model.uri, None, ["hello world", "ray data"], max_tokens=4
    )
    assert len(out["rows"]) == 2 and all(r["num_generated_tokens"] > 0 for r in out["rows"])
    # each weight file once, whole, and nowhere but under the job's HOME
    assert sorted(Path(p).name for p in written) == sorted(model.weights), written
    assert {Path(p).name: size for p, size in written.items()} == {
        w: (model.local / w).stat().st_size for w in model.weights
    }
    assert all(Path(p).is_relative_to(work / "home") for p in written), written
    # what the store served: every weight object; what the engine said: nothing streamed
    reads = reads_under(s3_server, model.uri, before)
    assert {u.removeprefix(model.uri) for u in reads if is_weight(u)} == set(model.weights)
    [report] = out["load_reports"]
    assert report["streamed"] is False and report["model"] == model.uri
    assert out["shm_left"] == [], out["agent_logs"]
