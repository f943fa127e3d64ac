"""A user's batch script, run by tests/test_e2e.py in a subprocess with an isolated HOME.

Usage: python e2e_driver.py SPEC_JSON OUT_JSON
SPEC_JSON: {"model": uri, "load_format": str|null, "questions": [...], "max_tokens": int,
            "ray_temp_dir": path, "object_store": {ObjectStoreConfig fields} | null}
"""

import json
import sys


def main() -> None:
    spec = json.loads(open(sys.argv[1]).read())
    from ray_stream_llm.job import run_job
    from ray_stream_llm.store import ObjectStoreConfig

    store = ObjectStoreConfig(**spec["object_store"]) if spec.get("object_store") else None

    result = run_job(
        spec["model"],
        spec["questions"],
        load_format=spec["load_format"],
        max_tokens=spec.get("max_tokens", 24),
        ray_temp_dir=spec["ray_temp_dir"],
        num_cpus=2,
        object_store=store,
        config_kwargs=spec.get("config") or {},
    )
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
            },
            f,
        )


if __name__ == "__main__":  # vLLM spawns processes: the guard is required
    main()
