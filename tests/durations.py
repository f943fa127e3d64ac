"""The slowest tests of a run, across every pytest of it (``make test``): each writes a JUnit
XML file under one directory; this prints the N slowest test cases (setup, call and teardown
together), then each report's and each test file's seconds (what the streams' lists in the
Makefile are balanced by).

    python tests/durations.py N DIRECTORY
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path


def main(count: int, directory: Path) -> None:
    cases: list[tuple[float, str]] = []
    reports: Counter[str] = Counter()
    files: Counter[str] = Counter()
    for report in sorted(directory.glob("*.xml")):
        for case in ET.parse(report).iter("testcase"):
            seconds = float(case.get("time") or 0.0)
            classname = case.get("classname", "")
            cases.append((seconds, f"[{report.stem}] {classname}::{case.get('name', '')}"))
            reports[report.stem] += seconds
            files[f"[{report.stem}] {classname.replace('.', '/')}.py"] += seconds
    if not cases:
        sys.exit(f"no test reports under {directory}")
    total = sum(seconds for seconds, _ in cases)
    print(f"\n{count} slowest of {len(cases)} tests ({total:.0f} s of test time in all):")
    for seconds, name in sorted(cases, reverse=True)[:count]:
        print(f"{seconds:8.1f}s  {name}")
    print("\ntest time by report:")
    for name, seconds in reports.most_common():
        print(f"{seconds:8.1f}s  {name}")
    print(f"\nthe {count} slowest test files:")
    for name, seconds in files.most_common(count):
        print(f"{seconds:8.1f}s  {name}")


if __name__ == "__main__":
    main(int(sys.argv[1]), Path(sys.argv[2]))
