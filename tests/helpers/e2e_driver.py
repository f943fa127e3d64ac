"""A user's batch script, run by tests/test_e2e.py in a subprocess with an isolated HOME.

Usage: python e2e_driver.py SPEC_JSON OUT_JSON
SPEC_JSON: {"model": uri, "load_format": str|null, "questions": [...], "max_tokens": int,
            "ray_temp_dir": path, "object_store": {ObjectStoreConfig fields} | null}
"""

import json
import sys
import threading
import urllib.request
from pathlib import Path


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

    try:
        with typed_errors():  # what a user's `except WeightLoadError` sees
            result = run_job(
                spec["model"],
                spec["questions"],
                load_format=spec["load_format"],
                max_tokens=spec.get("max_tokens", 24),
                ray_temp_dir=spec["ray_temp_dir"],
                num_cpus=spec.get("num_cpus") or 2,
                object_store=store,
                engine_kwargs=spec.get("engine_kwargs"),
                config_kwargs=spec.get("config") or {},
                metrics_export_port=spec.get("metrics_port"),
            )
    except RayStreamLLMError as exc:
        error = {
            "class": type(exc).__name__,
            "message": str(exc),
            "cause": type(exc.__cause__).__name__,
        }
        Path(sys.argv[2]).with_name("error.json").write_text(json.dumps(error))
        raise
    if spec.get("metrics_port"):
        threading.Event().wait(3.0)  # one more scrape after the last report
    stop.set()
    import ray

    ray.shutdown()
    with open(sys.argv[2], "w") as f:
        json.dump(
            {
                "rows": result.rows,
                "build_seconds": result.build_seconds,
                "first_row_seconds": result.first_row_seconds,
                "total_seconds": result.total_seconds,
                "metadata_files": result.metadata_files,
                "metadata_bytes": result.metadata_bytes,
                "load_reports": [r.to_dict() for r in result.load_reports],
                "metrics": metrics,
            },
            f,
        )


if __name__ == "__main__":  # vLLM spawns processes: the guard is required
    main()
