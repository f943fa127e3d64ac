"""What ``ray-stream-llm run --resume`` records (issue 35 item 1), no engine: the record in
a store prefix and in a shared directory. The killed and resumed jobs:
tests/e2e/test_resume.py."""

from __future__ import annotations

import uuid

import pytest
from helpers.jobs import store_through


@pytest.mark.s3
def test_the_resume_record_in_a_store_prefix_and_a_shared_dir(s3_server, no_aws_env, tmp_path):
    """What ``run --resume`` records (no engine): each batch one Parquet file, read back
    whole, in an ``s3://`` prefix of the store given only as an ObjectStoreConfig (the
    test's environment holds no AWS variable) and in a directory; an input without an
    ``id`` column keyed by position; a repeated id refused, naming the column."""
    import pyarrow as pa

    from ray_stream_llm.commands.batch import InputError, ResumeLog, keyed_input
    from ray_stream_llm.stores.settings import ObjectStoreConfig

    store = ObjectStoreConfig(**store_through(s3_server))
    prefix = f"s3://models/resume-record/{uuid.uuid4().hex[:8]}/"
    for location, object_store in ((prefix, store), (str(tmp_path / "record"), None)):
        log = ResumeLog(location, object_store)
        assert log.recorded() is None
        log.record(pa.table({"id": [1, 2], "generated_text": ["a", "b"]}))
        log.record(pa.table({"id": [3], "generated_text": ["c"]}))
        again = ResumeLog(location, object_store)
        assert sorted(again.recorded()["id"].to_pylist()) == [1, 2, 3], location
        assert len(again._parts()) == 2, location  # one file per batch, no partial one
    assert any(r.uri.startswith(prefix) and r.method == "GET" for r in s3_server.served())

    plain = tmp_path / "plain.jsonl"
    plain.write_text('{"question": "a"}\n{"question": "b"}\n')
    table, key = keyed_input(plain)
    assert key == "__row" and table["__row"].to_pylist() == [0, 1]
    twice = tmp_path / "twice.jsonl"
    twice.write_text('{"id": 7, "question": "a"}\n{"id": 7, "question": "b"}\n')
    with pytest.raises(InputError, match="'id' column .* repeats a value"):
        keyed_input(twice)
