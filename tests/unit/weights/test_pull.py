"""The node's pull into its region (``ray_stream_llm.weights.pull``): its parts that need no
store and no Ray.

A failed pull's mark: a failed shared pull reaches its waiters as the typed error it was
(issue 34). The pull's ``.failed`` mark records the error's class beside its message, and
``wait_for`` raises the library's class (``except ObjectChangedError`` in the engine's
process), anything else a ``RuntimeError`` as before; a mark of an older release (plain
text) or an empty one reads as it did. The marks are written by the pull's own writer
(``fail``) into a region directory made here; the pulls that fail for real are in
tests/integration (test_region_trust.py, test_gcs.py, test_peers.py, test_node_weights.py).

The pull record: a region's ``.pull.json`` is written just after its last file is whole, so
a reader that saw every file can come first (CI's clean-clone run c11 failed
test_peers::test_a_node_added_after_the_others_filled_fills_from_a_peer that way):
``finished_pull`` waits while the pull still holds its lock and returns the record, and
returns at once where no pull holds it. The pulls that write records for real are in
tests/integration (test_node_weights.py, test_peers.py)."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest

from ray_stream_llm.errors import ModelNotFoundError, ObjectChangedError, RayStreamLLMError
from ray_stream_llm.files import try_locked, write_whole
from ray_stream_llm.weights.marks import CREATED, FAILED, PullRecord, failure, pull_record
from ray_stream_llm.weights.pull import fail, finished_pull, pull_error
from ray_stream_llm.weights.reading import wait_for

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
    fail(region, cause)
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
    fail(region, ModelNotFoundError(f"{NAME!r} is no longer in the store"))
    with pytest.raises(FileNotFoundError) as err:
        wait_for(region, NAME, timeout=5)
    assert type(err.value) is ModelNotFoundError, err.value
    assert str(err.value) == PREFIX + f"{NAME!r} is no longer in the store"


@pytest.mark.parametrize(
    "error",
    [OSError(28, "No space left on device"), ValueError("bad range"), RuntimeError("boom")],
)
def test_any_other_error_stays_a_runtime_error_naming_its_class(region, error):
    fail(region, error)
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


# --- the pull record
def test_a_reader_before_the_record_gets_it_once_the_pull_ends(tmp_path: Path):
    pull = try_locked(tmp_path / ".pull.lock")  # the pull, writing its last file
    assert pull is not None
    got: dict = {}
    reader = threading.Thread(target=lambda: got.update(status=finished_pull(tmp_path)))
    reader.start()
    reader.join(timeout=1.0)
    assert reader.is_alive() and not got  # no record yet, the pull still runs: it waits
    record = PullRecord(started=1.0, finished=2.0, bytes=16, pid=os.getpid())
    write_whole(tmp_path / ".pull.json", record.to_json())
    pull.release()
    reader.join(timeout=30)
    assert not reader.is_alive() and got["status"] == record


def test_no_pull_and_no_record_is_none_at_once(tmp_path: Path):
    started = time.monotonic()
    assert finished_pull(tmp_path, timeout=30) is None  # the pull failed, or never ran
    assert time.monotonic() - started < 5
    assert pull_record(tmp_path) is None
