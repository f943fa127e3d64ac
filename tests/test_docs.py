"""The README's configuration reference is generated from the config models; it must not drift."""

from __future__ import annotations

from pathlib import Path

from ray_stream_llm.tools.reference import END, START, render

README = Path(__file__).resolve().parent.parent / "README.md"


def test_config_reference_matches_the_code():
    text = README.read_text()
    assert START in text and END in text
    assert render(text) == text, (
        "README.md's configuration reference is out of date: "
        "run `.venv/bin/python -m ray_stream_llm.tools.reference --write README.md`"
    )


def test_readme_first_lines_are_the_two_commands():
    lines = [line for line in README.read_text().splitlines() if line.strip()][:5]
    assert lines[2].startswith("make demo") and lines[3].startswith("make test")
