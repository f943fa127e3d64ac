"""The command line as a user runs it: ``python -m ray_stream_llm.cli`` in a subprocess
(tests/integration/test_cli.py, tests/e2e/test_cli.py)."""

from __future__ import annotations

import subprocess
import sys

CLI = [sys.executable, "-m", "ray_stream_llm.cli"]


def run_cli(args, env, timeout=120, cwd=None):
    return subprocess.run(
        CLI + args, env=env, capture_output=True, text=True, timeout=timeout, cwd=cwd
    )
