"""The ``ray-stream-llm`` console script: inspect, shard, fetch-metadata, run, doctor,
local-store, demo, bench."""

from __future__ import annotations

import functools
import json
import shutil
import sys
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
    import os

    # stdout is the commands' result (--json, the answers): vLLM, which logs to stdout by
    # default (and is imported by ray.data.llm on Ray 2.54), logs to stderr beside Ray
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")


@main.command()
@click.argument("uri")
@click.option("--json", "as_json", is_flag=True, help="Print the manifest as JSON.")
@click.option(
    "--tensor-parallel-size",
    type=int,
    default=None,
    help="Check pre-sharded (runai_streamer_sharded) files for this many ranks.",
)
@click.option(
    "--shard-pattern",
    default=None,
    help="The pre-sharded files' names, as the engines' model_loader_extra_config "
    "'pattern' (default: vLLM's model-rank-{rank}-part-{part}.safetensors).",
)
@_store_options
@_one_line_errors
def inspect(
    uri: str,
    as_json: bool,
    tensor_parallel_size: int | None,
    shard_pattern: str | None,
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
        shard_pattern=shard_pattern,
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


@main.command()
@click.argument("model_uri")
@click.option(
    "--tensor-parallel-size",
    type=click.IntRange(min=1),
    required=True,
    help="Ranks to shard for: the engines' tensor_parallel_size.",
)
@click.option("--output", required=True, help="s3:// prefix of the sharded checkpoint.")
@click.option(
    "--max-part-bytes",
    type=click.IntRange(min=1),
    default=None,
    help="Split each rank's state into files of at most this many bytes (default: one).",
)
@click.option(
    "--stage-dir",
    default="/dev/shm",
    show_default=True,
    help="Memory-backed directory the ranks save into before the upload (tmpfs only).",
)
@click.option(
    "--engine-kwargs",
    default=None,
    help='JSON object of extra vLLM engine arguments, e.g. \'{"dtype": "bfloat16"}\'.',
)
@click.option("--json", "as_json", is_flag=True, help="Print what was done as JSON.")
@_store_options
@_one_line_errors
def shard(
    model_uri: str,
    tensor_parallel_size: int,
    output: str,
    max_part_bytes: int | None,
    stage_dir: str,
    engine_kwargs: str | None,
    as_json: bool,
    endpoint_url: str | None,
    region: str | None,
    anonymous: bool,
) -> None:
    """Write MODEL_URI to --output as a pre-sharded checkpoint for runai_streamer_sharded.

    Loads the model with vLLM at --tensor-parallel-size (streamed from the store), saves
    each rank's state in --stage-dir and uploads it with the model's metadata; a
    completion marker is written last. Running it again finishes a partial output.

    Example: ray-stream-llm shard s3://models/llama-70b/ --tensor-parallel-size 8 --output s3://models/llama-70b-tp8/
    """
    from ray_stream_llm.commands.shard import shard_model
    from ray_stream_llm.errors import InvalidSettingError

    extra = None
    if engine_kwargs:
        try:
            extra = json.loads(engine_kwargs)
        except ValueError as exc:
            raise InvalidSettingError(
                f"--engine-kwargs is not JSON ({exc}): {engine_kwargs!r}"
            ) from None
        if not isinstance(extra, dict):
            raise InvalidSettingError(f"--engine-kwargs must be a JSON object: {engine_kwargs!r}")
    result = shard_model(
        model_uri,
        tensor_parallel_size,
        output,
        object_store=_store(endpoint_url, region, anonymous),
        engine_kwargs=extra,
        max_part_bytes=max_part_bytes,
        stage_dir=stage_dir,
        log=lambda msg: click.echo(msg, err=True),
    )
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=2))
        return
    for rank, size in sorted(result.rank_bytes().items()):
        click.echo(f"rank {rank}: {_size(size)}")
    state = "already complete" if result.already_complete else f"{len(result.uploaded)} sent"
    click.echo(
        f"{result.output}: {len(result.files)} rank file(s), {_size(result.weight_bytes)}, "
        f"{len(result.metadata)} metadata file(s); {state}; {result.total_seconds:.1f}s"
    )


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


@main.command()
@click.argument("model_uri")
@click.argument("input", metavar="INPUT", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--column",
    required=True,
    help="Column with the prompt (a string) or the chat messages (a list of {role, content}).",
)
@click.option(
    "--output",
    "output",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Directory for answers.parquet (the input columns, plus generated_text).",
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
@click.option("--verbose", is_flag=True, help="Show Ray's and vLLM's logs and Ray Data's bars.")
@click.option(
    "--resume",
    metavar="LOCATION",
    default=None,
    help="Make the job resumable: each batch of answers is recorded in LOCATION (a directory "
    "every run can reach, or an s3:// prefix in the model's store) as it comes; run the same "
    "command again after a failure and only the rows not recorded there are answered. Rows are "
    "keyed by the input's 'id' column (unique values), or, when it has none, by their position "
    "in the file: then do not change the file between runs.",
)
@_store_options
@_one_line_errors
def run(
    model_uri: str,
    input: Path,
    column: str,
    output: Path,
    max_tokens: int,
    temperature: float,
    batch_size: int,
    concurrency: int,
    engine_kwargs: tuple[str, ...],
    verbose: bool,
    resume: str | None,
    endpoint_url: str | None,
    region: str | None,
    anonymous: bool,
) -> None:
    """Answer every row of INPUT with the model at MODEL_URI, streamed from object storage.

    The input, the column and the model are checked before Ray starts.

    Example: ray-stream-llm run s3://models/SmolLM2/ questions.jsonl --column question --output out/
    """
    from tqdm import tqdm

    from ray_stream_llm.commands.batch import InputError, parse_engine_kwargs, run_batch

    bar: tqdm[Any] | None = None

    def progress(done: int, total: int, tokens: int) -> None:
        nonlocal bar
        if bar is None:
            bar = tqdm(total=total, unit="row", desc="Answering", mininterval=0.5)
        bar.n = done
        bar.set_postfix_str(f"{tokens / max(bar.format_dict['elapsed'], 1e-9):.1f} tok/s")
        bar.refresh()

    try:
        result = run_batch(
            model_uri,
            input,
            column,
            output,
            sampling={"temperature": temperature, "max_tokens": max_tokens},
            engine_kwargs=parse_engine_kwargs(engine_kwargs),
            batch_size=batch_size,
            concurrency=concurrency,
            object_store=_store(endpoint_url, region, anonymous),
            verbose=verbose,
            progress=progress,
            resume=resume,
        )
    except InputError as exc:
        raise click.UsageError(str(exc)) from None
    finally:
        if bar is not None:
            bar.close()
    click.echo(
        f"rows: {result.rows_out}/{result.rows_in}  generated tokens: {result.generated_tokens}"
        f"  seconds: {result.seconds:.1f}  output: {result.output}"
    )
    if resume is not None:
        click.echo(
            f"resumed: {result.rows_resumed} row(s) recorded in {resume} before this run, "
            f"{result.rows_out - result.rows_resumed} answered now"
        )
    for k, line in enumerate(result.load_lines, 1):
        click.echo(f"engine {k}: {line}")
    if result.rows_out != result.rows_in:
        raise click.ClickException(
            f"{result.rows_in - result.rows_out} row(s) missing from the output"
        )


@main.command()
@click.argument("model_uri", required=False)
@click.option(
    "--address",
    default=None,
    help="The Ray cluster (default: RAY_ADDRESS, else the running one, else a local one "
    "started and stopped here; 'local' always starts one).",
)
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(min=1.0),
    default=60.0,
    show_default=True,
    help="Seconds every node has to answer (a node that does not is flagged).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the rows and problems as JSON.")
@_store_options
@_one_line_errors
def doctor(
    model_uri: str | None,
    address: str | None,
    timeout_s: float,
    as_json: bool,
    endpoint_url: str | None,
    region: str | None,
    anonymous: bool,
) -> None:
    """One row per node of the Ray cluster: Ray, vLLM (CPU or CUDA build), torch, streamer
    and library versions, the vLLM plugin active or why not, /dev/shm free, the memory limit
    that binds, the CPU instruction set and GPUs; with MODEL_URI, whether each node's region
    of the weights fits and a 1 MiB read from the store (MB/s). Problems are listed with their
    fix; exit status 1 when there is one.

    Example: ray-stream-llm doctor s3://models/SmolLM2-135M-Instruct/ --address 127.0.0.1:6379
    """
    from ray_stream_llm.commands.doctor import run_doctor

    report = run_doctor(
        model_uri,
        object_store=_store(endpoint_url, region, anonymous),
        address=address,
        timeout_s=timeout_s,
    )
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2))
    else:
        for line in report.table():
            click.echo(line)
        state = f"{len(report.problems)} problem(s)" if report.problems else "no problem"
        click.echo(f"{len(report.rows)} node(s), {state}, {report.seconds:.1f}s")
    if report.problems:
        sys.exit(1)


@main.command("local-store")
@click.option(
    "--model",
    "model_dir",
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    default=None,
    help="A local model directory to publish (default: the demo model, SmolLM2-135M-Instruct).",
)
@click.option("--uri", default=None, help="Where to publish it (default: s3://models/<dir name>/).")
@click.option(
    "--port",
    type=click.IntRange(1, 65535),
    default=8333,
    show_default=True,
    help="S3 port on 127.0.0.1.",
)
@_one_line_errors
def local_store(model_dir: Path | None, uri: str | None, port: int) -> None:
    """Start an S3 store on 127.0.0.1 with a model in it, print how to use it; Ctrl-C stops it.

    Example: ray-stream-llm local-store   (then, in another shell: source the printed env.sh)
    """
    from ray_stream_llm.tools.store_command import serve

    if uri is not None:
        from ray_stream_llm.uri import parse_model_uri

        if not uri.startswith("s3://"):
            raise click.BadParameter(f"{uri!r}: the local store speaks S3: give s3://bucket/path/")
        uri = str(parse_model_uri(uri))
    try:
        sys.exit(serve(model_dir, uri, port=port, say=lambda m: click.echo(m, err=False)))
    except (FileNotFoundError, OSError) as exc:
        raise click.ClickException(str(exc)) from None


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
    "--plot",
    "plot_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Also draw where the seconds of each path's cold start go into this PNG file.",
)
@click.option(
    "--suite",
    type=click.Choice(["cold-start", "sharing", "warm", "cluster", "copy", "all", "scale"]),
    default="cold-start",
    show_default=True,
    help="cold-start: streamed vs downloaded, streamer vs ceiling, metadata fetch; sharing: "
    "plain streaming, Ray's download path and node sharing with 1 and 2 engines behind a "
    "100 MiB/s link; warm: vLLM's default (compiling) start cold, on a warm node and on a "
    "fresh node with the compile cache shipped through the store, 1 and 2 engines; "
    "cluster: three Ray nodes pulling per node vs filling from each other (peers), one "
    "engine and TP=2 from the store vs the node's region, behind one 100 MiB/s link; "
    "copy: one engine's weight phase from the node's region beside one fresh process "
    "copying the same bytes from a tmpfs into fresh memory, and their ratio; scale (not in "
    "all): models of 0.5 to 8 GiB and the 2 GiB model in 1, 8 and 32 files, each phase's "
    "seconds and GiB/s (tools/bench_scale.py).",
)
@click.option(
    "--layers",
    type=click.IntRange(min=1),
    default=None,
    hidden=True,
    help="Decoder layers of the generated model (default 14: about 1 GiB); for smoke tests.",
)
@_one_line_errors
def bench(
    repeat: int,
    workdir: str | None,
    json_path: str | None,
    plot_path: str | None,
    suite: str,
    layers: int | None,
) -> None:
    """Benchmark on this machine: cold start streamed vs downloaded, streaming vs the store's
    ceiling, metadata fetch of 1/10/100-shard models (--suite cold-start); node sharing
    with 1 and 2 engines behind a capped link (--suite sharing); warm starts (--suite
    warm); where each engine's weights come from on three nodes, one engine and TP=2
    (--suite cluster); the region's weight phase beside a plain copy of the same bytes
    (--suite copy); prints a table.

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
    if suite == "scale":
        _bench_scale(root, repeat, json_path, cleanup=workdir is None)
        return
    try:
        every = ("cold-start", "sharing", "warm", "cluster", "copy")
        suites = every if suite == "all" else (suite,)
        result = run_cpu_benchmarks(
            root,
            repeat=repeat,
            layers=layers,
            progress=lambda m: click.echo(m, err=True),
            suites=suites,
        )
    finally:
        if workdir is None:
            shutil.rmtree(root, ignore_errors=True)
    click.echo(format_table(result))
    if json_path:
        click.echo(f"results: {write_json(result, json_path)}")
    if plot_path:
        from ray_stream_llm.tools.plot import plot

        click.echo(f"plot: {plot(result.runs, plot_path)}")
    failures = check_thresholds(result)
    if failures:
        raise click.ClickException("thresholds missed: " + "; ".join(failures))


def _bench_scale(root: Path, repeat: int, json_path: str | None, *, cleanup: bool) -> None:
    """``bench --suite scale``: its table, and its runs as JSON."""
    import json

    from ray_stream_llm.tools.bench_scale import format_scale, run_scale, summary

    try:
        runs = run_scale(root, repeat=repeat, progress=lambda m: click.echo(m, err=True))
    finally:
        if cleanup:
            shutil.rmtree(root, ignore_errors=True)
    click.echo(format_scale(runs))
    if json_path:
        Path(json_path).write_text(json.dumps({"runs": runs, "summary": summary(runs)}, indent=1))
        click.echo(f"results: {json_path}")


if __name__ == "__main__":
    main()
