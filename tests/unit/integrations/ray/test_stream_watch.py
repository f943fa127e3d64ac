"""The engine actor's reading of what vLLM's processes report
(ray_stream_llm/integrations/ray/stream_watch.py): the root cause of a failed start,
whether the streamer raised, and the reports collected from a real report directory."""

from __future__ import annotations

import json
import os

from ray_stream_llm.integrations.ray.stream_watch import StreamWatcher, from_streamer, root_cause
from ray_stream_llm.integrations.vllm.compile_cache import REPORT_DIR_ENV

WRAPPED = {
    "time": 2.0,
    "chain": [
        {"type": "RuntimeError", "message": "Engine core initialization failed. See above."},
        {"type": "OSError", "message": "File access error", "module": "runai_model_streamer.x"},
        {"type": "RuntimeError", "message": "WorkerProc initialization failed due to ..."},
    ],
}


def test_the_root_cause_is_the_innermost_exception_that_is_not_a_wrapper():
    assert root_cause([WRAPPED]) == "OSError: File access error"


def test_the_first_failure_with_a_cause_wins_and_none_without_one():
    generic_only = {
        "chain": [{"type": "RuntimeError", "message": "Engine core initialization failed"}]
    }
    memory = {"chain": [{"type": "ValueError", "message": "  not enough KV cache memory  "}]}
    assert root_cause([generic_only, memory, WRAPPED]) == "ValueError: not enough KV cache memory"
    assert root_cause([generic_only]) is None
    assert root_cause([]) is None
    assert root_cause([{"chain": None}]) is None


def test_from_streamer_looks_at_every_exception_of_every_failure():
    assert from_streamer([{"chain": []}, WRAPPED])
    vllm_only = {"chain": [{"type": "ValueError", "message": "x", "module": "vllm.config"}]}
    assert not from_streamer([vllm_only])
    assert not from_streamer([])


def test_the_watcher_collects_sessions_failures_and_checksums_and_restores_the_env(monkeypatch):
    monkeypatch.setenv(REPORT_DIR_ENV, "/previous")
    watcher = StreamWatcher("s3://bucket/m/", progress=False)
    with watcher:
        directory = os.environ[REPORT_DIR_ENV]
        assert directory != "/previous"

        def write(name, value):
            with open(os.path.join(directory, name), "w") as f:
                json.dump(value, f)

        write("123-0.json", {"planned_bytes": 10, "delivered_bytes": 4, "done": False})
        write("failure-2.json", {"time": 2.0, "chain": []})
        write("failure-1.json", {"time": 1.0, "chain": []})
        write("checksum-9.json", {"rank": 1, "pid": 9})
        write("checksum-8.json", {"rank": 0, "pid": 8})
    assert os.environ[REPORT_DIR_ENV] == "/previous"
    assert not os.path.exists(directory)
    assert watcher.sessions == [{"planned_bytes": 10, "delivered_bytes": 4, "done": False}]
    assert [f["time"] for f in watcher.failures] == [1.0, 2.0]
    assert [c["rank"] for c in watcher.checksums] == [0, 1]
    assert watcher.streaming_interrupted  # a session began and did not finish


def test_finished_sessions_are_not_an_interrupted_stream(monkeypatch):
    monkeypatch.delenv(REPORT_DIR_ENV, raising=False)
    watcher = StreamWatcher("s3://bucket/m/", progress=False)
    with watcher:
        path = os.path.join(os.environ[REPORT_DIR_ENV], "1-0.json")
        with open(path, "w") as f:
            json.dump({"planned_bytes": 4, "delivered_bytes": 4, "done": True}, f)
    assert REPORT_DIR_ENV not in os.environ
    assert not watcher.streaming_interrupted
