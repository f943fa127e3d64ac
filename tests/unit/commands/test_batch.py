"""``ray-stream-llm run``'s input handling without Ray (ray_stream_llm/commands/batch.py): the
columns of each input format, the rows' keys for ``--resume``, the engine arguments, and the
resume log's round trip in tmp_path."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ray_stream_llm.commands.batch import (
    POSITION_COLUMN,
    InputError,
    ResumeLog,
    input_columns,
    keyed_input,
    parse_engine_kwargs,
)


def test_the_columns_of_each_format(tmp_path):
    jsonl = tmp_path / "in.jsonl"
    jsonl.write_text('\n{"id": 1, "question": "q"}\n{"other": 2}\n')
    csv = tmp_path / "in.csv"
    csv.write_text("id,question\n1,q\n")
    parquet = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": [1], "question": ["q"]}), parquet)
    for path in (jsonl, csv, parquet):
        assert input_columns(path) == ["id", "question"]


@pytest.mark.parametrize(
    ("name", "text", "words"),
    [
        ("in.txt", "x", "use a .jsonl, .csv or .parquet file"),
        ("in.jsonl", "{not json\n", "line 1 is not JSON"),
        ("in.jsonl", "\n[1, 2]\n", "line 2 is not a JSON object"),
        ("in.jsonl", "\n\n", "has no rows"),
    ],
)
def test_a_bad_input_file_names_the_file_and_what_is_wrong(tmp_path, name, text, words):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(InputError) as info:
        input_columns(path)
    assert words in str(info.value) and repr(str(path)) in str(info.value)


def test_a_missing_input_file_is_named(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        input_columns(tmp_path / "none.jsonl")


def test_rows_are_keyed_by_a_unique_id_else_by_position(tmp_path):
    with_id = tmp_path / "a.jsonl"
    with_id.write_text('{"id": "x", "q": 1}\n{"id": "y", "q": 2}\n')
    table, key = keyed_input(with_id)
    assert key == "id" and table.column_names == ["id", "q"]
    without = tmp_path / "b.csv"
    without.write_text("q\n1\n2\n3\n")
    table, key = keyed_input(without)
    assert key == POSITION_COLUMN and table[POSITION_COLUMN].to_pylist() == [0, 1, 2]


def test_a_repeated_id_is_refused_with_the_fix(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_text('{"id": 1}\n{"id": 1}\n')
    with pytest.raises(InputError, match="repeats a value"):
        keyed_input(path)


def test_engine_arguments_are_json_else_strings():
    parsed = parse_engine_kwargs(("max_model_len=4096", "dtype=bfloat16", 'x={"a": [1]}', "e="))
    assert parsed == {"max_model_len": 4096, "dtype": "bfloat16", "x": {"a": [1]}, "e": ""}
    for bad in ("max_model_len", "=4096"):
        with pytest.raises(InputError, match="write KEY=VALUE"):
            parse_engine_kwargs((bad,))


def test_the_resume_log_reads_back_every_recorded_batch(tmp_path):
    log = ResumeLog(str(tmp_path / "log"))
    assert log.recorded() is None
    log.record(pa.table({"__row": [0, 1], "generated_text": ["a", "b"]}))
    log.record(pa.table({"__row": [2], "generated_text": ["c"]}))
    again = ResumeLog(str(tmp_path / "log"))  # the next run
    assert sorted(again.recorded()["__row"].to_pylist()) == [0, 1, 2]
    assert not [p for p in (tmp_path / "log").iterdir() if p.name.endswith(".partial")]


def test_a_resume_location_of_another_scheme_is_refused():
    with pytest.raises(InputError, match="give a shared directory or an s3:// prefix"):
        ResumeLog("gs://bucket/log/")
