"""Release test: cold start, streamed vs downloaded, same model, same store, one run.

Processor build seconds, seconds to engine ready, to the first output row, total job
seconds, and local-disk bytes written, for ``runai_streamer`` and for vLLM's default
load format (Ray downloads the model), both with ``enforce_eager``; then streamed with
vLLM's default engine arguments (it compiles: the compile's seconds too). Each variant
runs in a fresh local Ray cluster with an empty HOME. Run:
``pytest release/benchmarks/cold_start.py`` or ``python release/benchmarks/cold_start.py``.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import bench_store, engine_kwargs, finish

from ray_stream_llm.tools import bench


def run():
    with bench_store() as (store, workdir):
        figures = bench.cold_start(
            store.model_uri,
            store.env,
            workdir,
            engine_kwargs=engine_kwargs(),
            num_cpus=None if os.environ.get("RSL_RELEASE_MODEL_URI") else os.cpu_count(),
        )
        result = finish("cold_start", store, [{"cold_start": figures}])
    streamed, downloaded = figures["streamed"], figures["downloaded"]
    compiled = figures["streamed_compiled"]
    assert streamed["rows"] == downloaded["rows"] == compiled["rows"] == len(bench.PROMPTS)
    assert streamed["disk_bytes_written"] < downloaded["disk_bytes_written"]
    return result


def test_cold_start():
    run()


if __name__ == "__main__":
    run()
