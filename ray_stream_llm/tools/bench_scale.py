"""What a start costs as the model grows: ``ray-stream-llm bench --suite scale``.

Random-weight Llama-shaped models (:func:`~ray_stream_llm.tools.bench.generate_model`, the
layer count scaled) of about 0.5, 2, 4 and 8 GiB, and the 2 GiB model as 1, 8 and 32
files, in a local S3 server (SeaweedFS). For each, ``repeat`` runs, each phase in a fresh
process or directory:

- ``metadata_seconds``, ``preflight_seconds``: the metadata fetch and ``inspect_model``
  (which reads every file's header) on a cold directory;
- ``pull_seconds``, ``pull_gib_per_s``: the node's one pull into a region under
  ``/dev/shm`` (:class:`~ray_stream_llm.weights.region.NodeWeights` in a fresh process,
  outside Ray: the same pull the node's agent runs), from the acquire to the last file
  whole; its MD5 check of single-part objects included; ``store_gets_x_ranges``: the
  server's ranged GETs over the ranges of the model (1.0: each byte once, from its access
  log); ``pull_peak_rss_bytes``: that process's peak resident memory;
  ``shm_peak_bytes``: ``/dev/shm``'s peak use over its baseline while it ran;
- ``md5_seconds``: one pass of MD5 over the same bytes in one process (what the pull's
  check costs alone);
- ``copy_gib_per_s``: one fresh process copying the same bytes from a tmpfs into fresh
  memory (``bench_copy``: the node's copy limit);
- ``region_weight_gib_per_s``, ``store_weight_gib_per_s`` (the models :data:`MODELS`
  marks): one engine job's weight phase (vLLM's CPU build,
  ``enforce_eager``) from the node's region (less its wait for the pull) and straight from
  the store.

The figures are medians over the runs with their spread (min-max) per model; every run
records where it was measured.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ray_stream_llm.tools.bench_copy import (
    copy_in_fresh_process,
    engine_job,
    weight_seconds,
    where,
)

# label -> (decoder layers of bench.BENCH_MODEL_CONFIG's shape, files, whether the engine
# phases run); about 50 MB a layer and 0.3 GB of embeddings. The engine phases (two engine
# jobs a run, a minute or more each on 2 CPUs) run for the smallest model and the two ends
# of the file layouts.
MODELS: dict[str, tuple[int, int, bool]] = {
    "0.5GiB/4": (5, 4, True),
    "2GiB/1": (37, 1, True),
    "2GiB/8": (37, 8, False),
    "2GiB/32": (37, 32, True),
    "4GiB/8": (79, 8, False),
    "8GiB/16": (165, 16, False),
}
FIGURES = (
    ("metadata_seconds", "s"),
    ("preflight_seconds", "s"),
    ("pull_seconds", "s"),
    ("pull_gib_per_s", "GiB/s"),
    ("store_gets_x_ranges", "x"),
    ("md5_gib_per_s", "GiB/s"),
    ("copy_gib_per_s", "GiB/s"),
    ("region_weight_gib_per_s", "GiB/s"),
    ("store_weight_gib_per_s", "GiB/s"),
    ("pull_peak_rss_bytes", "B"),
    ("shm_peak_bytes", "B"),
)

_PULL = """
import json, sys, time
from ray_stream_llm.fetch import fetch_metadata_report
from ray_stream_llm.uri import parse_model_uri
from ray_stream_llm.weights.pull import finished_pull
from ray_stream_llm.weights.reading import wait_for
from ray_stream_llm.weights.region import NodeWeights, Sharing

uri, base, meta = sys.argv[1:4]
report = fetch_metadata_report(uri, meta)
started = time.perf_counter()
held = NodeWeights(parse_model_uri(uri), report.weight_objects, Sharing("node", base=base))
region = held.acquire()
if region is None:
    sys.exit(f"no region: {held.reason}")
for obj in report.weight_objects:
    wait_for(region, obj.path, timeout=3600)
seconds = time.perf_counter() - started
record = finished_pull(region)
# this process's own peak (VmHWM: ru_maxrss would hold the parent's, kept across exec)
[hwm] = [line for line in open("/proc/self/status") if line.startswith("VmHWM:")]
rss = int(hwm.split()[1]) * 1024
held.release()
print(json.dumps({"seconds": seconds, "bytes": record.bytes if record else None, "rss": rss}))
"""


@contextlib.contextmanager
def _shm_peak(path: str = "/dev/shm") -> Iterator[dict[str, int]]:
    """``peak``: the most ``path`` held over its use at the start, sampled every 50 ms
    while the block runs."""
    base = shutil.disk_usage(path).used
    seen = {"peak": 0}
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.05):
            seen["peak"] = max(seen["peak"], shutil.disk_usage(path).used - base)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        done.set()
        thread.join()


def pull(uri: str, env: dict[str, str], workdir: Path) -> dict[str, Any]:
    """The node's pull of ``uri`` into a fresh region, in a fresh process."""
    base = Path(tempfile.mkdtemp(prefix="rsl-scale-", dir="/dev/shm"))
    meta = Path(tempfile.mkdtemp(prefix="meta-", dir=workdir))
    try:
        with _shm_peak() as shm:
            proc = subprocess.run(
                [sys.executable, "-c", _PULL, uri, str(base), str(meta / "m")],
                capture_output=True,
                text=True,
                timeout=3600,
                env={**os.environ, **env},
                check=False,
            )
    finally:
        shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(meta, ignore_errors=True)
    if proc.returncode != 0:
        raise RuntimeError(f"the pull failed: {proc.stderr[-2000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    return {"seconds": out["seconds"], "bytes": out["bytes"], "rss": out["rss"], **shm}


def metadata_and_preflight(uri: str, workdir: Path) -> tuple[float, float]:
    """Seconds of a cold metadata fetch and of ``inspect_model`` on what it fetched."""
    from ray_stream_llm.env import scoped
    from ray_stream_llm.fetch import fetch_metadata_report
    from ray_stream_llm.integrations.ray.progress import PROGRESS_ENV
    from ray_stream_llm.manifest import inspect_model

    dest = Path(tempfile.mkdtemp(prefix="meta-", dir=workdir))
    try:
        with scoped({PROGRESS_ENV: "0"}):
            report = fetch_metadata_report(uri, dest / "m")
            started = time.perf_counter()
            inspect_model(uri, metadata_dir=report.path).raise_if_not_streamable()
            return report.seconds, time.perf_counter() - started
    finally:
        shutil.rmtree(dest, ignore_errors=True)


def md5_seconds(files: list[Path]) -> float:
    """One pass of MD5 over ``files``, as the pull checks a single-part object."""
    started = time.perf_counter()
    for path in files:
        digest = hashlib.md5(usedforsecurity=False)
        with open(path, "rb") as f:
            while chunk := f.read(8 << 20):
                digest.update(chunk)
    return time.perf_counter() - started


def engine_weight_seconds(uri: str, env: dict[str, str], workdir: Path, sharing: str) -> float:
    """One engine job's weight phase (``enforce_eager``): from the node's region
    (``sharing="auto"``, less its wait for the pull) or the store (``"off"``)."""
    report = engine_job(uri, env, workdir, sharing, prompts=2, timeout=1800)
    if (report.get("weight_sharing") == "node") != (sharing == "auto"):
        raise RuntimeError(f"the engine's weights did not come from where asked: {report}")
    return weight_seconds(report)


def one_run(
    label: str,
    uri: str,
    model_dir: Path,
    env: dict[str, str],
    server: Any,
    workdir: Path,
    progress: Callable[[str], None],
    engines: bool = True,
) -> dict[str, Any]:
    """Every phase of ``label`` once (the engine phases with ``engines``)."""
    from ray_stream_llm.weights.pull import CHUNK

    files = sorted(model_dir.glob("*.safetensors"))
    size = sum(p.stat().st_size for p in files)
    gib = size / 2**30
    run: dict[str, Any] = {"model": label, "weight_bytes": size, "files": len(files)}
    progress(f"  {label}: metadata and preflight ...")
    run["metadata_seconds"], run["preflight_seconds"] = metadata_and_preflight(uri, workdir)
    progress(f"  {label}: the node's pull ...")
    before = len(server.served())
    pulled = pull(uri, env, workdir)
    gets = [
        r
        for r in server.served()[before:]
        if r.method == "GET" and r.status in (200, 206) and r.key.endswith(".safetensors")
    ]
    ranges = sum(math.ceil(p.stat().st_size / CHUNK) for p in files)
    run.update(
        pull_seconds=pulled["seconds"],
        pull_gib_per_s=gib / pulled["seconds"],
        store_gets_x_ranges=len(gets) / ranges,
        pull_peak_rss_bytes=pulled["rss"],
        shm_peak_bytes=pulled["peak"],
    )
    progress(f"  {label}: MD5 and one process's copy ...")
    run["md5_gib_per_s"] = gib / md5_seconds(files)
    copied = copy_in_fresh_process(files, Path("/dev/shm"))
    run["copy_gib_per_s"] = copied["bytes"] / 2**30 / copied["seconds"]
    if engines:
        for sharing, key in (("auto", "region"), ("off", "store")):
            progress(f"  {label}: one engine's weight phase from the {key} ...")
            seconds = engine_weight_seconds(uri, env, workdir / f"engine-{key}", sharing)
            run[f"{key}_weight_gib_per_s"] = gib / seconds
            shutil.rmtree(workdir / f"engine-{key}", ignore_errors=True)
    run["where"] = where()
    return run


def run_scale(
    workdir: Path,
    *,
    repeat: int = 3,
    models: tuple[str, ...] = tuple(MODELS),
    engines: bool = True,
    progress: Callable[[str], None] = print,
) -> list[dict[str, Any]]:
    """Every model of ``models``, ``repeat`` times (model by model); the runs. ``engines``:
    the engine phases where :data:`MODELS` marks them (else none)."""
    import psutil

    from ray_stream_llm.cache import cache_root
    from ray_stream_llm.env import scoped
    from ray_stream_llm.tools.bench import generate_model
    from ray_stream_llm.tools.localstore import LocalS3Server

    runs = []
    with LocalS3Server(workdir / "s3") as server, scoped(server.env()):
        for label in models:
            layers, files, marked = MODELS[label]
            model_dir = cache_root() / "bench" / f"scale-{layers}x{files}"
            progress(f"{label}: generating the model (cached after the first run) ...")
            generate_model(model_dir, shards=files, layers=layers)
            size = sum(p.stat().st_size for p in model_dir.glob("*.safetensors"))
            # the copy's staged files and its fresh memory at once, and the server's cache;
            # the model just written is flushed first (dirty pages are not available)
            os.sync()
            available = psutil.virtual_memory().available
            if 2.1 * size > available:
                progress(
                    f"{label}: skipped, 2.1 x {size / 2**30:.1f} GiB does not fit this node's "
                    f"{available / 2**30:.1f} GiB available"
                )
                continue
            uri = f"s3://bench/scale-{layers}x{files}/"
            server.upload_dir(model_dir, uri)
            for k in range(1, repeat + 1):
                progress(f"{label}: run {k}/{repeat}")
                runs.append(
                    one_run(
                        label,
                        uri,
                        model_dir,
                        server.env(),
                        server,
                        workdir,
                        progress,
                        engines and marked,
                    )
                )
    return runs


def summary(runs: list[dict[str, Any]]) -> dict[str, dict[str, list[float]]]:
    """Per model, per figure: [median, min, max] over its runs."""
    out: dict[str, dict[str, list[float]]] = {}
    for label in dict.fromkeys(r["model"] for r in runs):
        mine = [r for r in runs if r["model"] == label]
        out[label] = {}
        for name, _ in FIGURES:
            values = [float(r[name]) for r in mine if r.get(name) is not None]
            if values:
                out[label][name] = [statistics.median(values), min(values), max(values)]
    return out


def format_scale(runs: list[dict[str, Any]]) -> str:
    """The table: a row per figure, a column per model, median (min-max)."""
    table = summary(runs)
    labels = list(table)

    def cell(values: list[float] | None, unit: str) -> str:
        if not values:
            return "-"
        scale = 2**20 if unit == "B" else 1
        med, lo, hi = (v / scale for v in values)
        return f"{med:.2f} ({lo:.2f}-{hi:.2f})"

    head = ["figure", *labels]
    rows = [
        [
            f"{name} ({'MiB' if unit == 'B' else unit})",
            *(cell(table[m].get(name), unit) for m in labels),
        ]
        for name, unit in FIGURES
    ]
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
    lines = [
        "  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)) for r in [head, *rows]
    ]
    n = {m: sum(1 for r in runs if r["model"] == m) for m in labels}
    return "\n".join([*lines, f"runs per model: {n}; {runs[0]['where'] if runs else ''}"])
