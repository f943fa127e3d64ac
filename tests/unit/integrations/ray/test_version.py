"""The supported Ray range (ray_stream_llm/integrations/ray/version.py): version parsing
and the typed error naming the version and the fix."""

from __future__ import annotations

import pytest

from ray_stream_llm.errors import UnsupportedRayError
from ray_stream_llm.integrations.ray.version import SUPPORTED_RAY, _minor, check_ray_version


@pytest.mark.parametrize(
    ("text", "minor"),
    [("2.48.0", (2, 48)), ("2.60.1", (2, 60)), ("2.55.0rc1", (2, 55)), ("2.61.0.dev0", (2, 61))],
)
def test_minor_of_a_release_a_patch_and_a_dev_build(text, minor):
    assert _minor(text) == minor


@pytest.mark.parametrize("version", ["2.48.0", "2.48.3", "2.54.1", "2.60.0", "2.60.2"])
def test_versions_in_the_range_pass(version):
    check_ray_version(version)


@pytest.mark.parametrize("version", ["2.47.1", "2.61.0", "3.0.0", "2.9.0"])
def test_versions_outside_the_range_name_the_version_and_the_fix(version):
    with pytest.raises(UnsupportedRayError) as info:
        check_ray_version(version)
    message = str(info.value)
    assert f"ray {version} is not supported" in message
    assert f"pip install 'ray[data]=={SUPPORTED_RAY[1]}'" in message
    assert isinstance(info.value, ImportError)  # callers may catch the builtin too
