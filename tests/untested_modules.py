"""Lists the modules of ``ray_stream_llm`` (outside ``tools/``) that define a function of their
own and that no unit test under ``tests/unit/`` imports; exits 1 when there is one.

Usage: ``python tests/untested_modules.py`` (from the repository root)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "ray_stream_llm"
UNIT = ROOT / "tests" / "unit"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def has_logic(path: Path) -> bool:
    """Whether the module defines a function or method (constants and re-exports do not count)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return any(isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) for n in ast.walk(tree))


def imported_by(path: Path) -> set[str]:
    """Every ``ray_stream_llm`` module that the file imports, at any depth of its code."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("ray_stream_llm")}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("ray_stream_llm"):
            assert node.module is not None
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}  # a submodule by name
    return found


def untested() -> list[str]:
    modules = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py")) if "tools" not in p.parts}
    imported: set[str] = set()
    for test in UNIT.rglob("*.py"):
        imported |= imported_by(test)
    return [name for name, path in modules.items() if has_logic(path) and name not in imported]


def main() -> int:
    missing = untested()
    for name in missing:
        print(name)
    print(f"{len(missing)} module(s) with logic of their own imported by no unit test")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
