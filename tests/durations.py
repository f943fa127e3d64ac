"""The slowest tests of a run, across every pytest of it (``make test``): each writes a JUnit
XML file under one directory; this prints the N slowest test cases (setup, call and teardown
together).

    python tests/durations.py N DIRECTORY
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def main(count: int, directory: Path) -> None:
    cases: list[tuple[float, str]] = []
    for report in sorted(directory.glob("*.xml")):
        for case in ET.parse(report).iter("testcase"):
            name = f"{case.get('classname', '')}::{case.get('name', '')}"
            cases.append((float(case.get("time") or 0.0), f"[{report.stem}] {name}"))
    if not cases:
        sys.exit(f"no test reports under {directory}")
    total = sum(seconds for seconds, _ in cases)
    print(f"\n{count} slowest of {len(cases)} tests ({total:.0f} s of test time in all):")
    for seconds, name in sorted(cases, reverse=True)[:count]:
        print(f"{seconds:8.1f}s  {name}")


if __name__ == "__main__":
    main(int(sys.argv[1]), Path(sys.argv[2]))
