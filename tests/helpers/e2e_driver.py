"""A user's batch script, run by tests/e2e/test_streamed_jobs.py in a subprocess with an
isolated HOME.

Usage: python e2e_driver.py SPEC_JSON OUT_JSON
SPEC_JSON: {"model": uri, "load_format": str|null, "questions": [...], "max_tokens": int,
            "ray_temp_dir": path, "object_store": {ObjectStoreConfig fields} | null,
            "nodes": [{"num_cpus", "resources", "env_vars"}, ...] | null,
            "runs": [{config fields}, ...] | null}
With "nodes" the script starts a ``ray.cluster_utils.Cluster`` of those Ray nodes (the
first is the head; ``env_vars`` are each raylet's, so each node's workers have them) and
joins it. With "runs" it runs the job once per entry in one driver, the entry's fields over
"config", and writes each run's result under "runs".
"""

import json
import sys
import threading
import urllib.request
from pathlib import Path

from waiting import wait_until  # tests/helpers/waiting.py (this script's directory)


def scrape(port: int, seen: dict, stop: threading.Event) -> None:
    """Poll the cluster's Prometheus endpoint; keep the last value of each of our series."""
    while not stop.wait(1.0):
        try:
            text = (
                urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5)
                .read()
                .decode()
            )
        except OSError:
            continue
        for line in text.splitlines():
            if line.startswith("ray_stream_llm_"):
                series, value = line.rsplit(" ", 1)
                seen[series] = float(value)


def _scraped_all(metrics: dict, reports: list) -> bool:
    """Whether the scraped series count every one of ``reports``: per model, the engines
    ready and the weight bytes streamed (recorded with the rest of a report's series)."""
    seen = dict(metrics)  # the scrape thread replaces values meanwhile

    def total(name: str, model: str) -> float:
        return sum(
            v
            for k, v in seen.items()
            if k.startswith(f"ray_stream_llm_{name}{{") and f'model="{model}"' in k
        )

    for model in {r.model for r in reports}:
        mine = [r for r in reports if r.model == model]
        if total("engines_ready_total", model) != len(mine):
            return False
        if total("weight_bytes_streamed_total", model) != sum(r.weight_bytes or 0 for r in mine):
            return False
    return True


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    from ray_stream_llm import typed_errors
    from ray_stream_llm.errors import RayStreamLLMError
    from ray_stream_llm.stores.settings import ObjectStoreConfig
    from ray_stream_llm.tools.job import run_job

    store = ObjectStoreConfig(**spec["object_store"]) if spec.get("object_store") else None
    metrics: dict = {}
    stop = threading.Event()
    if spec.get("metrics_port"):
        threading.Thread(
            target=scrape, args=(spec["metrics_port"], metrics, stop), daemon=True
        ).start()

    cluster = start_cluster(spec) if spec.get("nodes") else None
    peer_actors_left = None
    results = []
    try:
        with typed_errors():  # what a user's `except WeightLoadError` sees
            for run in spec.get("runs") or [{}]:
                results.append(
                    run_job(
                        spec["model"],
                        spec["questions"],
                        load_format=spec["load_format"],
                        max_tokens=spec.get("max_tokens", 24),
                        ray_temp_dir=spec["ray_temp_dir"],
                        num_cpus=spec.get("num_cpus") or 2,
                        object_store=store,
                        engine_kwargs=spec.get("engine_kwargs"),
                        config_kwargs={**(spec.get("config") or {}), **run},
                        metrics_export_port=spec.get("metrics_port"),
                    )
                )
        if cluster is not None:
            peer_actors_left = _peer_actors_after_the_job()
    except RayStreamLLMError as exc:
        error = {
            "class": type(exc).__name__,
            "message": str(exc),
            "cause": type(exc.__cause__).__name__,
        }
        Path(sys.argv[2]).with_name("error.json").write_text(json.dumps(error))
        raise
    finally:
        if cluster is not None:  # every node's raylet, whatever happened
            import ray

            ray.shutdown()
            cluster.shutdown()
    if spec.get("metrics_port") and results:
        # every engine's report is in what Prometheus scraped (workers push their metrics
        # every second, the scrape polls every second): the job's reports are the last run's
        reports = results[-1].load_reports
        wait_until(
            lambda: _scraped_all(metrics, reports),
            60,
            lambda: (
                f"the scraped metrics never counted {len(reports)} ready engine(s) and "
                f"their streamed bytes; scraped: {dict(metrics)}"
            ),
            poll=0.2,
        )
    stop.set()
    import ray

    ray.shutdown()
    seen = 0  # a run's load reports: the job's, less the earlier runs' (one Ray job)
    outs = []
    for result in results:
        outs.append(
            {
                "rows": result.rows,
                "build_seconds": result.build_seconds,
                "first_row_seconds": result.first_row_seconds,
                "total_seconds": result.total_seconds,
                "metadata_files": result.metadata_files,
                "metadata_bytes": result.metadata_bytes,
                "load_reports": [r.to_dict() for r in result.load_reports[seen:]],
            }
        )
        seen = len(result.load_reports)
    out = {**outs[-1], "metrics": metrics, "peer_actors_left": peer_actors_left}
    if spec.get("runs"):
        out["runs"] = outs
    with open(sys.argv[2], "w") as f:
        json.dump(out, f)


def _peer_actors_after_the_job(timeout: float = 120.0) -> list:
    """The peers' actors (integrations/ray/peers.py; not the node agents) still alive ``timeout`` s
    after the job: they end themselves once the nodes' regions are gone, which is after the
    engines' processes have exited and the node agents, their keepers, have seen it (CI's run
    of stop 38 saw two actors still alive 30 s after a three-node job on its two loaded
    cores)."""
    import ray

    def left() -> list:
        return [
            a["name"]
            for a in ray.util.list_named_actors(all_namespaces=True)
            if a["namespace"] == "ray_stream_llm" and not a["name"].startswith("rsl-agent-")
        ]

    try:
        wait_until(lambda: not left(), timeout, "peer actors left", poll=0.5)
    except AssertionError:
        pass  # what is left is the job's result, judged by the test
    return left()


def start_cluster(spec: dict):
    """The spec's Ray nodes on this machine, joined by this driver."""
    from ray_stream_llm.tools.job import local_cluster

    return local_cluster(spec["nodes"], spec["ray_temp_dir"])


if __name__ == "__main__":  # vLLM spawns processes: the guard is required
    main()
