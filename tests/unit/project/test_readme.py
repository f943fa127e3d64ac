"""The README as a new user reads it (issue 13): its links resolve, its first lines are the
two commands, its quickstart program is examples/quickstart.py. Its snippets run as typed:
tests/e2e/test_readme.py."""

from __future__ import annotations

import re

from helpers.paths import REPO

ROOT = REPO
README = (ROOT / "README.md").read_text()
BLOCKS = re.findall(r"```(bash|python)\n(.*?)```", README, re.S)


def test_readme_first_lines_are_the_two_commands():
    lines = [line for line in README.splitlines() if line.strip()][:5]
    assert lines[2].startswith("make demo") and lines[3].startswith("make test")


def test_readme_links_resolve():
    links = re.findall(r"\]\(([^)#]+)\)", README)
    assert links and [link for link in links if not (ROOT / link).exists()] == []
    for page in (ROOT / "docs").glob("*.md"):
        for link in re.findall(r"\]\(([^)#:]+)\)", page.read_text()):
            assert (page.parent / link).exists(), (page.name, link)


def test_quickstart_program_is_examples_quickstart():
    [program] = [code for kind, code in BLOCKS if kind == "python"]
    example = (ROOT / "examples" / "quickstart.py").read_text()
    assert example.split('"""\n\n', 1)[1] == program
