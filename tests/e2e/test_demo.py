"""``make demo``, the README's first command (issue 31): the demo's own output, parsed. It
answers every question (the arithmetic one correctly), and its load line says what reached
local disk (0 weight files, counted once every process of the job had ended) apart from
what the node held in memory during the job (its copy of the weights in /dev/shm)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ray_stream_llm.tools.demo import QUESTIONS

pytestmark = [pytest.mark.s3, pytest.mark.e2e, pytest.mark.engine]

CLI = Path(sys.executable).parent / "ray-stream-llm"


def test_make_demo_answers_and_tells_disk_from_memory(tmp_path):
    """What `make demo` runs once its environment is set up, as it runs it (its own working
    directory under /tmp, removed at the end); the user's HOME and cache (the converted model,
    its lock file, Ray's auth token) in the test's temporary directory."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "RUNAI_STREAMER_"))}
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")
    env["HOME"] = str(tmp_path / "home")  # Ray's files of a local cluster (~/.ray) too
    proc = subprocess.run(
        [str(CLI), "demo"],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    out = proc.stdout
    assert proc.returncode == 0, (out + proc.stderr)[-6000:]
    answers = dict(re.findall(r"^Q: (.+)\nA: (.*)$", out, re.MULTILINE))
    assert sorted(answers) == sorted(QUESTIONS), out[-4000:]
    assert all(a.strip() for a in answers.values()), answers
    assert "4" in answers["What is 2+2?"], answers
    (load,) = re.findall(r"^Load: (.+)$", out, re.MULTILINE)
    disk = re.search(r"on local disk: (\d+) weight files \((\S+) MB, counted after the job's "
                     r"(\d+) processes ended\)", load)  # fmt: skip
    assert disk, load
    assert (disk[1], disk[2]) == ("0", "0.0"), load
    assert int(disk[3]) > 0, load  # the job's processes were found and waited for
    memory = re.search(r"in memory during the job: (\S+) MB of weights \(([^)]+)\)", load)
    assert memory, load
    streamed = re.search(r"safetensors object\(s\) \((\S+) MB\) read from the store", load)
    assert streamed and float(streamed[1]) > 100, load  # SmolLM2: 269 MB
    # the library's default shares the node's pull: the copy in memory is the weights, whole
    assert memory[2] == "the node's copy in /dev/shm", load
    assert memory[1] == streamed[1], load
    assert f"{len(QUESTIONS)}/{len(QUESTIONS)} rows" in load, load
    assert "still running after the job" not in out, out[-2000:]
    print(f"\nmake demo: {load}")
