"""End to end: Ray Data + vLLM (CPU build) + the Run:ai streamer + a real S3 server.

Each job runs as a user's script in a subprocess whose HOME, caches, TMPDIR, Ray
session dir, vLLM sockets and inductor cache all live in one temporary directory,
so "which weight files appeared on local disk" is answered by walking it (plus
/dev/shm and /tmp for anything written outside).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from models import is_weight, tensor_bytes
from ray_stream_llm._localstore import LocalS3Server, _free_ports
from ray_stream_llm._shm import orphaned_segments, remove_orphaned_segments

pytestmark = pytest.mark.e2e

QUESTIONS = ["What is 2+2?", "Name three primary colors.", "What is the capital of France?",
             "How many legs does a spider have?", "Say hello in French."]
DRIVER = Path(__file__).with_name("e2e_driver.py")


@pytest.fixture
def work() -> Iterator[Path]:
    """A short directory under /tmp: Ray's socket paths must stay under 107 bytes."""
    path = Path(tempfile.mkdtemp(prefix="rsl-e2e-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _weight_files(roots: list[Path], since: float) -> dict[str, int]:
    """Weight files (any format) under ``roots`` modified since ``since``: path -> bytes."""
    found = {}
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            # other tests' own fixtures (models built on purpose) live in pytest's tmp dirs
            dirnames[:] = [d for d in dirnames if not d.startswith("pytest-of-")]
            for name in filenames:
                path = Path(dirpath) / name
                try:
                    stat = path.stat()
                except OSError:
                    continue
                if stat.st_mtime >= since and is_weight(name):
                    found[str(path)] = stat.st_size
    return found


def run_isolated(server: LocalS3Server, work: Path, model: str, load_format: str | None,
                 questions: list[str], max_tokens: int = 24, object_store: dict | None = None,
                 config: dict | None = None, expect_failure: bool = False,
                 metrics_port: int | None = None) -> tuple[dict, dict[str, int], float]:
    """Run the job as a user's script. With ``object_store`` the store settings are given
    only in the config: the driver's environment holds no AWS variable at all."""
    home, tmp = work / "home", work / "tmp"
    for d in (home, tmp, work / "rpc"):
        d.mkdir(parents=True, exist_ok=True)
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(home),
        "TMPDIR": str(tmp),
        "VLLM_RPC_BASE_PATH": str(work / "rpc"),
        "TORCHINDUCTOR_CACHE_DIR": str(work / "inductor"),
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "RAY_STREAM_LLM_ACTOR_LOGS": "1",  # actor logs in the driver's output too
        "RAY_metrics_report_interval_ms": "1000",  # workers push metrics every second
        **({} if object_store else server.env()),
    }
    spec = {"model": model, "load_format": load_format, "questions": questions,
            "max_tokens": max_tokens, "ray_temp_dir": str(work / "ray"),
            "object_store": object_store, "config": config or {}, "metrics_port": metrics_port}
    (work / "spec.json").write_text(json.dumps(spec))
    start = time.time()
    proc = subprocess.run([sys.executable, str(DRIVER), str(work / "spec.json"), str(work / "out.json")],
                          env=env, cwd=work, capture_output=True, text=True, timeout=600)
    (work / "driver.log").write_text(proc.stdout + proc.stderr)
    if expect_failure:
        assert proc.returncode != 0, "the job was expected to fail"
    else:
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    written = _weight_files([work, Path("/dev/shm"), Path("/tmp")], start)
    out = {"log": proc.stdout + proc.stderr} if expect_failure else json.loads(
        (work / "out.json").read_text())
    # Shared-memory segments no live process maps, created during the run. Our engine UDF
    # removes its own; Ray's (the control run) leaks vLLM's 160 MiB ring buffer: record it,
    # then remove it so the machine stays clean.
    out["shm_left"] = [p.name for p in orphaned_segments(start - 1)]
    remove_orphaned_segments(start - 1, wait=0)
    return out, written, time.time() - start


def _reads_under(server: LocalS3Server, prefix: str, before: list) -> set[str]:
    return {r.uri for r in server.served()[len(before):]
            if r.method == "GET" and r.status in (200, 206) and r.uri.startswith(prefix)}


def _metric(metrics: dict[str, float], name: str, model: str) -> float:
    """The value of one series of ours as Prometheus scraped it from the Ray cluster."""
    [value] = [v for k, v in metrics.items()
               if k.startswith(f"ray_stream_llm_{name}{{") and f'model="{model}"' in k]
    return value


def test_streamed_smollm2_answers_with_no_weights_on_disk(s3_server, smollm2, work):
    before = s3_server.served()
    port, = _free_ports(1)
    out, written, seconds = run_isolated(s3_server, work, smollm2.uri, "runai_streamer", QUESTIONS,
                                         metrics_port=port)
    rows = out["rows"]
    # every row in, every row out, each with generated text
    assert sorted(r["question"] for r in rows) == sorted(QUESTIONS)
    assert all(r["answer"].strip() and r["num_generated_tokens"] > 0 for r in rows)
    answers = {r["question"]: r["answer"] for r in rows}
    assert "4" in answers["What is 2+2?"], answers
    assert "Paris" in answers["What is the capital of France?"], answers
    # no weight file of any format appeared on local disk, no shared memory left behind
    assert written == {}, written
    assert out["shm_left"] == []
    # the store's own access log: the safetensors object was read, no other weight object
    reads = _reads_under(s3_server, smollm2.uri, before)
    assert f"{smollm2.uri}model.safetensors" in reads
    assert {u for u in reads if is_weight(u.rsplit('/', 1)[1])} == {f"{smollm2.uri}model.safetensors"}
    # metadata fetched once per node: each metadata object GET exactly once
    meta_gets = [r.uri for r in s3_server.served()[len(before):]
                 if r.method == "GET" and r.status == 200 and r.uri.startswith(smollm2.uri)
                 and not r.uri.endswith(".safetensors")]
    assert sorted(meta_gets) == sorted(f"{smollm2.uri}{m}" for m in smollm2.metadata)
    # the load report: its bytes are the object the store served (its size in the store),
    # and the tensors the streamer delivered are that object less its header
    weights = smollm2.local / "model.safetensors"
    size = weights.stat().st_size
    [report] = out["load_reports"]
    assert report["streamed"] and report["model"] == smollm2.uri and report["attempt"] == 1
    assert (report["weight_files"], report["weight_bytes"]) == (1, size)
    assert report["streamed_tensor_bytes"] == tensor_bytes(weights)
    assert 0 < report["stream_seconds"] < report["ready_seconds"]
    assert report["gib_per_s"] == pytest.approx(size / 2**30 / report["stream_seconds"])
    assert report["metadata_files"] == len(smollm2.metadata)
    assert report["metadata_bytes"] == sum((smollm2.local / m).stat().st_size for m in smollm2.metadata)
    # the same figures through Ray's metrics, as Prometheus scrapes them
    metrics = out["metrics"]
    assert _metric(metrics, "weight_bytes_streamed_total", smollm2.uri) == size
    assert _metric(metrics, "metadata_bytes_total", smollm2.uri) == report["metadata_bytes"]
    assert _metric(metrics, "engines_ready_total", smollm2.uri) == 1
    assert _metric(metrics, "engine_ready_seconds", smollm2.uri) == pytest.approx(report["ready_seconds"])
    assert _metric(metrics, "weight_stream_seconds", smollm2.uri) == pytest.approx(report["stream_seconds"])
    # the log line and the progress bars in the driver's console
    log = (work / "driver.log").read_text()
    assert f"Engine ready for {smollm2.uri}" in log
    assert f"{size} bytes streamed in {report['stream_seconds']:.2f}s" in log
    assert f"Streaming weights of {smollm2.uri}: 100%" in log
    assert f"Fetching metadata of {smollm2.uri}: 100%" in log
    print(f"\nstreamed: {len(rows)} rows, first row {out['first_row_seconds']:.1f}s, "
          f"total {seconds:.1f}s, weight bytes on disk 0, metadata {out['metadata_files']} files "
          f"{out['metadata_bytes']} B; engine ready {report['ready_seconds']:.1f}s, "
          f"streamed {size} B in {report['stream_seconds']:.2f}s")


def test_control_default_load_format_writes_weights(s3_server, smollm2, work):
    out, written, seconds = run_isolated(s3_server, work, smollm2.uri, None, QUESTIONS[:2])
    assert len(out["rows"]) == 2 and all(r["answer"].strip() for r in out["rows"])
    safetensors = {p: n for p, n in written.items() if p.endswith("model.safetensors")}
    assert safetensors and all(p.startswith(str(work / "home")) for p in safetensors), written
    size = (smollm2.local / "model.safetensors").stat().st_size
    assert max(safetensors.values()) == size
    [report] = out["load_reports"]  # the engine is ours, so it reports, with nothing streamed
    assert not report["streamed"] and report["weight_bytes"] is None and report["ready_seconds"] > 0
    print(f"\ncontrol: weight bytes on disk {sum(written.values())}, total {seconds:.1f}s, "
          f"shared-memory segments left: {out['shm_left']}")


def test_streamed_hub_mirror_writes_no_bin_pth_gguf(s3_server, tiny_models, work):
    model = tiny_models["hub-mirror"]
    before = s3_server.served()
    out, written, _ = run_isolated(s3_server, work, model.uri, "runai_streamer",
                                   ["hello world", "ray data"], max_tokens=4)
    assert len(out["rows"]) == 2 and all(r["num_generated_tokens"] == 4 for r in out["rows"])
    assert written == {}, written
    assert out["shm_left"] == []
    reads = _reads_under(s3_server, model.uri, before)
    weight_reads = {u.removeprefix(model.uri) for u in reads if is_weight(u.rsplit('/', 1)[1])}
    assert weight_reads == {"model.safetensors"}, weight_reads
    metadata_dirs = [p for p in (work / "home" / ".cache" / "ray_stream_llm" / "models").iterdir()
                     if p.is_dir()]
    assert len(metadata_dirs) == 1
    got = {str(p.relative_to(metadata_dirs[0])) for p in metadata_dirs[0].rglob("*") if p.is_file()}
    assert got - {".ray_stream_llm.json"} == set(model.metadata)


def test_settings_only_in_config_reach_every_actor_and_no_secret_leaks(s3_server, tiny_models, work):
    """Issue 3: the store set once, in the config; the driver's environment has no AWS
    variable. A secret must not appear in any output or any file the run wrote."""
    secret = s3_server.secret_access_key
    model = tiny_models["sharded"]
    store = {"endpoint_url": s3_server.endpoint_url.replace("127.0.0.1", "localhost"),
             "region_name": s3_server.region,
             "aws_access_key_id": s3_server.access_key_id, "aws_secret_access_key": secret}
    before = s3_server.served()
    out, written, _ = run_isolated(s3_server, work, model.uri, "runai_streamer",
                                   ["hello world", "ray data", "object store"], max_tokens=4,
                                   object_store=store)
    assert len(out["rows"]) == 3 and all(r["num_generated_tokens"] == 4 for r in out["rows"])
    assert written == {}
    shards = {w for w in model.weights if w.endswith(".safetensors")}
    assert len(shards) >= 3
    reads = {u.removeprefix(model.uri) for u in _reads_under(s3_server, model.uri, before)}
    assert shards <= reads  # every shard was streamed by the engine, with the config's settings
    # the secret: nowhere in the driver's output, Ray's session logs, or any file written
    leaks = []
    driver_log = (work / "driver.log").read_text(errors="replace")
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
