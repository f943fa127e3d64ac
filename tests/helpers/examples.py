"""examples/job_submission/ as its tests read it (tests/integration/test_examples.py,
tests/e2e/test_examples.py)."""

from __future__ import annotations

import runpy
from types import SimpleNamespace

from helpers.paths import REPO

JOB_DIR = REPO / "examples" / "job_submission"


def load_entrypoint() -> SimpleNamespace:
    """examples/job_submission/entrypoint.py's names (its __main__ guard: nothing runs),
    without writing bytecode into the folder that `ray job submit` uploads."""
    return SimpleNamespace(
        **runpy.run_path(str(JOB_DIR / "entrypoint.py"), run_name="rsl_example_entrypoint")
    )
