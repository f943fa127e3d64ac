"""examples/quickstart.py is the README's first snippet, and it runs."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from ray_stream_llm.tools.isolated import isolated_env

pytestmark = [pytest.mark.s3, pytest.mark.e2e]

ROOT = Path(__file__).resolve().parent.parent


def test_quickstart_is_the_readme_snippet():
    snippet = re.search(
        r"## Quickstart\n\n```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S
    ).group(1)
    example = (ROOT / "examples" / "quickstart.py").read_text()
    body = [line.strip() for line in example.splitlines()]
    for line in snippet.splitlines():
        line = line.strip().replace('"s3://models/SmolLM2-135M-Instruct/"', "model_uri")
        assert not line or line in body, line


@pytest.mark.e2e
def test_quickstart_runs(s3_server, smollm2):
    work = Path(tempfile.mkdtemp(prefix="rsl-qs-", dir="/tmp"))  # short: Ray socket paths
    try:
        env = isolated_env(work, s3_server.env())
        proc = subprocess.run(
            [sys.executable, str(ROOT / "examples" / "quickstart.py"), smollm2.uri],
            env=env,
            cwd=work,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert (
            "'question': 'What is 2+2?'" in proc.stdout and "4" in proc.stdout.split("'answer'")[1]
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
