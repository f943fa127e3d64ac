"""The suite's fixed places, for tests at any depth under tests/: the checkout (REPO), the
test tree (TESTS), its helpers (HELPERS) and its data (DATA)."""

from __future__ import annotations

from pathlib import Path

HELPERS = Path(__file__).resolve().parent
TESTS = HELPERS.parent
REPO = TESTS.parent
DATA = TESTS / "data"
