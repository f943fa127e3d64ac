"""One benchmark job, cold: a Ray Data job over the benchmark prompts in a subprocess whose
HOME, TMPDIR, caches and Ray session live in one work directory
(:mod:`ray_stream_llm.tools.isolated`), with its figures and the local-disk bytes it
wrote. Every benchmark runs its jobs here (cold start, node sharing, warm starts, and
tensor parallelism side by side).
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ray_stream_llm.tools.isolated import run_isolated, tree_bytes

if TYPE_CHECKING:
    from ray_stream_llm.tools.job import JobResult

PROMPTS = [f"Write item {i} of a list of facts about object storage." for i in range(8)]
MAX_TOKENS = 16
SAMPLING = {"ignore_eos": True}  # with temperature 0 and MAX_TOKENS: every row the same length


def run_isolated_job(
    work: Path, spec: dict[str, Any], env: dict[str, str], timeout: float = 900
) -> dict[str, Any]:
    """Run one Ray Data job (``python -m ray_stream_llm.tools.bench_job``) in a subprocess
    whose HOME, TMPDIR, caches and Ray session live under ``work``: a cold start here."""
    work.mkdir(parents=True, exist_ok=True)
    # Ray's socket paths must stay under 107 bytes: its session lives in a short directory.
    ray_dir = tempfile.mkdtemp(prefix="rsl-ray-", dir="/tmp")
    argv = [
        sys.executable,
        "-m",
        "ray_stream_llm.tools.bench_job",
        str(work / "spec.json"),
        str(work / "out.json"),
    ]
    try:
        (work / "spec.json").write_text(json.dumps({**spec, "ray_temp_dir": ray_dir}))
        proc = run_isolated(argv, work, {"RAY_STREAM_LLM_PROGRESS": "0", **env}, timeout=timeout)
    finally:
        shutil.rmtree(ray_dir, ignore_errors=True)
    if proc.returncode != 0:
        raise RuntimeError(
            f"benchmark job failed (exit {proc.returncode}); its log: {work / 'job.log'}\n"
            + (proc.stdout + proc.stderr)[-3000:]
        )
    out: dict[str, Any] = json.loads((work / "out.json").read_text())
    out["disk_bytes_written"] = tree_bytes(work / "home") + tree_bytes(work / "tmp")
    out["disk_weight_files"] = sorted(  # weight files the job left on local disk
        str(p.relative_to(work))
        for p in work.rglob("*")
        if p.is_file() and p.name.endswith((".safetensors", ".bin", ".pt", ".pth"))
    )
    return out


def run_spec(spec_path: str) -> JobResult:
    """The job of a benchmark's spec file (every prompt in, every row out), Ray shut down
    after it; its :class:`ray_stream_llm.tools.job.JobResult`."""
    import ray

    spec = json.loads(Path(spec_path).read_text())
    cluster = None
    if spec.get("nodes"):  # several Ray nodes on this machine (tools/bench_cluster.py)
        from ray_stream_llm.tools.job import local_cluster

        cluster = local_cluster(spec["nodes"], spec["ray_temp_dir"])
    elif spec.get("address"):  # a running cluster (the release tests' GPU nodes)
        ray.init(address=spec["address"], log_to_driver=True)
    try:
        result = _run(spec)
    finally:
        ray.shutdown()
        if cluster is not None:
            cluster.shutdown()
    return result


def _run(spec: dict[str, Any]) -> JobResult:
    from ray_stream_llm.tools.job import run_job

    return run_job(
        spec["model"],
        spec["prompts"],
        load_format=spec["load_format"],
        max_tokens=spec["max_tokens"],
        ray_temp_dir=spec["ray_temp_dir"],
        num_cpus=spec.get("num_cpus"),
        engine_kwargs=spec.get("engine_kwargs"),
        sampling=spec.get("sampling"),
        config_kwargs=spec.get("config"),
    )


def _job_main(spec_path: str, out_path: str) -> None:
    """The job a benchmark runs: every prompt in, every row out."""
    result = run_spec(spec_path)
    reports = [r.to_dict() for r in result.load_reports]
    Path(out_path).write_text(
        json.dumps(
            {
                "rows": len(result.rows),
                "answers": {str(r["question"]): r["answer"] for r in result.rows},
                "generated_tokens": sum(
                    int(r.get("num_generated_tokens") or 0) for r in result.rows
                ),
                "build_seconds": result.build_seconds,
                "first_row_seconds": result.first_row_seconds,
                "total_seconds": result.total_seconds,
                "load_reports": reports,
            }
        )
    )


if __name__ == "__main__":  # vLLM spawns processes: the guard is required
    if len(sys.argv) == 3:
        _job_main(sys.argv[1], sys.argv[2])
    else:
        sys.exit(
            "usage: python -m ray_stream_llm.tools.bench_job SPEC_JSON OUT_JSON "
            "(internal; run benchmarks with `ray-stream-llm bench`)"
        )
