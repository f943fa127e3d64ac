"""What the release scripts share: where the model is, how to finish a benchmark.

With ``RSL_RELEASE_MODEL_URI`` set, the scripts use that model and the store that the
standard environment names (AWS_ENDPOINT_URL, credentials...); otherwise the CPU
variant: a local SeaweedFS server and a generated random-weight model of about 1 GiB.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from ray_stream_llm.tools import bench

RESULTS = Path(__file__).resolve().parent.parent / "results"


@contextlib.contextmanager
def bench_store() -> Iterator[tuple[bench.BenchStore, Path]]:
    workdir = Path(tempfile.mkdtemp(prefix="rsl-release-", dir="/tmp"))
    try:
        uri = os.environ.get("RSL_RELEASE_MODEL_URI")
        if uri:
            uri = uri if uri.endswith("/") else uri + "/"
            objects = bench._weight_objects(uri)
            yield (
                bench.BenchStore(
                    env={},
                    model_uri=uri,
                    model_bytes=sum(s for _, s in objects),
                    model_shards=len(objects),
                    metadata_uris={"model": uri},
                ),
                workdir,
            )
        else:
            with bench.local_bench_store(workdir) as store:
                yield store, workdir
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def engine_kwargs() -> dict | None:
    """Engine settings of the compute file (``RSL_RELEASE_ENGINE_KWARGS``, JSON)."""
    text = os.environ.get("RSL_RELEASE_ENGINE_KWARGS")
    return json.loads(text) if text else None


def finish(name: str, store: bench.BenchStore, runs: list[dict]) -> bench.BenchResult:
    """Write the JSON (``$TEST_OUTPUT_JSON`` or release/results/NAME.json), print the table,
    fail on a missed threshold."""
    result = bench.BenchResult(runs=runs, environment=bench.environment(store))
    RESULTS.mkdir(exist_ok=True)
    path = bench.write_json(result, os.environ.get(bench.OUTPUT_ENV) or RESULTS / f"{name}.json")
    print(bench.format_table(result))
    print(f"results: {path}")
    failures = bench.check_thresholds(result)
    assert not failures, failures
    return result
