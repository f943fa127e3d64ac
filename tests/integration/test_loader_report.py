"""The load report of the registered loader (integrations/vllm/plugin.py, loader.py): what
the streamer delivered, measured in-process against the real S3 server."""

from __future__ import annotations

import os

import pytest
import torch
from helpers.models import tensor_bytes
from safetensors.torch import load_file

from ray_stream_llm.integrations.ray.stream_watch import StreamWatcher
from ray_stream_llm.integrations.vllm.plugin import RAY_COPY_ENV, REPORT_DIR_ENV, register
from ray_stream_llm.reports import stream_figures


@pytest.mark.s3
def test_the_registered_loader_reports_what_the_streamer_delivered(
    s3_env, tiny_models, monkeypatch, tmp_path
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
    # a process of the library's engines (its report directory set): the plugin acts here
    monkeypatch.setenv(REPORT_DIR_ENV, str(tmp_path))
    monkeypatch.setenv(RAY_COPY_ENV, os.environ.get(RAY_COPY_ENV, ""))  # restored after
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
