"""The region's weight phase beside its limit: one process copying the same bytes.

``ray-stream-llm bench --suite copy``: each run, in fresh processes,

- ``region``: one engine job (a fresh Ray cluster and HOME, ``weight_sharing="auto"``: the
  engine streams from the node's region) and its load report's weight phase;
- ``copy``: a fresh Python process on the same node that maps the model's safetensors
  files from a tmpfs (the same bytes, the same memory as a region) and copies each
  tensor's bytes into fresh memory (``torch.empty`` then ``copy_``), timed from the
  first open to the last copy. No streamer, no vLLM: what moving the bytes once costs.

The ratio is the engine's weight phase (less the seconds it waited for the node's pull)
over the copy's seconds: how far the region's path is from a plain copy on this machine.
Every figure is measured on the machine the benchmark runs on; each run records where.
"""

from __future__ import annotations

import json
import mmap
import os
import platform
import shutil
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ray_stream_llm.tools.bench_job import MAX_TOKENS, PROMPTS, SAMPLING, run_isolated_job

COPY_FIGURES = (
    ("weight_seconds", "s", "LATENCY"),
    ("weight_wait_seconds", "s", "LATENCY"),
    ("copy_seconds", "s", "LATENCY"),
    ("copy_gib_per_s", "GiB/s", "THROUGHPUT"),
    ("weight_over_copy", "x", "LATENCY"),
)


def copy_files(paths: list[str]) -> dict[str, Any]:
    """In this process: every tensor of ``paths`` (safetensors files) copied from a map of
    its file into fresh memory; the seconds, the bytes and the tensors copied."""
    import torch

    start = time.perf_counter()
    copied = tensors = 0
    kept = []  # the copies live until the end, as loaded weights do
    for path in paths:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            (header_len,) = struct.unpack("<Q", mm[:8])
            header = json.loads(mm[8 : 8 + header_len])
            base = 8 + header_len
            source = torch.frombuffer(memoryview(mm), dtype=torch.uint8)
            for name, info in header.items():
                if name == "__metadata__":
                    continue
                begin, end = info["data_offsets"]
                target = torch.empty(end - begin, dtype=torch.uint8)
                target.copy_(source[base + begin : base + end])
                kept.append(target)
                copied += end - begin
                tensors += 1
            del source  # the map closes only once no tensor views it
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "bytes": copied, "tensors": tensors}


def copy_in_fresh_process(files: list[Path], tmpfs: Path) -> dict[str, Any]:
    """:func:`copy_files` in a fresh Python process, from copies of ``files`` on ``tmpfs``
    (placed there first, untimed; removed after)."""
    staged = tmpfs / f"rsl-bench-copy-{os.getpid()}-{time.monotonic_ns()}"
    staged.mkdir(parents=True)
    try:
        placed = [str(shutil.copyfile(f, staged / f.name)) for f in files]
        proc = subprocess.run(
            [sys.executable, "-m", "ray_stream_llm.tools.bench_copy", *placed],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
    finally:
        shutil.rmtree(staged, ignore_errors=True)
    if proc.returncode != 0:
        raise RuntimeError(f"the copy process failed: {proc.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def where() -> str:
    """Where a run was measured: the machine's name and CPU count."""
    return f"measured on {platform.node()}, {os.cpu_count()} CPUs"


def region_and_copy(
    model_uri: str,
    model_dir: Path,
    store_env: dict[str, str],
    workdir: Path,
    *,
    num_cpus: int | None = None,
    tmpfs: Path = Path("/dev/shm"),
    progress: Callable[[str], None] = print,
) -> dict[str, Any]:
    """One run: the engine's weight phase from the node's region, then the copy."""
    progress("  copy: one engine streaming from the node's region ...")
    report = engine_job(model_uri, store_env, workdir / "copy-region", "auto", num_cpus=num_cpus)
    progress("  copy: one process copying the same bytes from a tmpfs ...")
    files = sorted(model_dir.glob("*.safetensors"))
    copied = copy_in_fresh_process(files, tmpfs)
    return figures(report, copied)


def engine_job(
    model_uri: str,
    store_env: dict[str, str],
    workdir: Path,
    sharing: str,
    *,
    num_cpus: int | None = None,
    prompts: int = len(PROMPTS),
    timeout: float = 900,
) -> dict[str, Any]:
    """One engine job (``enforce_eager``, one engine, ``weight_sharing=sharing``, the first
    ``prompts`` prompts) in a fresh Ray cluster and HOME; its engine's load report."""
    spec = {
        "model": model_uri,
        "prompts": list(PROMPTS[:prompts]),
        "load_format": "runai_streamer",
        "max_tokens": MAX_TOKENS,
        "num_cpus": num_cpus,
        "sampling": SAMPLING,
        "engine_kwargs": {"enforce_eager": True},
        "config": {"weight_sharing": sharing, "concurrency": [1, 1]},
    }
    out = run_isolated_job(workdir, spec, store_env, timeout=timeout)
    [report] = out["load_reports"]
    return dict(report)


def weight_seconds(report: dict[str, Any]) -> float:
    """An engine's weight phase from its load report: its streaming seconds less those it
    waited for the node's pull."""
    return float(report["stream_seconds"]) - float(report.get("weight_wait_seconds") or 0.0)


def figures(report: dict[str, Any], copied: dict[str, Any]) -> dict[str, Any]:
    """The run's figures from the engine's load report and the copy's result."""
    if report.get("weight_sharing") != "node":
        raise RuntimeError(
            f"the engine did not stream from the node's region: weight_sharing "
            f"{report.get('weight_sharing')!r}"
        )
    waited = float(report.get("weight_wait_seconds") or 0.0)
    weight = weight_seconds(report)
    return {
        "weight_seconds": weight,
        "weight_wait_seconds": waited,
        "weight_bytes": report.get("streamed_tensor_bytes") or report.get("weight_bytes"),
        "copy_seconds": copied["seconds"],
        "copy_bytes": copied["bytes"],
        "copy_gib_per_s": copied["bytes"] / 2**30 / copied["seconds"],
        "weight_over_copy": weight / copied["seconds"],
        "where": where(),
    }


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(
            "usage: python -m ray_stream_llm.tools.bench_copy FILE.safetensors ... "
            "(internal; run benchmarks with `ray-stream-llm bench --suite copy`)"
        )
    print(json.dumps(copy_files(sys.argv[1:])))
