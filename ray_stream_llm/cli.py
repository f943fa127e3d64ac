"""The ``ray-stream-llm`` console script: inspect, fetch-metadata, run, demo, bench."""

from __future__ import annotations

import functools
import json
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click


def _one_line_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Bad input: one line on stderr and exit status 2, no traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from pydantic import ValidationError

        from ray_stream_llm.errors import RayStreamLLMError

        try:
            return fn(*args, **kwargs)
        except RayStreamLLMError as exc:
            raise click.ClickException(f"{type(exc).__name__}: {exc}") from None
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "settings"
            raise click.ClickException(f"invalid {where}: {first['msg']}") from None

    return wrapper


def _store_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    for option in reversed(
        [
            click.option(
                "--endpoint-url",
                default=None,
                help="S3 endpoint of an S3-compatible store (default: AWS_ENDPOINT_URL or AWS).",
            ),
            click.option("--region", default=None, help="Region (default: AWS_REGION)."),
            click.option("--anonymous", is_flag=True, help="Unsigned requests (public buckets)."),
        ]
    ):
        fn = option(fn)
    return fn


def _store(endpoint_url: str | None, region: str | None, anonymous: bool) -> Any:
    """Credentials come from the environment (AWS_ACCESS_KEY_ID, profiles), never argv."""
    from ray_stream_llm.stores.settings import ObjectStoreConfig

    if not (endpoint_url or region or anonymous):
        return None
    return ObjectStoreConfig(endpoint_url=endpoint_url, region_name=region, anonymous=anonymous)


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return ""


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="ray-stream-llm")
def main() -> None:
    """Ray Data LLM batch inference that streams vLLM weights from object storage.

    Credentials are read from the standard AWS environment (AWS_ACCESS_KEY_ID,
    AWS_SECRET_ACCESS_KEY, AWS_PROFILE, instance roles).
    """


@main.command()
@click.argument("uri")
@click.option("--json", "as_json", is_flag=True, help="Print the manifest as JSON.")
@click.option(
    "--tensor-parallel-size",
    type=int,
    default=None,
    help="Check pre-sharded (runai_streamer_sharded) files for this many ranks.",
)
@_store_options
@_one_line_errors
def inspect(
    uri: str,
    as_json: bool,
    tensor_parallel_size: int | None,
    endpoint_url: str | None,
    region: str | None,
    anonymous: bool,
) -> None:
    """What the model at URI holds: files by role, sizes, weight bytes, streamable or not.

    Example: ray-stream-llm inspect s3://models/SmolLM2-135M-Instruct/ --endpoint-url http://127.0.0.1:9000
    """
    from ray_stream_llm.manifest import inspect_model
    from ray_stream_llm.patterns import FileRole

    manifest = inspect_model(
        uri,
        object_store=_store(endpoint_url, region, anonymous),
        tensor_parallel_size=tensor_parallel_size,
    )
    if as_json:
        click.echo(json.dumps(manifest.to_dict(), indent=2))
    else:
        click.echo(f"{manifest.uri}")
        width = max(len(f.path) for f in manifest.files)
        for role in FileRole:
            for f in (f for f in manifest.files if f.role is role):
                click.echo(f"  {f.path:<{width}}  {_size(f.size):>10}  {role.value}")
        click.echo(
            f"weights to stream: {_size(manifest.weight_bytes)} in "
            f"{len(manifest.paths(FileRole.STREAMABLE_WEIGHTS))} file(s), "
            f"{manifest.tensors} tensors"
        )
        if manifest.streamable:
            click.echo("streamable: yes")
        else:
            click.echo("streamable: no")
            for problem in manifest.problems:
                click.echo(f"  - {problem}")
    if not manifest.streamable:
        sys.exit(1)


@main.command("fetch-metadata")
@click.argument("uri")
@click.option(
    "--dest",
    type=click.Path(file_okay=False),
    default=None,
    help="Directory to write to (default: a cache directory derived from the URI).",
)
@_store_options
@_one_line_errors
def fetch_metadata(
    uri: str, dest: str | None, endpoint_url: str | None, region: str | None, anonymous: bool
) -> None:
    """Fetch the model's config and tokenizer files (never a weight file); print the directory.

    Example: ray-stream-llm fetch-metadata s3://models/SmolLM2-135M-Instruct/ --dest ./smollm2-meta
    """
    from ray_stream_llm.fetch import fetch_model_metadata

    click.echo(
        fetch_model_metadata(uri, dest, object_store=_store(endpoint_url, region, anonymous))
    )


def _read_input(path: str) -> Any:
    import ray

    from ray_stream_llm.integrations.builder import (
        MAP_NUM_CPUS,
    )  # the processor's pre/postprocess default

    suffix = Path(path).suffix.lower()
    readers = {
        ".jsonl": ray.data.read_json,
        ".json": ray.data.read_json,
        ".csv": ray.data.read_csv,
        ".parquet": ray.data.read_parquet,
    }
    if suffix not in readers:
        raise click.BadParameter(
            f"{path!r}: use a .jsonl, .csv or .parquet file", param_hint="INPUT"
        )
    if not Path(path).exists():
        raise click.BadParameter(f"{path!r} does not exist", param_hint="INPUT")
    # A read task reserves a whole CPU by default; with the engine and the CPU stages
    # holding theirs, a small machine would never schedule it (the job would wait forever).
    return readers[suffix](path, ray_remote_args={"num_cpus": MAP_NUM_CPUS})


@main.command()
@click.argument("model_uri")
@click.argument("input", metavar="INPUT")
@click.option(
    "--column",
    required=True,
    help="Column with the prompt (a string) or the chat messages (a list of {role, content}).",
)
@click.option(
    "--output",
    "output",
    required=True,
    type=click.Path(file_okay=False),
    help="Directory for the Parquet output (input columns kept, plus generated_text).",
)
@click.option("--max-tokens", type=click.IntRange(min=1), default=128, show_default=True)
@click.option("--temperature", type=click.FloatRange(min=0.0), default=0.0, show_default=True)
@click.option("--batch-size", type=click.IntRange(min=1), default=16, show_default=True)
@click.option(
    "--concurrency",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Number of vLLM engines.",
)
@click.option(
    "--engine-kwarg",
    "engine_kwargs",
    multiple=True,
    metavar="KEY=JSON",
    help="Extra vLLM engine argument, e.g. --engine-kwarg max_model_len=4096.",
)
@_store_options
@_one_line_errors
def run(
    model_uri: str,
    input: str,
    column: str,
    output: str,
    max_tokens: int,
    temperature: float,
    batch_size: int,
    concurrency: int,
    engine_kwargs: tuple[str, ...],
    endpoint_url: str | None,
    region: str | None,
    anonymous: bool,
) -> None:
    """Answer every row of INPUT with the model at MODEL_URI, streamed from object storage.

    Example: ray-stream-llm run s3://models/SmolLM2/ questions.jsonl --column question --output out/
    """
    import ray

    from ray_stream_llm import StreamingvLLMEngineProcessorConfig, build_llm_processor

    kwargs: dict[str, Any] = {"load_format": "runai_streamer"}
    for item in engine_kwargs:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{item!r}: write KEY=VALUE", param_hint="--engine-kwarg")
        try:
            kwargs[key] = json.loads(value)
        except ValueError:
            kwargs[key] = value
    start = time.perf_counter()
    config = StreamingvLLMEngineProcessorConfig(
        model_source=model_uri,
        engine_kwargs=kwargs,
        batch_size=batch_size,
        concurrency=concurrency,
        object_store=_store(endpoint_url, region, anonymous),
    )
    ds = _read_input(input)
    if column not in ds.columns():
        raise click.BadParameter(
            f"no column {column!r} in {input!r}; columns: {ds.columns()}", param_hint="--column"
        )

    def preprocess(row: dict[str, Any]) -> dict[str, Any]:
        value = row[column]
        messages = [{"role": "user", "content": value}] if isinstance(value, str) else list(value)
        return {
            "messages": messages,
            "__input": dict(row),
            "sampling_params": {"temperature": temperature, "max_tokens": max_tokens},
        }

    def postprocess(row: dict[str, Any]) -> dict[str, Any]:
        return {
            **row["__input"],
            "generated_text": row["generated_text"],
            "num_generated_tokens": int(row.get("num_generated_tokens") or 0),
            "num_input_tokens": int(row.get("num_input_tokens") or 0),
        }

    processor = build_llm_processor(config, preprocess=preprocess, postprocess=postprocess)
    rows_in = ds.count()
    out = processor(ds).materialize()
    out.write_parquet(output)
    rows = out.count()
    generated = out.sum("num_generated_tokens") if rows else 0
    seconds = time.perf_counter() - start
    click.echo(
        f"rows: {rows}/{rows_in}  generated tokens: {generated}  seconds: {seconds:.1f}  "
        f"output: {output}"
    )
    from ray_stream_llm import load_reports

    for k, report in enumerate(load_reports(), 1):
        click.echo(f"engine {k}: {report.log_line()}")
    ray.shutdown()
    if rows != rows_in:
        raise click.ClickException(f"{rows_in - rows} row(s) missing from the output")


@main.command()
@click.option(
    "--workdir",
    type=click.Path(file_okay=False),
    default=None,
    help="Keep the server data, Ray logs and caches here "
    "(default: a temporary directory, removed).",
)
def demo(workdir: str | None) -> None:
    """Run the demo: a local S3 server, SmolLM2 published into it, a streamed Ray Data job.

    Example: ray-stream-llm demo
    """
    from ray_stream_llm.tools.demo import run_demo

    sys.exit(run_demo(workdir))


@main.command()
@click.option(
    "--repeat",
    type=click.IntRange(min=1),
    default=3,
    show_default=True,
    help="Runs of each benchmark; the table shows min, median and max.",
)
@click.option(
    "--workdir",
    type=click.Path(file_okay=False),
    default=None,
    help="Where the S3 server and the jobs keep their files (default: a temporary "
    "directory, removed afterwards).",
)
@click.option(
    "--json",
    "json_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Also write the results (perf_metrics, every run) to this JSON file.",
)
@click.option(
    "--layers",
    type=click.IntRange(min=1),
    default=None,
    hidden=True,
    help="Decoder layers of the generated model (default 14: about 1 GiB); for smoke tests.",
)
@_one_line_errors
def bench(repeat: int, workdir: str | None, json_path: str | None, layers: int | None) -> None:
    """Benchmark on this machine: cold start streamed vs downloaded, streaming vs the store's
    ceiling, metadata fetch of 1/10/100-shard models; prints a table.

    Uses a local S3 server and a generated random-weight model of about 1 GiB
    (cached). Takes a few minutes per run on 2 CPUs.

    Example: ray-stream-llm bench --repeat 3 --json bench.json
    """
    import tempfile

    from ray_stream_llm.tools.bench import (
        check_thresholds,
        format_table,
        run_cpu_benchmarks,
        write_json,
    )

    root = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="rsl-bench-", dir="/tmp"))
    try:
        result = run_cpu_benchmarks(
            root, repeat=repeat, layers=layers, progress=lambda m: click.echo(m, err=True)
        )
    finally:
        if workdir is None:
            shutil.rmtree(root, ignore_errors=True)
    click.echo(format_table(result))
    if json_path:
        click.echo(f"results: {write_json(result, json_path)}")
    failures = check_thresholds(result)
    if failures:
        raise click.ClickException("thresholds missed: " + "; ".join(failures))


if __name__ == "__main__":
    main()
