"""One job in an isolated environment: the one helper the benchmarks, the demo and the
tests use to run a Ray Data job on a clean node, apart from the machine's other work.

:func:`user_env` is a new user's shell: PATH, LANG, a fresh HOME and TMPDIR under one
work directory, and nothing else. :func:`isolated_env` adds what a test or bench job needs
beside that and a user never sets: vLLM's sockets and torch's inductor cache under the
same directory (so "what did the job write to local disk" is a walk of that directory),
Ray on loopback and nothing phoning home (``commands.LOCAL_ENV``); no AWS, streamer or
cache variable of the caller leaks into either. :func:`run_isolated` runs a command with
:func:`isolated_env` and keeps its output in ``job.log``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from ray_stream_llm.commands import LOCAL_ENV


def private_dirs(work: Path) -> dict[str, str]:
    """The per-job directories of vLLM (IPC sockets) and torch (inductor cache), created
    under ``work``, as variables."""
    dirs = {"VLLM_RPC_BASE_PATH": work / "rpc", "TORCHINDUCTOR_CACHE_DIR": work / "inductor"}
    for path in dirs.values():
        path.mkdir(parents=True, exist_ok=True)
    return {name: str(path) for name, path in dirs.items()}


def user_env(work: Path) -> dict[str, str]:
    """A new user's shell environment, its paths under ``work`` (created): PATH (the
    caller's), LANG, HOME (``home``) and TMPDIR (``tmp``: where Ray's session, vLLM's
    sockets and torch's cache go by default, kept apart from the machine's other jobs)."""
    home, tmp = work / "home", work / "tmp"
    for path in (home, tmp):
        path.mkdir(parents=True, exist_ok=True)
    return {
        "PATH": os.environ.get("PATH", ""),
        "LANG": "C.UTF-8",
        "HOME": str(home),
        "TMPDIR": str(tmp),
    }


def isolated_env(work: Path, extra: Mapping[str, str | None] | None = None) -> dict[str, str]:
    """:func:`user_env` plus ``commands.LOCAL_ENV`` and :func:`private_dirs` (``rpc``,
    ``inductor``); ``extra`` is added last (a value of None removes that variable: e.g.
    ``TMPDIR``, to run as a user who never set it)."""
    env: dict[str, str | None] = {
        **user_env(work),
        **LOCAL_ENV,
        **private_dirs(work),
        **(extra or {}),
    }
    return {name: value for name, value in env.items() if value is not None}


def run_isolated(
    argv: Sequence[str],
    work: Path,
    extra: Mapping[str, str | None] | None = None,
    *,
    timeout: float = 900,
) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` in ``work`` with :func:`isolated_env`; stdout and stderr are returned
    and written to ``work/job.log`` (as they come: a job that runs past ``timeout`` is
    killed, leaves its log there and has its last lines printed to stderr). The exit status
    is the caller's to check."""
    env = isolated_env(work, extra)
    out_path, err_path = work / "job.stdout", work / "job.stderr"
    with open(out_path, "w") as out, open(err_path, "w") as err:
        child = subprocess.Popen(list(argv), env=env, cwd=work, stdout=out, stderr=err)
        try:
            child.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
            tail = out_path.read_text("utf-8", "replace") + err_path.read_text("utf-8", "replace")
            print(
                f"{argv[-1]}: killed after {timeout:.0f} s; the last of its log:\n{tail[-8000:]}",
                file=sys.stderr,
            )
            raise
        finally:
            stdout = out_path.read_text("utf-8", "replace")
            stderr = err_path.read_text("utf-8", "replace")
            (work / "job.log").write_text(stdout + stderr)
    return subprocess.CompletedProcess(list(argv), child.returncode, stdout, stderr)


def tree_bytes(root: Path) -> int:
    """Bytes of the regular files under ``root``."""
    total = 0
    for dirpath, _, names in os.walk(root):
        for name in names:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                continue
    return total
