"""The compile cache's keys (integrations/vllm/compile_target.py, compile_store.py): they
hold the CPU instruction set that torch and inductor use, in a process of their own. No
server and no Ray, but about 20 s of torch and inductor imports: here, not in tests/unit
(under a minute)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from ray_stream_llm.integrations.vllm import compile_target

KEYS_SCRIPT = """
import json, sys
from ray_stream_llm.integrations.vllm import compile_store, compile_target
target = compile_target.target()
print(json.dumps({
    "target": target,
    "store": str(compile_store.cache_key(sys.argv[1])),
    "local": compile_target.cache_root("/vllm-cache", target),  # the engine's VLLM_CACHE_ROOT
}))
"""


def _as_fetched(source: Path, dest: Path, uri: str) -> Path:
    """A copy of a model's metadata files with the marker ``fetch_model_metadata`` writes."""
    import shutil

    from ray_stream_llm.fetch import MARKER, _crc32

    dest.mkdir()
    files = {}
    for path in sorted(p for p in source.iterdir() if p.is_file()):
        if "safetensors" not in path.name:
            shutil.copy(path, dest / path.name)
            size, crc = path.stat().st_size, _crc32(dest / path.name)
            files[path.name] = {"size": size, "etag": "e", "crc32": crc}
    (dest / MARKER).write_text(json.dumps({"version": 2, "uri": uri, "files": files}))
    return dest


def test_the_keys_hold_the_cpu_instruction_set_torch_and_inductor_use(tiny_layout, tmp_path):
    """Issue 32: the same model on nodes whose ``ATEN_CPU_CAPABILITY`` differs (torch and
    Inductor then emit code for another instruction set, as on an older CPU) gets other
    vLLM cache directories (two Ray nodes of one host share the user's ``VLLM_CACHE_ROOT``;
    the engine actor sets a directory per target under it) and store keys; nodes whose
    capability is the same get the same keys. Each node is a fresh interpreter with that
    environment."""
    model = _as_fetched(tiny_layout("single"), tmp_path / "model", "s3://models/tiny/")
    env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
    nodes = {"as it is": {}, "avx2": {"ATEN_CPU_CAPABILITY": "avx2"}}
    nodes |= {"avx512": {"ATEN_CPU_CAPABILITY": "avx512"}}  # this CPU's own, spelled out
    nodes |= {"default": {"ATEN_CPU_CAPABILITY": "default"}}  # no vector ISA at all
    logs = {name: tmp_path / f"{name.replace(' ', '-')}.log" for name in nodes}
    procs = {}
    for name, extra in nodes.items():  # together; their output in files (no pipe to fill)
        with open(logs[name], "w") as log:
            procs[name] = subprocess.Popen(
                [sys.executable, "-c", KEYS_SCRIPT, str(model)],
                env={**env, **extra},
                stdout=log,
                stderr=subprocess.STDOUT,
            )
    keys = {}
    for name, proc in procs.items():
        assert proc.wait(timeout=600) == 0, logs[name].read_text()[-3000:]
        [line] = [x for x in logs[name].read_text().splitlines() if x.startswith('{"target"')]
        keys[name] = json.loads(line)
    print("\n" + "\n".join(f"{n}: {compile_target.describe(k['target'])}" for n, k in keys.items()))
    assert keys["avx2"]["target"]["cpu_capability"] == "AVX2"
    assert keys["avx2"]["target"]["vec_isa"] == "avx2"
    assert keys["default"]["target"]["vec_isa"] == "INVALID_VEC_ISA"
    isa = ("cpu_capability", "vec_isa", "vec_isa_flags")
    pairs = [(a, b) for a in keys for b in keys if a < b]
    for a, b in pairs:
        same = [keys[a]["target"][f] for f in isa] == [keys[b]["target"][f] for f in isa]
        for kind in ("local", "store"):
            assert (keys[a][kind] == keys[b][kind]) == same, (a, b, kind, keys[a], keys[b])
    # both answers occur: the check can fail either way
    assert keys["as it is"]["store"] == keys["avx512"]["store"]  # AVX-512 or AVX2-only CPU
    assert keys["as it is"]["store"] != keys["default"]["store"]
    # the store's key: the model's part is the same, the target's differs
    models = {k["store"].split("/")[0] for k in keys.values()}
    assert len(models) == 1 and "None" not in models
