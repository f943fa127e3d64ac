"""The README as a new user reads it (issues 13, 31 and 57), in its order, in one fresh HOME
with no variable set by hand (PATH, LANG, HOME and TMPDIR only: ``tools.isolated.user_env``;
the second shell has what the README has it source): `make demo` (what it runs once its
environment is set up), then every shell and Python snippet as typed, on the local store
(its links, first lines and quickstart program: tests/unit/project/test_readme.py).
`make test` is this suite, and `make demo`'s setup is CI's own."""

from __future__ import annotations

import ast
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from helpers.janitors import segments_left
from helpers.jobs import COMPILED
from helpers.paths import REPO
from helpers.waiting import wait_until

from ray_stream_llm.tools.demo import QUESTIONS as DEMO_QUESTIONS
from ray_stream_llm.tools.isolated import user_env

ROOT = REPO
README = (ROOT / "README.md").read_text()
BLOCKS = re.findall(r"```(bash|python)\n(.*?)```", README, re.S)
MAKE_DEMO = "demo: setup\n\t$(VENV)/bin/ray-stream-llm demo\n"  # the Makefile's target


@pytest.mark.s3
@pytest.mark.e2e
@pytest.mark.engine
def test_readme_snippets_run_as_typed(work):
    """`make demo` first (it converts the demo model, once); then the first shell:
    `ray-stream-llm local-store`; the second shell: the quickstart, then the user's own model
    (a copy of the demo model, standing in for theirs) uploaded, inspected and run; then
    Ctrl-C in the first shell stops the store cleanly."""
    shells = [code for kind, code in BLOCKS if kind == "bash"][1:]  # [0]: the make lines
    serve, quickstart, own_job = shells
    checkout = work / "checkout"  # the repository root, as the user's shell sees it
    checkout.mkdir()
    for name in (".venv", "examples"):
        (checkout / name).symlink_to(ROOT / name)
    assert not (work / "home" / COMPILED).exists()  # a new user's node: nothing compiled
    # TMPDIR under `work`: Ray's session and cluster-address files, vLLM's sockets and
    # torch's cache default there, apart from the Ray clusters of the machine's other jobs
    env = user_env(work)
    assert not [name for name in env if _machine_setting(name)], env  # nothing set by hand
    since, started = time.time(), time.monotonic()
    # the README's first line: `make demo`, which runs this once its environment is set up
    assert MAKE_DEMO in (ROOT / "Makefile").read_text()
    demo_out, _ = _shell(".venv/bin/ray-stream-llm demo", checkout, env)
    load = _check_demo(demo_out)
    # the demo's engine runs eager (tools.job.CPU_ENGINE_KWARGS): the quickstart compiles first
    assert not (work / "home" / COMPILED).exists()
    phases = [("make demo", time.monotonic() - started)]
    store = subprocess.Popen(
        ["bash", "-c", serve.strip()],
        cwd=checkout,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    printed: list[str] = []
    try:
        assert store.stdout is not None

        def serving() -> bool:  # one line of the first shell's output per call
            line = store.stdout.readline()
            assert line or store.poll() is None, "".join(printed)
            printed.append(line)
            return "Stop with Ctrl-C" in line

        wait_until(serving, 600, lambda: "".join(printed), poll=0)
        env_file = Path(env["HOME"]) / ".cache/ray_stream_llm/local-store/env.sh"
        assert env_file.exists() and oct(env_file.stat().st_mode & 0o777) == "0o600"
        phases.append(("store up", time.monotonic() - started - sum(s for _, s in phases)))
        # the second shell's own settings of that kind are the README's env.sh's, as sourced
        setup = "\n".join(quickstart.strip().splitlines()[:2])  # the second shell's state
        exported = set(re.findall(r"\b(\w+)=", env_file.read_text()))
        shell_env, _ = _shell(setup + "\nenv -0", checkout, env)
        names = {entry.split("=", 1)[0] for entry in shell_env.split("\0") if entry}
        assert {name for name in names if _machine_setting(name)} <= exported, names

        printed_rows, _ = _shell(quickstart, checkout, env)
        # the program's answer, as it prints it (`print(ds.take_all())`, on stdout; Ray's
        # and vLLM's logs go to stderr): SmolLM2, greedy, answers "2 + 2 = 4"
        [row] = _rows_printed(printed_rows)
        assert row["question"] == "What is 2+2?" and "4" in row["answer"], row
        phases.append(("quickstart", time.monotonic() - started - sum(s for _, s in phases)))

        demo = Path(env["HOME"]) / ".cache/ray_stream_llm/demo/SmolLM2-135M-Instruct"
        shutil.copytree(demo, checkout / "my-model")  # the user's own model
        second = "".join(_shell(setup + "\n" + own_job, checkout, env))
        phases.append(("own model", time.monotonic() - started - sum(s for _, s in phases)))
        assert "streamable: yes" in second and "rows: 2/2" in second, second[-3000:]
        # --resume: a first run, nothing recorded before it (tests/e2e/test_resume.py resumes)
        assert "resumed: 0 row(s) recorded in answers-record/ before this run, 2 answered now" in (
            second
        ), second[-3000:]
        # the user's model is the demo model under another URI: its engine loaded the code
        # the quickstart's engine compiled (the compile cache is keyed by the files, not
        # their URI: docs/compile-cache.md)
        assert "(cache: hit)" in second, second[-3000:]
        # `run` is quiet (no Ray or vLLM log line, no warning of ours), names what it
        # streamed, and hands back every input column, `prompt` too (which Ray's
        # chat-template stage would overwrite), beside the generated text
        ran = second.split("streamable: yes\n", 1)[1]  # run's output (and the stderr)
        for noise in (
            " INFO ",
            "Started a local Ray instance",
            "DeprecationWarning",
            "ray_remote_args",
        ):
            assert noise not in ran, (noise, ran[-3000:])
        assert len(ran.splitlines()) < 30, ran
        size = (demo / "model.safetensors").stat().st_size
        assert "engine 1: Engine ready for s3://models/my-model/" in second, second[-3000:]
        assert f"weights 1 safetensors files, {size} bytes streamed" in second, second[-3000:]
        table = pq.read_table(checkout / "answers" / "answers.parquet").to_pylist()
        assert [(r["id"], r["prompt"]) for r in sorted(table, key=lambda r: r["id"])] == [
            (1, "What is 2+2?"),
            (2, "Name three colors."),
        ]
        assert all(r["generated_text"].strip() and r["num_generated_tokens"] > 0 for r in table)
        assert segments_left(since) == []  # every engine's shared memory was released
    finally:
        if store.poll() is None:
            os.killpg(store.pid, signal.SIGINT)  # Ctrl-C
        rest, _ = store.communicate(timeout=60)
    assert store.returncode == 0, "".join(printed) + rest
    assert "Stopped." in rest and not env_file.exists()
    print("\nREADME as typed: " + ", ".join(f"{name} {s:.0f}s" for name, s in phases))
    print(f"make demo: {load}")


def _machine_setting(name: str) -> bool:
    """A variable a test or bench sets for the machine (commands.LOCAL_ENV, vLLM's and Ray's
    own) that the README never tells a user to set."""
    return (
        name in ("HF_HUB_OFFLINE", "DO_NOT_TRACK")
        or "USAGE" in name
        or name.startswith(("RAY_", "VLLM_"))
    )


def _check_demo(out: str) -> str:
    """The demo's own output (stdout), parsed; its load line. It answers every question (the
    arithmetic one correctly), and its load line says what reached local disk (0 weight
    files, counted once every process of the job had ended) apart from what the node held in
    memory during the job (its copy of the weights in /dev/shm)."""
    answers = dict(re.findall(r"^Q: (.+)\nA: (.*)$", out, re.MULTILINE))
    assert sorted(answers) == sorted(DEMO_QUESTIONS), out[-4000:]
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
    assert f"{len(DEMO_QUESTIONS)}/{len(DEMO_QUESTIONS)} rows" in load, load
    assert "still running after the job" not in out, out[-2000:]
    return load


def _rows_printed(stdout: str) -> list[dict]:
    """The rows the quickstart prints: the one line of its stdout that is a list of dicts."""
    printed = [line for line in stdout.splitlines() if line.startswith("[{")]
    assert len(printed) == 1, stdout[-3000:]
    rows = ast.literal_eval(printed[0])
    assert isinstance(rows, list) and all(isinstance(r, dict) for r in rows), rows
    return rows


def _shell(script: str, cwd: Path, env: dict[str, str]) -> tuple[str, str]:
    """Run ``script`` as the user's shell does; (stdout, stderr)."""
    proc = subprocess.run(
        ["bash", "-e", "-c", script],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return proc.stdout, proc.stderr
