"""docs/configuration.md is generated from the config models; it must not drift."""

from __future__ import annotations

from pathlib import Path

from ray_stream_llm.tools.reference import END, START, render

REFERENCE = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"


def test_config_reference_matches_the_code():
    text = REFERENCE.read_text()
    assert START in text and END in text
    assert render(text) == text, (
        "docs/configuration.md is out of date: run "
        "`.venv/bin/python -m ray_stream_llm.tools.reference --write docs/configuration.md`"
    )
