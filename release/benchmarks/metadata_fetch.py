"""Release test: the metadata fetch of models of 1, 10 and 100 safetensors shards.

Each fetch is cold (a fresh directory). It lists the model once and downloads only the
metadata, so its time must not grow with the weights: ``RSL_BENCH_MAX_METADATA_SECONDS``
(default 30) bounds the slowest. With ``RSL_RELEASE_MODEL_URI`` only that model is fetched.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import bench_store, finish

from ray_stream_llm.tools import bench

REPEAT = 3


def run():
    with bench_store() as (store, workdir):
        runs = [
            {"metadata": bench.metadata_fetch(store.metadata_uris, workdir)} for _ in range(REPEAT)
        ]
        result = finish("metadata_fetch", store, runs)
    for run_ in runs:  # only metadata came down, however many and however large the weights
        for figures in run_["metadata"].values():
            assert figures["bytes"] < 16 << 20 and figures["weight_bytes"] > 0, figures
    return result


def test_metadata_fetch():
    run()


if __name__ == "__main__":
    run()
