"""docs/configuration.md is generated from the config models; it must not drift."""

from __future__ import annotations

from helpers.paths import REPO

from ray_stream_llm.tools.reference import END, START, render

REFERENCE = REPO / "docs" / "configuration.md"


def test_config_reference_matches_the_code():
    text = REFERENCE.read_text()
    assert START in text and END in text
    assert render(text) == text, (
        "docs/configuration.md is out of date: run "
        "`.venv/bin/python -m ray_stream_llm.tools.reference --write docs/configuration.md`"
    )


ARCHITECTURE = REFERENCE.parent / "architecture.md"
TOUCH_POINTS_SECTION = "## What the library touches in vLLM and torch"


def test_the_touch_point_table_lists_exactly_the_touch_points():
    """docs/architecture.md's table of what the library touches in vLLM and torch names, in
    its first column, exactly the touch points of ``integrations/vllm/touchpoints.py``
    (which tests/integration/test_compat.py checks against the installed vLLM and torch), each once;
    and docs/compatibility.md keeps no table of its own."""
    import re

    from ray_stream_llm.integrations.vllm.touchpoints import TOUCHPOINTS

    text = ARCHITECTURE.read_text()
    assert TOUCH_POINTS_SECTION in text
    section = text.split(TOUCH_POINTS_SECTION, 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    named = [
        name
        for row in rows
        for name in re.findall(r"`((?:vllm|torch)\.[\w.]+)`", row.split(" | ", 1)[0])
    ]
    assert sorted(named) == sorted(p.qualname for p in TOUCHPOINTS)
    compatibility = (REFERENCE.parent / "compatibility.md").read_text()
    assert "| vLLM internal |" not in compatibility
    assert "architecture.md#what-the-library-touches-in-vllm-and-torch" in compatibility
