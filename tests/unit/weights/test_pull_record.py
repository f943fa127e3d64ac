"""A region's pull record (``.pull.json``) is written just after its last file is whole, so
a reader that saw every file can come first (CI's clean-clone run c11 failed
test_peers::test_a_node_added_after_the_others_filled_fills_from_a_peer that way):
``finished_pull`` waits while the pull still holds its lock and returns the record, and
returns at once where no pull holds it. The pulls that write records for real are in
tests/integration (test_node_weights.py, test_peers.py)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from ray_stream_llm.files import try_locked, write_whole
from ray_stream_llm.weights.region import finished_pull, pull_status


def test_a_reader_before_the_record_gets_it_once_the_pull_ends(tmp_path: Path):
    pull = try_locked(tmp_path / ".pull.lock")  # the pull, writing its last file
    assert pull is not None
    got: dict = {}
    reader = threading.Thread(target=lambda: got.update(status=finished_pull(tmp_path)))
    reader.start()
    reader.join(timeout=1.0)
    assert reader.is_alive() and not got  # no record yet, the pull still runs: it waits
    record = {"source": "store", "bytes": 16}
    write_whole(tmp_path / ".pull.json", json.dumps(record))
    pull.release()
    reader.join(timeout=30)
    assert not reader.is_alive() and got["status"] == record


def test_no_pull_and_no_record_is_none_at_once(tmp_path: Path):
    started = time.monotonic()
    assert finished_pull(tmp_path, timeout=30) is None  # the pull failed, or never ran
    assert time.monotonic() - started < 5
    assert pull_status(tmp_path) is None
