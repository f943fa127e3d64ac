"""Jobs run as a user's script in an isolated environment
(:func:`ray_stream_llm.tools.isolated.isolated_env`: a fresh HOME and TMPDIR, plus the
machine's settings a user never sets), and what to measure around them: weight files
written, objects the server served, metrics scraped."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from helpers.janitors import segments_left
from helpers.models import is_weight
from helpers.waiting import wait_until
from ray_stream_llm.tools.isolated import run_isolated as run_in_isolation
from ray_stream_llm.tools.localstore import LocalS3Server

DRIVER = Path(__file__).with_name("e2e_driver.py")


def share_model_records(work: Path, records: Path) -> None:
    """``work/home`` (a job's fresh HOME) gets vLLM's model-class records ``records``
    (conftest's ``vllm_modelinfos``, shared by the session's jobs), as a job on a node
    where vLLM ran before has them: its engines skip the 7.6 s (CPU) inspection subprocess."""
    _link(work / "home" / ".cache" / "vllm" / "modelinfos", records)


COMPILED = Path(".cache", "vllm", "torch_compile_cache")  # under a HOME

# A job of the engine alone: Ray's CPU stages off (chat template, tokenize, detokenize), the
# question the engine's prompt as typed (tools/job.py). For the jobs whose proof is the
# engine's (its compile, a start that fails, the bytes it holds): each stage is an actor of
# its own (about 4 s of CPU here: Ray's stage modules import torch and transformers), and Ray
# Data starts them one after another around the engine's. The stages' part (the metadata
# fetched in them, the node's pull started there) is the other jobs' proof.
ENGINE_ONLY = {"chat_template_stage": False, "tokenize_stage": False, "detokenize_stage": False}


def fixed_pool(engines: int) -> int | list[int]:
    """``concurrency`` for a fixed pool of ``engines``, as the installed Ray takes it:
    ``[n, n]``, since an int is Ray Data's autoscaling range 1..n (a job of a few rows
    starts one); Ray 2.48's ``concurrency`` is an int, a fixed pool."""
    from ray.data.llm import vLLMEngineProcessorConfig

    annotation = vLLMEngineProcessorConfig.model_fields["concurrency"].annotation
    return engines if annotation == int | None else [engines, engines]


def _link(link: Path, target: Path) -> None:
    link.parent.mkdir(parents=True, exist_ok=True)
    if not link.is_symlink():
        link.symlink_to(target, target_is_directory=True)


# the session's one job on the sharded tiny model (tests/conftest.py: sharded_job)
SHARDED_QUESTIONS = [
    "What is 2+2?",
    "Name three primary colors.",
    "Say hello in French.",
    "What is the capital of France?",
]
SHARDED_MAX_TOKENS = 4


def wait_regions_released(since: float, timeout: float = 30.0) -> None:
    """Wait (up to ``timeout`` s) until the node's shared regions the job made are gone:
    the node's agent removes one within about 2 s of the job's last holder (docs/sharing.md),
    or the driver's exit does, which can be after the job's driver has returned. What is
    still there after that is left behind, and the caller's walk of /dev/shm reports it."""
    from ray_stream_llm.weights.region import DEFAULT_BASE

    try:
        wait_until(
            lambda: not weight_files_written([Path(DEFAULT_BASE)], since),
            timeout,
            "regions left",
            poll=0.5,
        )
    except AssertionError:
        pass  # judged by the caller's walk of /dev/shm


def weights_on_local_disk(work: Path, since: float, *, kept_warm: bool = False) -> dict[str, int]:
    """Weight files a job that began at ``since`` left in its work directory, /dev/shm or /tmp,
    once the node's regions it made are gone (:func:`wait_regions_released`; not waited for
    where the job kept them warm on purpose): path -> bytes."""
    if not kept_warm:
        wait_regions_released(since)
    return weight_files_written([work, Path("/dev/shm"), Path("/tmp")], since)


def weight_files_written(roots: list[Path], since: float) -> dict[str, int]:
    """Weight files (any format) under ``roots`` modified since ``since``: path -> bytes."""
    found = {}
    # a file counts once however many paths reach it: a root may lie under another, and a
    # test stream (tests/stream.sh) re-exposes its private /tmp inside the checkout
    seen: set[tuple[int, int]] = set()
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            # other tests' own fixtures (models built on purpose) live in pytest's tmp dirs
            dirnames[:] = [d for d in dirnames if not d.startswith("pytest-of-")]
            for name in filenames:
                path = Path(dirpath) / name
                try:
                    stat = path.stat()
                except OSError:
                    continue
                if (stat.st_dev, stat.st_ino) in seen:
                    continue
                seen.add((stat.st_dev, stat.st_ino))
                if stat.st_mtime >= since and is_weight(name):
                    found[str(path)] = stat.st_size
    return found


def run_isolated(
    server: LocalS3Server,
    work: Path,
    model: str,
    load_format: str | None,
    questions: list[str],
    max_tokens: int = 24,
    object_store: dict | None = None,
    config: dict | None = None,
    engine_kwargs: dict | None = None,
    num_cpus: int | None = None,
    env: dict[str, str] | None = None,
    expect_failure: bool = False,
    metrics_port: int | None = None,
    nodes: list[dict] | None = None,
    runs: list[dict] | None = None,
    timeout: float = 600,
) -> tuple[dict, dict[str, int], float]:
    """Run the job as a user's script. With ``object_store`` the store settings are given
    only in the config: the driver's environment holds no AWS variable at all. ``nodes``:
    the Ray nodes of a ``ray.cluster_utils.Cluster`` the script starts and joins;
    ``runs``: the job once per entry (config fields over ``config``), each run's result in
    ``out["runs"]`` (see helpers/e2e_driver.py); ``timeout``: the script's seconds, all runs
    together."""
    extra = {
        "RAY_STREAM_LLM_ACTOR_LOGS": "1",  # actor logs in the driver's output too
        # with a scrape, workers push their metrics every second (Ray's default: 10 s)
        **({"RAY_metrics_report_interval_ms": "1000"} if metrics_port else {}),
        **({} if object_store else server.env()),
        **(env or {}),
    }
    spec = {
        "model": model,
        "load_format": load_format,
        "questions": questions,
        "max_tokens": max_tokens,
        "ray_temp_dir": str(work / "ray"),
        "object_store": object_store,
        "config": config or {},
        "engine_kwargs": engine_kwargs,
        "num_cpus": num_cpus,
        "metrics_port": metrics_port,
        "nodes": nodes,
        "runs": runs,
    }
    (work / "spec.json").write_text(json.dumps(spec))
    start = time.time()
    proc = run_in_isolation(
        [sys.executable, str(DRIVER), str(work / "spec.json"), str(work / "out.json")],
        work,
        extra,
        timeout=timeout,
    )
    if expect_failure:
        assert proc.returncode != 0, "the job was expected to fail"
    else:
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    kept_warm = any((c or {}).get("keep_warm_s") for c in [config, *(runs or [])])
    written = weights_on_local_disk(work, start, kept_warm=kept_warm)
    out = (
        {"log": proc.stdout + proc.stderr}
        if expect_failure
        else json.loads((work / "out.json").read_text())
    )
    if (work / "error.json").exists():  # the typed error the driver caught
        out["error"] = json.loads((work / "error.json").read_text())
    # The node's agent (or the driver, after its own Ray's end) removes the engines'
    # segments: any left is recorded here (the tests assert none), and removed either way;
    # when any is, with what the agent saw and did about each engine (its log's last lines),
    # for the assertion's message: CI prints the short summary
    out["shm_left"] = segments_left(start)
    out["agent_logs"] = (
        {
            log.name: log.read_text(errors="replace").splitlines()[-8:]
            for log in sorted((work / "ray").rglob("rsl-janitor-*.log"))
        }
        if out["shm_left"]
        else {}
    )
    return out, written, time.time() - start


def reads_under(server: LocalS3Server, prefix: str, before: list) -> set[str]:
    return {
        r.uri
        for r in server.served()[len(before) :]
        if r.method == "GET" and r.status in (200, 206) and r.uri.startswith(prefix)
    }


def metric(metrics: dict[str, float], name: str, model: str) -> float:
    """The value of one series of ours as Prometheus scraped it from the Ray cluster."""
    [value] = [
        v
        for k, v in metrics.items()
        if k.startswith(f"ray_stream_llm_{name}{{") and f'model="{model}"' in k
    ]
    return value


def store_through(server: LocalS3Server, endpoint: str | None = None) -> dict[str, str]:
    """ObjectStoreConfig fields for ``server``, reached at its own endpoint or at ``endpoint``
    (a proxy in front, or the server under another host name): the tests' one store builder."""
    return {
        "endpoint_url": endpoint or server.endpoint_url,
        "region_name": server.region,
        "aws_access_key_id": server.access_key_id,
        "aws_secret_access_key": server.secret_access_key,
    }
