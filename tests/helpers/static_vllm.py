"""The library's vLLM and torch touch points (``ray_stream_llm.integrations.vllm.touchpoints``)
checked in source files, without importing them: a site-packages directory, or a wheel read
in place (only the ``.py`` files a touch point leads to are read out of the zip; nothing is
unpacked). For a vLLM that cannot run here (0.33.0 pins torch 2.14; no CPU build).

A name is found where its module defines it at the top level (a ``def``, a ``class``, an
assignment, an annotation, ``if TYPE_CHECKING`` blocks included), re-exports it
(``from .x import name``, followed), or names it as a key of a top-level dict (vLLM's lazy
``MODULE_ATTRS`` and ``envs.environment_variables``; a ``"module:attr"`` value is followed).
Inside a class: its body, ``self.<name> = ...`` in its methods, then its base classes.

    python tests/helpers/static_vllm.py <dir with vllm-*.whl, a .whl, or site-packages>
"""

from __future__ import annotations

import ast
import dataclasses
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
if __name__ == "__main__" and str(ROOT) not in sys.path:  # a script, from the checkout
    sys.path.insert(0, str(ROOT))

from ray_stream_llm.integrations.vllm.touchpoints import TOUCHPOINTS, TouchPoint  # noqa: E402


class Sources:
    """The ``.py`` files of one or more installed trees or wheels, by module name."""

    def __init__(self, *places: Path):
        self._dirs: list[Path] = []
        self._zips: list[zipfile.ZipFile] = []
        for place in places:
            place = Path(place)
            if place.is_dir() and not (place / "vllm").is_dir() and not (place / "torch").is_dir():
                self._zips.extend(zipfile.ZipFile(w) for w in sorted(place.glob("*.whl")))
            elif place.suffix == ".whl":
                self._zips.append(zipfile.ZipFile(place))
            else:
                self._dirs.append(place)
        self._parsed: dict[str, tuple[str, ast.Module] | None] = {}
        self.read: list[str] = []  # the files read, for the report

    def packages(self) -> set[str]:
        """The top-level packages these sources hold."""
        found = {p.name for d in self._dirs for p in d.iterdir() if (p / "__init__.py").exists()}
        for z in self._zips:
            found.update(n.split("/", 1)[0] for n in z.namelist() if n.endswith("/__init__.py"))
        return found

    def module(self, name: str) -> tuple[str, ast.Module] | None:
        """(source, tree) of module ``name``, or None."""
        if name not in self._parsed:
            self._parsed[name] = self._load(name)
        return self._parsed[name]

    def is_package(self, name: str) -> bool:
        rel = name.replace(".", "/") + "/__init__.py"
        return any((d / rel).is_file() for d in self._dirs) or any(
            rel in z.NameToInfo for z in self._zips
        )

    def _load(self, name: str) -> tuple[str, ast.Module] | None:
        base = name.replace(".", "/")
        for rel in (f"{base}.py", f"{base}/__init__.py"):
            for d in self._dirs:
                if (d / rel).is_file():
                    text = (d / rel).read_text(encoding="utf-8")
                    self.read.append(rel)
                    return text, ast.parse(text)
            for z in self._zips:
                if rel in z.NameToInfo:
                    text = z.read(rel).decode("utf-8")
                    self.read.append(rel)
                    return text, ast.parse(text)
        return None


@dataclasses.dataclass
class Found:
    """A definition: its node (a def, a class, or None for an assignment or a dict key), the
    module and source it is in, and how it was reached."""

    node: ast.AST | None
    module: str
    source: str
    via: list[str]


def _top_level(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Statements at a module's or class's top level, inside ``if``/``try`` blocks too."""
    for stmt in body:
        if isinstance(stmt, ast.If):
            yield from _top_level(stmt.body)
            yield from _top_level(stmt.orelse)
        elif isinstance(stmt, ast.Try):
            yield from _top_level(stmt.body)
            for handler in stmt.handlers:
                yield from _top_level(handler.body)
            yield from _top_level(stmt.orelse)
        else:
            yield stmt


def _absolute(module: str, level: int, target: str | None, package: bool) -> str:
    if level == 0:
        return target or ""
    parts = module.split(".")
    base = parts if package else parts[:-1]
    base = base[: len(base) - (level - 1)] if level > 1 else base
    return ".".join([*base, target] if target else base)


class Checker:
    def __init__(self, sources: Sources):
        self.sources = sources

    def find(self, module: str, name: str, depth: int = 0) -> Found | None:
        """The definition of ``name`` (one part) in ``module``, following re-exports."""
        loaded = self.sources.module(module)
        if loaded is None or depth > 8:
            return None
        source, tree = loaded
        package = self.sources.is_package(module)
        for stmt in _top_level(tree.body):
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                if stmt.name == name:
                    return Found(stmt, module, source, [module])
            elif isinstance(stmt, ast.ImportFrom):
                for alias in stmt.names:
                    if (alias.asname or alias.name) == name:
                        origin = _absolute(module, stmt.level, stmt.module, package)
                        found = self.find(origin, alias.name, depth + 1)
                        if found is not None:
                            found.via.insert(0, module)
                            return found
                        submodule = self.sources.module(f"{origin}.{alias.name}")
                        if submodule is not None:  # from package import module
                            return Found(None, f"{origin}.{alias.name}", submodule[0], [module])
                        return None
        # assignments, annotations and dict keys: after defs and imports, which they may alias
        for stmt in _top_level(tree.body):
            targets: list[ast.expr] = []
            value: ast.expr | None = None
            if isinstance(stmt, ast.Assign):
                targets, value = stmt.targets, stmt.value
            elif isinstance(stmt, ast.AnnAssign):
                targets, value = [stmt.target], stmt.value
            for target in targets:
                if isinstance(target, ast.Name) and target.id == name:
                    if isinstance(value, ast.Name) and value.id != name:  # an alias
                        aliased = self.find(module, value.id, depth + 1)
                        if aliased is not None:
                            return aliased
                    return Found(None, module, source, [module])
            if isinstance(value, ast.Dict):
                for key, item in zip(value.keys, value.values, strict=True):
                    if not (isinstance(key, ast.Constant) and key.value == name):
                        continue
                    lazy = item.value if isinstance(item, ast.Constant) else None
                    if isinstance(lazy, str) and ":" in lazy:  # MODULE_ATTRS: ".x.y:Name"
                        where, attr = lazy.split(":", 1)
                        dots = len(where) - len(where.lstrip("."))
                        origin = _absolute(module, dots, where.lstrip(".") or None, package)
                        found = self.find(origin, attr, depth + 1)
                        if found is not None:
                            found.via.insert(0, module)
                            return found
                    return Found(None, module, source, [module])
        return None

    def member(self, owner: Found, name: str, depth: int = 0) -> Found | None:
        """``name`` in class ``owner``: its body, ``self.<name>`` set in a method, its bases."""
        cls = owner.node
        if not isinstance(cls, ast.ClassDef) or depth > 8:
            return None
        for stmt in _top_level(cls.body):
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                if stmt.name == name:
                    return Found(stmt, owner.module, owner.source, owner.via)
            elif isinstance(stmt, (ast.Assign, ast.AnnAssign)):
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                    return Found(None, owner.module, owner.source, owner.via)
        for node in ast.walk(cls):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Store)
                and node.attr == name
                and isinstance(node.value, ast.Name)
                and node.value.id == "self"
            ):
                return Found(None, owner.module, owner.source, owner.via)
        for base in cls.bases:
            base_name = base.id if isinstance(base, ast.Name) else None
            if base_name is None:
                continue
            found_base = self.find(owner.module, base_name)
            if found_base is not None:
                found = self.member(found_base, name, depth + 1)
                if found is not None:
                    return found
        return None

    def resolve(self, point: TouchPoint) -> Found | None:
        first, *rest = point.name.split(".")
        found = self.find(point.module, first)
        for part in rest:
            if found is None:
                return None
            found = self.member(found, part)
        return found

    def problems(self, point: TouchPoint) -> list[str]:
        """What is wrong with ``point`` in these sources (nothing: an empty list)."""
        found = self.resolve(point)
        if found is None:
            if self.sources.module(point.module) is None:
                return [f"{point.qualname}: no module {point.module}"]
            return [f"{point.qualname}: not defined in {point.module}"]
        wrong = []
        if point.params is not None:
            if not isinstance(found.node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                wrong.append(f"{point.qualname}: not a function")
            else:
                have = parameters(found.node)
                if not params_match(point, have):
                    wrong.append(
                        f"{point.qualname}: parameters {have} (the library relies on "
                        f"{point.params}{'' if point.exact else ' first'})"
                    )
        if point.contains:
            text = ast.get_source_segment(found.source, found.node) if found.node else None
            text = text if text is not None else found.source
            for wanted in point.contains:
                if wanted not in text:
                    wrong.append(f"{point.qualname}: its source no longer contains {wanted!r}")
        return wrong


def parameters(node: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[str, ...]:
    """The parameter names ``inspect.signature`` gives the function (a classmethod's
    ``cls`` dropped, as on the bound method)."""
    args = node.args
    names = [a.arg for a in (*args.posonlyargs, *args.args)]
    if args.vararg:
        names.append(args.vararg.arg)
    names.extend(a.arg for a in args.kwonlyargs)
    if args.kwarg:
        names.append(args.kwarg.arg)
    decorators = {d.id for d in node.decorator_list if isinstance(d, ast.Name)}
    if "classmethod" in decorators and names:
        names = names[1:]
    return tuple(names)


def params_match(point: TouchPoint, have: tuple[str, ...]) -> bool:
    """The library's reliance on ``point.params`` holds for a callable taking ``have``."""
    assert point.params is not None
    if point.exact:
        return have == point.params
    return have[: len(point.params)] == point.params


def check(*places: Path, packages: tuple[str, ...] | None = None) -> dict[str, list[str]]:
    """Each touch point of ``packages`` (by default those the sources hold) and what is
    wrong with it in the sources at ``places`` (an empty list: nothing)."""
    sources = Sources(*places)
    held = set(packages) if packages is not None else sources.packages()
    checker = Checker(sources)
    return {p.qualname: checker.problems(p) for p in TOUCHPOINTS if p.package in held}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.rsplit("\n\n", 1)[-1].strip(), file=sys.stderr)
        return 2
    results = check(Path(argv[0]))
    for name, wrong in results.items():
        print(f"ok    {name}" if not wrong else "\n".join(f"WRONG {w}" for w in wrong))
    bad = sum(1 for w in results.values() if w)
    print(f"{len(results) - bad} of {len(results)} touch points as the library relies on them")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
