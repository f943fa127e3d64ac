"""The ``run`` command's job: every row of a file answered by a streamed model.

Everything that can be checked is checked before Ray starts: the input file and its
column (read with the standard library and pyarrow, not Ray), the engine arguments
and the model (the processor is built, with its preflight, before ``ray.init``).
Then the job runs quietly (Ray and vLLM log at WARNING unless ``verbose``), with one
progress display (rows done, tokens per second), and writes one Parquet file.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

SUFFIXES = (".jsonl", ".json", ".csv", ".parquet")
QUIET_ENV = {
    "VLLM_LOGGING_LEVEL": "WARNING",
    "RAY_STREAM_LLM_PROGRESS": "0",
    "RAY_DATA_LOG_LEVEL": "WARNING",
}


class InputError(ValueError):
    """The input file, its column or an option is wrong; the message says which and why."""


ID_COLUMN = "id"  # a resumed job's row key, where the input has it
POSITION_COLUMN = "__row"  # else the row's position in the input (0 for the first row)


@dataclasses.dataclass
class BatchResult:
    rows_in: int
    rows_out: int
    generated_tokens: int
    seconds: float
    output: Path
    load_lines: list[str]
    rows_resumed: int = 0  # rows a previous run recorded in --resume's location, not asked again


def input_columns(path: Path) -> list[str]:
    """The columns of ``path`` (JSON lines, CSV or Parquet), read without Ray."""
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        raise InputError(f"{str(path)!r}: use a .jsonl, .csv or .parquet file")
    if not path.is_file():
        raise InputError(f"{str(path)!r} does not exist")
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        return list(pq.read_schema(path).names)
    with open(path, newline="", encoding="utf-8") as f:
        if suffix == ".csv":
            return next(csv.reader(f), [])
        for number, line in enumerate(f, 1):
            if line.strip():
                try:
                    row = json.loads(line)
                except ValueError as exc:
                    raise InputError(f"{str(path)!r} line {number} is not JSON ({exc})") from None
                if not isinstance(row, dict):
                    raise InputError(f"{str(path)!r} line {number} is not a JSON object")
                return list(row)
    raise InputError(f"{str(path)!r} has no rows")


def read_input(path: Path, *, num_cpus: float) -> Any:
    """The rows of ``path`` (the reader chosen by its suffix, as :func:`input_columns`'s),
    read now, into Ray's object store, before any engine or stage actor starts.

    ``num_cpus``: each read task's; it reserves a whole CPU by default, and beside the
    engine and the CPU stages a small machine would never schedule it. Read now, because
    not every task of a read takes that option: Ray 2.60 lists a Parquet file's path in a
    task of its own (``ListFiles``) that asks one whole CPU; run inside the job, once the
    actors hold the CPUs, it never ran on a 2-CPU machine (`run` on a Parquet file waited
    with the engine ready and idle: tests/e2e/test_cli.py)."""
    import ray

    readers = {".parquet": ray.data.read_parquet, ".csv": ray.data.read_csv}
    reader = readers.get(path.suffix.lower(), ray.data.read_json)
    return reader(str(path), num_cpus=num_cpus).materialize()


class ResumeLog:
    """``run --resume LOCATION``: each batch of answers recorded as one Parquet file in
    LOCATION (a shared path, or an ``s3://bucket/prefix/`` in the job's store) as soon as
    it comes out, written whole or not at all (a local file renamed into place; one PUT);
    a re-run with the same LOCATION reads the keys recorded there and asks only the rest.
    The key is the input's ``id`` column, else the row's position in the input file."""

    def __init__(self, location: str, object_store: Any = None) -> None:
        import pyarrow.fs as pafs

        self.location = location
        if location.startswith("s3://"):  # the model's store settings, as the engines get them
            from ray_stream_llm.stores.settings import derive_settings

            env = {**os.environ, **derive_settings(object_store).env}
            options: dict[str, Any] = {}
            if env.get("AWS_ENDPOINT_URL"):
                options["endpoint_override"] = env["AWS_ENDPOINT_URL"]
            if env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION"):
                options["region"] = env.get("AWS_REGION") or env["AWS_DEFAULT_REGION"]
            if object_store is not None and object_store.anonymous:
                options["anonymous"] = True
            elif env.get("AWS_ACCESS_KEY_ID") and env.get("AWS_SECRET_ACCESS_KEY"):
                options["access_key"] = env["AWS_ACCESS_KEY_ID"]
                options["secret_key"] = env["AWS_SECRET_ACCESS_KEY"]
                options["session_token"] = env.get("AWS_SESSION_TOKEN")
            self.fs: Any = pafs.S3FileSystem(**options)
            self.root = location[len("s3://") :].rstrip("/")
        elif "://" in location:
            raise InputError(f"--resume {location!r}: give a shared directory or an s3:// prefix")
        else:
            self.fs = pafs.LocalFileSystem()
            self.root = str(Path(location).resolve())
            Path(self.root).mkdir(parents=True, exist_ok=True)

    def _parts(self) -> list[str]:
        import pyarrow.fs as pafs

        try:
            infos = self.fs.get_file_info(pafs.FileSelector(self.root, allow_not_found=True))
        except OSError as exc:
            raise InputError(f"--resume {self.location!r} cannot be read: {exc}") from None
        return sorted(
            i.path for i in infos if i.type == pafs.FileType.File and i.path.endswith(".parquet")
        )

    def recorded(self) -> Any:
        """The rows recorded so far, one table (None when there are none)."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        tables = [pq.read_table(path, filesystem=self.fs) for path in self._parts()]
        return pa.concat_tables(tables, promote_options="default") if tables else None

    def record(self, table: Any) -> None:
        """One batch of answers, as one file, whole or not at all."""
        import uuid

        import pyarrow.parquet as pq

        name = f"{self.root}/part-{uuid.uuid4().hex}.parquet"
        if self.location.startswith("s3://"):
            pq.write_table(table, name, filesystem=self.fs)  # one PUT: all or nothing
            return
        partial = f"{self.root}/.{Path(name).name}.partial"
        pq.write_table(table, partial)
        os.replace(partial, name)


def keyed_input(path: Path) -> tuple[Any, str]:
    """The rows of ``path`` as one Arrow table (read on the driver, with pyarrow) and their
    key: ``id`` where the input has it (refused unless unique), else ``__row``, each row's
    position in the file, added."""
    import pyarrow as pa
    import pyarrow.compute as pc

    suffix = path.suffix.lower()
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        table = pq.read_table(path)
    elif suffix == ".csv":
        import pyarrow.csv as pcsv

        table = pcsv.read_csv(path)
    else:
        import pyarrow.json as pjson

        table = pjson.read_json(path)
    if ID_COLUMN in table.column_names:
        if pc.count_distinct(table[ID_COLUMN]).as_py() != table.num_rows:
            raise InputError(
                f"--resume: the {ID_COLUMN!r} column of {str(path)!r} repeats a value; give "
                f"each row its own {ID_COLUMN!r}, or drop the column to key rows by position"
            )
        return table, ID_COLUMN
    return table.append_column(POSITION_COLUMN, pa.array(range(table.num_rows), pa.int64())), (
        POSITION_COLUMN
    )


def parse_engine_kwargs(items: tuple[str, ...]) -> dict[str, Any]:
    """``KEY=JSON`` items (a value that is not JSON is taken as a string)."""
    kwargs: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InputError(f"--engine-kwarg {item!r}: write KEY=VALUE")
        try:
            kwargs[key] = json.loads(value)
        except ValueError:
            kwargs[key] = value
    return kwargs


def run_batch(
    model_uri: str,
    input_path: Path,
    column: str,
    output: Path,
    *,
    sampling: dict[str, Any],
    engine_kwargs: dict[str, Any],
    batch_size: int,
    concurrency: int,
    object_store: Any = None,
    verbose: bool = False,
    progress: Callable[[int, int, int], None] | None = None,
    resume: str | None = None,
) -> BatchResult:
    """Answer every row of ``input_path``; write ``output/answers.parquet``. With
    ``resume`` (a shared directory or an ``s3://`` prefix, :class:`ResumeLog`) each batch is
    recorded there as it comes, and the rows recorded by an earlier run are not asked
    again; ``answers.parquet`` holds them all, ordered by their key."""
    start = time.perf_counter()
    if not verbose:  # vLLM's import-time lines on the driver
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    columns = input_columns(input_path)
    if column not in columns:
        raise InputError(f"no column {column!r} in {str(input_path)!r}; columns: {columns}")
    from ray_stream_llm import (
        StreamingvLLMEngineProcessorConfig,
        build_llm_processor,
        load_reports,
        typed_errors,
    )
    from ray_stream_llm.preflight import preflight

    config = StreamingvLLMEngineProcessorConfig(
        model_source=model_uri,
        engine_kwargs={"load_format": "runai_streamer", **engine_kwargs},
        batch_size=batch_size,
        concurrency=concurrency,
        object_store=object_store,
    )

    def preprocess(row: dict[str, Any]) -> dict[str, Any]:
        value = row[column]
        messages = [{"role": "user", "content": value}] if isinstance(value, str) else list(value)
        return {"messages": messages, "__input": dict(row), "sampling_params": sampling}

    def postprocess(row: dict[str, Any]) -> dict[str, Any]:
        return {
            **row["__input"],
            "generated_text": row["generated_text"],
            "num_generated_tokens": int(row.get("num_generated_tokens") or 0),
            "num_input_tokens": int(row.get("num_input_tokens") or 0),
        }

    log = ResumeLog(resume, object_store) if resume is not None else None
    # Before Ray starts: the preflight answers a wrong model in seconds, with no Ray output.
    checked = preflight(config)
    import pyarrow as pa
    import pyarrow.parquet as pq
    import ray

    started_ray = not ray.is_initialized()
    if started_ray:  # quiet, before Ray's builder would start it
        for key, value in () if verbose else QUIET_ENV.items():
            os.environ.setdefault(key, value)
        ray.init(
            include_dashboard=False,
            logging_level=logging.INFO if verbose else logging.WARNING,
            log_to_driver=verbose,
            runtime_env={"env_vars": {k: os.environ[k] for k in QUIET_ENV if k in os.environ}},
        )
    processor = build_llm_processor(
        config,
        preprocess=preprocess,
        postprocess=postprocess,
        builder_kwargs={"checked_metadata_dir": checked},
    )
    from ray_stream_llm.integrations.ray.builder import MAP_NUM_CPUS  # the processor's map default

    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = verbose  # ours is the one display when quiet
    if not verbose:  # (ERROR: its "progress bars disabled" warning is about ours)
        logging.getLogger("ray.data").setLevel(logging.ERROR)
    tables: list[Any] = []
    rows, tokens, resumed = 0, 0, 0
    row_key: str | None = None
    if log is None:
        ds = read_input(input_path, num_cpus=MAP_NUM_CPUS)
        rows_in = ds.count()
    else:
        import pyarrow.compute as pc

        table, row_key = keyed_input(input_path)
        rows_in = table.num_rows
        done = log.recorded()
        if done is not None and row_key in done.column_names:
            tables.append(done)
            resumed = rows = done.num_rows
            tokens = sum(done.column("num_generated_tokens").to_pylist())
            seen = done[row_key].combine_chunks().cast(table[row_key].type)
            table = table.filter(pc.invert(pc.is_in(table[row_key], value_set=seen)))
        # a block per batch: each batch's answers come out (and are recorded) on their own
        ds = ray.data.from_arrow(
            [table.slice(i, batch_size) for i in range(0, table.num_rows, batch_size)] or table
        )
    if progress is not None:
        progress(rows, rows_in, tokens)  # the display starts with the job: its rate is the job's
    with typed_errors():
        if log is None or ds.count():
            for batch in processor(ds).iter_batches(batch_format="pyarrow", batch_size=None):
                if log is not None:
                    log.record(batch)
                tables.append(batch)
                rows += batch.num_rows
                tokens += sum(batch.column("num_generated_tokens").to_pylist())
                if progress is not None:
                    progress(rows, rows_in, tokens)
    output.mkdir(parents=True, exist_ok=True)
    target = output / "answers.parquet"
    if tables:
        answers = pa.concat_tables(tables, promote_options="default")
        if row_key is not None:
            answers = answers.sort_by(row_key)
            if row_key == POSITION_COLUMN:
                answers = answers.drop_columns([POSITION_COLUMN])
        pq.write_table(answers, target)
    lines = [report.log_line() for report in load_reports()]
    from ray_stream_llm.integrations.ray.compat import settle_ray_data

    settle_ray_data()
    if started_ray:
        ray.shutdown()
    return BatchResult(rows_in, rows, tokens, time.perf_counter() - start, target, lines, resumed)
