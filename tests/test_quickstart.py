"""examples/quickstart.py is the README's first snippet, and it runs."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_quickstart_is_the_readme_snippet():
    snippet = re.search(r"## Quickstart\n\n```python\n(.*?)```", (ROOT / "README.md").read_text(),
                        re.S).group(1)
    example = (ROOT / "examples" / "quickstart.py").read_text()
    body = [line.strip() for line in example.splitlines()]
    for line in snippet.splitlines():
        line = line.strip().replace('"s3://models/SmolLM2-135M-Instruct/"', "model_uri")
        assert not line or line in body, line


@pytest.mark.e2e
def test_quickstart_runs(s3_server, smollm2):
    work = Path(tempfile.mkdtemp(prefix="rsl-qs-", dir="/tmp"))  # short: Ray socket paths
    try:
        env = {"PATH": os.environ["PATH"], "HOME": str(work), "TMPDIR": str(work),
               "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0",
               "VLLM_HOST_IP": "127.0.0.1", "VLLM_CPU_KVCACHE_SPACE": "1",
               "VLLM_RPC_BASE_PATH": str(work), "TORCHINDUCTOR_CACHE_DIR": str(work / "ind"),
               **s3_server.env()}
        proc = subprocess.run([sys.executable, str(ROOT / "examples" / "quickstart.py"), smollm2.uri],
                              env=env, cwd=work, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "'question': 'What is 2+2?'" in proc.stdout and "4" in proc.stdout.split("'answer'")[1]
    finally:
        shutil.rmtree(work, ignore_errors=True)
