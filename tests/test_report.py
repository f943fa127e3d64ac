"""Load reports: the streamer measured in-process (real streamer, real S3 server) and the
arithmetic of the report. The end-to-end check (log line, metrics, reports from a real
Ray job) is in test_e2e.py."""

from __future__ import annotations

import json

import pytest
import torch
from helpers.models import tensor_bytes
from safetensors.torch import load_file

from ray_stream_llm.integrations.vllm.plugin import REPORT_DIR_ENV, register
from ray_stream_llm.integrations.vllm.stream_watch import StreamWatcher
from ray_stream_llm.reports import LoadReport, stream_figures


@pytest.mark.s3
def test_the_registered_loader_reports_what_the_streamer_delivered(
    s3_env, tiny_models, monkeypatch
):
    """vLLM's loader for runai_streamer, registered by the plugin through vLLM's
    register_model_loader, streaming the shards from the server."""
    from vllm.config.load import LoadConfig
    from vllm.model_executor.model_loader import (
        RunaiModelStreamerLoader,
        ShardedStateLoader,
        get_model_loader,
    )

    model = tiny_models["sharded"]
    shards = sorted(w for w in model.weights if w.endswith(".safetensors"))
    uris = [f"{model.uri}{s}" for s in shards]
    monkeypatch.setenv("RUNAI_STREAMER_CONCURRENCY", "3")  # as vLLM sets it from its extra config
    register()
    register()  # vLLM may call a plugin twice in one process
    loader = get_model_loader(LoadConfig(load_format="runai_streamer"))
    assert type(loader).__module__ == "ray_stream_llm.integrations.vllm.loader"
    assert isinstance(loader, RunaiModelStreamerLoader)
    sharded = get_model_loader(LoadConfig(load_format="runai_streamer_sharded"))
    assert type(sharded).__module__ == "ray_stream_llm.integrations.vllm.loader"
    assert isinstance(sharded, ShardedStateLoader)
    with StreamWatcher(model.uri, progress=False) as watcher:
        # kept without a copy: each tensor must still hold its file's values after the
        # stream moved on (the streamer's tensors are the caller's, owned=True)
        got = dict(loader._get_weights_iterator(model.uri, None))
    expected_tensors = {}
    for s in shards:
        expected_tensors.update(load_file(str(model.local / s)))
    assert set(got) == set(expected_tensors)
    assert all(torch.equal(got[k], expected_tensors[k]) for k in expected_tensors)
    expected = sum(tensor_bytes(model.local / s) for s in shards)
    [session] = watcher.sessions
    assert session["done"] and sorted(session["files"]) == uris
    assert session["planned_bytes"] == session["delivered_bytes"] == expected
    assert session["tensors"] == len(got) and session["seconds"] > 0
    assert session["settings"]["concurrency"] == "3"  # what the streaming process used
    sizes = {u: (model.local / s).stat().st_size for u, s in zip(uris, shards)}
    figures = stream_figures(watcher.sessions, sizes)
    assert figures["weight_files"] == len(shards)
    assert figures["weight_bytes"] == sum(sizes.values())
    assert figures["streamed_tensor_bytes"] == expected


def test_the_loader_writes_no_report_without_an_engine_actor(monkeypatch, tmp_path):
    """Outside this library's engine actors the loader writes no report, and streams a
    local file that is no region's as the streamer does."""
    from safetensors.torch import save_file

    from ray_stream_llm.integrations.vllm.loader import stream_weights

    monkeypatch.delenv(REPORT_DIR_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    tensors = {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3)}
    save_file(tensors, str(tmp_path / "model.safetensors"))
    got = dict(stream_weights([str(tmp_path / "model.safetensors")], distributed=False))
    assert torch.equal(got["w"], tensors["w"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.safetensors"]  # no report


def test_stream_figures_span_parallel_sessions():
    """Two worker processes streaming halves at once: seconds from the first start to the
    last end, bytes summed, each file counted once."""
    sessions = [
        {
            "done": True,
            "files": ["s3://b/m/a.safetensors"],
            "planned_bytes": 90,
            "delivered_bytes": 90,
            "started": 100.0,
            "seconds": 4.0,
        },
        {
            "done": True,
            "files": ["s3://b/m/b.safetensors"],
            "planned_bytes": 80,
            "delivered_bytes": 80,
            "started": 101.0,
            "seconds": 5.0,
        },
        {
            "done": False,
            "files": ["s3://b/m/c.safetensors"],
            "planned_bytes": 10,
            "delivered_bytes": 3,
            "started": 99.0,
            "seconds": 1.0,
        },  # a failed attempt's leftover
    ]
    sizes = {
        "s3://b/m/a.safetensors": 100,
        "s3://b/m/b.safetensors": 90,
        "s3://b/m/c.safetensors": 11,
    }
    assert stream_figures(sessions, sizes) == {
        "weight_files": 2,
        "weight_bytes": 190,
        "streamed_tensor_bytes": 170,
        "stream_seconds": 6.0,
    }
    assert stream_figures([], sizes)["stream_seconds"] is None


def _report(**changes) -> LoadReport:
    base = dict(
        model="s3://b/m/",
        streamed=True,
        job_id="01000000",
        node_ip="127.0.0.1",
        pid=1,
        attempt=1,
        ready_seconds=30.0,
        metadata_files=6,
        metadata_bytes=3_524_725,
        metadata_seconds=0.5,
        metadata_downloaded=True,
        weight_files=1,
        weight_bytes=2 * 1024**3,
        streamed_tensor_bytes=2 * 1024**3 - 100,
        stream_seconds=4.0,
        streamer_settings={"concurrency": "16"},
        finished_at=1.0,
    )
    return LoadReport(**{**base, **changes})


def test_report_line_and_round_trip():
    report = _report()
    assert report.gib_per_s == 0.5
    line = report.log_line()
    assert "in 30.0s (attempt 1)" in line and "6 files, 3524725 bytes in 0.50s (downloaded)" in line
    assert (
        f"{2 * 1024**3} bytes streamed in 4.00s (0.500 GiB/s)" in line and "concurrency=16" in line
    )
    assert LoadReport.from_dict(json.loads(json.dumps(report.to_dict()))) == report
    unmeasured = _report(
        weight_files=None, weight_bytes=None, streamed_tensor_bytes=None, stream_seconds=None
    )
    assert unmeasured.gib_per_s is None and "stream figures not measured" in unmeasured.log_line()
    assert "(not streamed)" in _report(streamed=False).log_line()


def test_load_reports_needs_ray():
    import ray

    from ray_stream_llm import load_reports

    assert not ray.is_initialized()
    with pytest.raises(RuntimeError, match="before ray.shutdown"):
        load_reports()


def test_a_newer_vllms_unused_weight_predicate_is_honoured_and_none_changes_nothing(
    monkeypatch, tmp_path
):
    """vLLM 0.33 passes ``is_unused_weight`` (most often None) as a third positional argument
    to the loader's iterator: None streams as before through the library's own path (its
    report lists the files), a predicate leaves out the tensors it names."""
    from safetensors.torch import save_file
    from vllm.config.load import LoadConfig
    from vllm.model_executor.model_loader import get_model_loader

    from ray_stream_llm.integrations.vllm.loader import stream_weights

    monkeypatch.setenv(REPORT_DIR_ENV, str(tmp_path / "reports"))
    (tmp_path / "reports").mkdir()
    model = tmp_path / "model"
    model.mkdir()
    tensors = {"w": torch.ones(2, 3), "v": torch.zeros(4)}
    save_file(tensors, str(model / "model.safetensors"))
    register()
    loader = get_model_loader(LoadConfig(load_format="runai_streamer"))
    assert set(dict(loader._get_weights_iterator(str(model), None, None))) == {"w", "v"}
    [report] = [json.loads(p.read_text()) for p in (tmp_path / "reports").glob("*.json")]
    assert report["done"] and report["files"] == [str(model / "model.safetensors")]
    # a predicate (on a region: a store URI goes to the newer vLLM's own selection)
    got = dict(stream_weights([str(model / "model.safetensors")], distributed=False,
                              unused=lambda name: name == "w"))  # fmt: skip
    assert set(got) == {"v"} and torch.equal(got["v"], tensors["v"])
