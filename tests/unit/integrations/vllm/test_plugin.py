"""The vLLM plugin (integrations/vllm/plugin.py) acts only in the library's own engines
(issue 55): in a vLLM process that no engine of this library started, loading vLLM's general
plugins leaves every load format's loader, every function of vLLM's compilation and loader
modules and torch's AOT class as they were, logs nothing and writes nothing under HOME."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from ray_stream_llm.integrations.vllm.plugin import (
    REPORT_DIR_ENV,
    SHARD_WRITER_ENV,
    library_engine,
)

_SCRIPT = textwrap.dedent("""
    import importlib, json, logging, os, sys
    from pathlib import Path

    messages = []

    class Keep(logging.Handler):
        def emit(self, record):
            messages.append(record.getMessage())

    import vllm  # noqa: F401  (vLLM sets up its own loggers on import)
    for name in ("", "vllm", "ray_stream_llm"):
        logging.getLogger(name).addHandler(Keep(level=logging.DEBUG))
    logging.getLogger("ray_stream_llm").setLevel(logging.DEBUG)
    import vllm.model_executor.model_loader as loaders
    from torch._dynamo.aot_compile_types import BundledAOTAutogradSerializableCallable

    MODULES = ["vllm.compilation.caching", "vllm.compilation.decorators",
               "vllm.compilation.monitor", "vllm.model_executor.model_loader",
               "vllm.model_executor.model_loader.runai_streamer_loader",
               "vllm.model_executor.model_loader.sharded_state_loader",
               "vllm.model_executor.model_loader.weight_utils"]

    def snapshot():
        seen = {}
        for name in MODULES:
            for attr, value in vars(importlib.import_module(name)).items():
                seen[f"{name}.{attr}"] = id(value)
        registry = loaders._LOAD_FORMAT_TO_MODEL_LOADER
        seen.update({f"load_format {k}": id(v) for k, v in registry.items()})
        for cls in {*registry.values(), BundledAOTAutogradSerializableCallable}:
            seen.update({f"{cls.__qualname__}.{k}": id(v) for k, v in vars(cls).items()})
        return seen

    def home():
        return sorted(str(p) for p in Path(os.environ["HOME"]).rglob("*"))

    def changed(before, after):
        return sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))

    before, home_before, env_before = snapshot(), home(), dict(os.environ)
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    after = snapshot()
    out = {
        "plugin_ran": "ray_stream_llm.integrations.vllm.plugin" in sys.modules,
        "changed": changed(before, after),
        "env": changed(env_before, dict(os.environ)),
        "home": sorted(set(home()) - set(home_before)),
        "messages": list(messages),
    }
    # the control: the same process marked as a library engine's sees the plugin act
    os.environ[sys.argv[1]] = sys.argv[2]
    from ray_stream_llm.integrations.vllm.plugin import register

    del messages[:]
    register()
    out["engine_changed"] = changed(before, snapshot())
    out["engine_runai"] = loaders._LOAD_FORMAT_TO_MODEL_LOADER["runai_streamer"].__module__
    out["engine_messages"] = list(messages)
    print("RESULT " + json.dumps(out))
""")


def test_the_plugin_changes_nothing_in_a_vllm_process_the_library_did_not_start(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("RAY_STREAM_LLM_", "VLLM_")) and k != "HOME"
    }
    (tmp_path / "run.py").write_text(_SCRIPT)
    reports = tmp_path / "reports"
    reports.mkdir()
    done = subprocess.run(
        [sys.executable, str(tmp_path / "run.py"), REPORT_DIR_ENV, str(reports)],
        env={**env, "HOME": str(home)},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    [line] = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
    out = json.loads(line.removeprefix("RESULT "))
    assert out["plugin_ran"]  # vLLM did load the entry point
    assert out["changed"] == [], out["changed"]
    assert out["env"] == [], out["env"]
    assert out["home"] == [], out["home"]
    assert not [m for m in out["messages"] if "overwritten" in m or "ray_stream_llm" in m]
    # the control: in an engine of this library the same check sees the plugin's changes
    assert out["engine_runai"] == "ray_stream_llm.integrations.vllm.loader"
    assert "load_format runai_streamer" in out["engine_changed"]
    assert "load_format runai_streamer_sharded" in out["engine_changed"]
    assert any("already registered" in m for m in out["engine_messages"])


def test_a_library_engine_is_known_by_its_report_directory_or_the_shard_writers_mark():
    assert not library_engine({})
    assert not library_engine({REPORT_DIR_ENV: "", SHARD_WRITER_ENV: "0"})
    assert library_engine({REPORT_DIR_ENV: str(Path("/tmp/rsl-load-x"))})
    assert library_engine({SHARD_WRITER_ENV: "1"})
