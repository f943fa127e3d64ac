"""Release test: the Run:ai streamer's throughput against the ceiling of the same store.

The ceiling is a parallel ranged-GET reader (8 MiB ranges, the streamer's concurrency)
of the same safetensors objects, in the same process, just before the streamer reads
them. ``RSL_BENCH_MIN_THROUGHPUT_RATIO`` sets the threshold on streamer / ceiling.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import bench_store, finish

from ray_stream_llm.tools import bench

REPEAT = 3


def run():
    with bench_store() as (store, _):
        runs = [{"throughput": bench.throughput(store.model_uri)} for _ in range(REPEAT)]
        result = finish("stream_throughput", store, runs)
    assert all(r["throughput"]["bytes"] == store.model_bytes for r in runs)
    return result


def test_stream_throughput():
    run()


if __name__ == "__main__":
    run()
