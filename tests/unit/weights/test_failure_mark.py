"""A failed shared pull reaches its waiters as the typed error it was (issue 34): the pull's
``.failed`` mark records the error's class beside its message, and ``wait_for`` raises the
library's class (``except ObjectChangedError`` in the engine's process), anything else a
``RuntimeError`` as before; a mark of an older release (plain text) or an empty one reads
as it did. The marks are written by the pull's own writer (``_fail``) into a region
directory made here; the pulls that fail for real are in tests/integration
(test_region_trust.py, test_gcs.py, test_peers.py, test_node_weights.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ray_stream_llm.errors import ModelNotFoundError, ObjectChangedError, RayStreamLLMError
from ray_stream_llm.weights import region as node_weights
from ray_stream_llm.weights.marks import CREATED, FAILED, failure
from ray_stream_llm.weights.region import pull_error, wait_for

NAME = "model.safetensors"
PREFIX = "the shared pull of the weights failed: "


@pytest.fixture
def region(tmp_path: Path) -> Path:
    """A region's directory with its marker (one weight object), no pull running."""
    obj = {"path": NAME, "key": f"m/{NAME}", "size": 16, "etag": "abc"}
    (tmp_path / CREATED).write_text(json.dumps({"uri": "s3://models/m/", "objects": [obj]}))
    return tmp_path


def test_a_library_error_is_raised_as_its_class_with_its_message(region):
    cause = ObjectChangedError(f"{NAME!r} of 's3://models/m/' changed in the store")
    node_weights._fail(region, cause)
    assert json.loads((region / FAILED).read_text()) == {
        "class": "ObjectChangedError",
        "message": str(cause),
    }
    assert failure(region) == ("ObjectChangedError", str(cause))
    with pytest.raises(ObjectChangedError) as err:
        wait_for(region, NAME, timeout=5)
    assert type(err.value) is ObjectChangedError
    assert str(err.value) == PREFIX + str(cause)
    assert isinstance(err.value, RuntimeError)  # its builtin, as before


def test_each_library_class_keeps_its_builtin(region):
    node_weights._fail(region, ModelNotFoundError(f"{NAME!r} is no longer in the store"))
    with pytest.raises(FileNotFoundError) as err:
        wait_for(region, NAME, timeout=5)
    assert type(err.value) is ModelNotFoundError, err.value
    assert str(err.value) == PREFIX + f"{NAME!r} is no longer in the store"


@pytest.mark.parametrize(
    "error",
    [OSError(28, "No space left on device"), ValueError("bad range"), RuntimeError("boom")],
)
def test_any_other_error_stays_a_runtime_error_naming_its_class(region, error):
    node_weights._fail(region, error)
    with pytest.raises(RuntimeError) as err:
        wait_for(region, NAME, timeout=5)
    assert type(err.value) is RuntimeError
    assert str(err.value) == f"{PREFIX}{type(error).__name__}: {error}"


def test_a_class_name_that_is_not_the_librarys_is_not_looked_up(region):
    """Only ray_stream_llm.errors' classes: a mark naming another (a builtin, a name that
    the errors module has but is no error) is a RuntimeError."""
    for name in ("ValueError", "annotations", "RayStreamLLMErrorX"):
        (region / FAILED).write_text(json.dumps({"class": name, "message": "m"}))
        error = pull_error(region)
        assert type(error) is RuntimeError and str(error) == f"{PREFIX}{name}: m", error
    (region / FAILED).write_text(json.dumps({"class": "RayStreamLLMError", "message": "m"}))
    assert type(pull_error(region)) is RayStreamLLMError


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("ObjectChangedError: 'model.safetensors' changed", "ObjectChangedError: 'model."),
        ("", "its message could not be written (memory full?)"),
        ("[1, 2]", "[1, 2]"),  # JSON, not a record
        ('{"class": 1, "message": "m"}', '{"class": 1'),
    ],
)
def test_an_older_or_empty_mark_reads_as_before(region, text, expected):
    (region / FAILED).write_text(text)
    with pytest.raises(RuntimeError) as err:
        wait_for(region, NAME, timeout=5)
    assert type(err.value) is RuntimeError
    assert str(err.value).startswith(PREFIX + expected), err.value


def test_no_mark_is_no_error(region):
    assert failure(region) is None and pull_error(region) is None
