"""The suite's fixed places, for tests at any depth under tests/: the checkout (REPO), the
test tree (TESTS) and its helpers (HELPERS)."""

from __future__ import annotations

from pathlib import Path

HELPERS = Path(__file__).resolve().parent
TESTS = HELPERS.parent
REPO = TESTS.parent
