"""The console script's argument errors (ray_stream_llm/cli.py): one line and an exit status,
no traceback, before Ray or a store is reached."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from ray_stream_llm.cli import _size, main


@pytest.fixture
def cli():
    runner = CliRunner()
    return lambda *args: runner.invoke(main, list(args))


def test_run_refuses_an_engine_argument_without_a_value(cli, tmp_path):
    questions = tmp_path / "q.jsonl"
    questions.write_text('{"question": "2+2?"}\n')
    result = cli(
        "run",
        "s3://bucket/m/",
        str(questions),
        "--column",
        "question",
        "--output",
        str(tmp_path / "out"),
        "--engine-kwarg",
        "max_model_len",
    )
    assert result.exit_code == 2
    assert "--engine-kwarg 'max_model_len': write KEY=VALUE" in result.output
    assert "Traceback" not in result.output


def test_run_names_the_columns_when_the_column_is_missing(cli, tmp_path):
    questions = tmp_path / "q.jsonl"
    questions.write_text('{"prompt": "2+2?"}\n')
    result = cli(
        "run",
        "s3://bucket/m/",
        str(questions),
        "--column",
        "question",
        "--output",
        str(tmp_path / "out"),
    )
    assert result.exit_code == 2
    assert "no column 'question'" in result.output and "['prompt']" in result.output


def test_run_refuses_a_batch_size_below_one(cli, tmp_path):
    result = cli(
        "run",
        "s3://bucket/m/",
        str(tmp_path / "q.jsonl"),
        "--column",
        "q",
        "--output",
        str(tmp_path),
        "--batch-size",
        "0",
    )
    assert result.exit_code == 2 and "--batch-size" in result.output


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("{not json", "--engine-kwargs is not JSON"),
        ("[1]", "--engine-kwargs must be a JSON object"),
    ],
)
def test_shard_refuses_engine_kwargs_that_are_not_a_json_object(cli, value, words):
    result = cli(
        "shard",
        "s3://bucket/m/",
        "--tensor-parallel-size",
        "2",
        "--output",
        "s3://bucket/out/",
        "--engine-kwargs",
        value,
    )
    assert result.exit_code == 1
    assert f"Error: InvalidSettingError: {words}" in result.output
    assert "Traceback" not in result.output


def test_a_malformed_uri_is_one_line_naming_it(cli):
    result = cli("inspect", "s3://Bad_Bucket/m/")
    assert result.exit_code == 1
    assert result.output.startswith("Error: InvalidModelURIError: model URI 's3://Bad_Bucket/m/'")
    assert len(result.output.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (0, "0 B"),
        (1023, "1023 B"),
        (1024, "1.0 KiB"),
        (1536 * 1024**2, "1.5 GiB"),
        (3 * 1024**5, "3072.0 TiB"),
    ],
)
def test_sizes_are_shown_in_binary_units(n, text):
    assert _size(n) == text
