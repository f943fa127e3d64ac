"""Release test: one store read per cluster (issue 22). Each node pulling the model from
the store vs the nodes filling each other's regions over Ray (``weight_peers``), side by
side in one run; on the CPU variant also one engine and TP=2, from the store vs the node's
region.

CPU variant (no ``RSL_RELEASE_MODEL_URI``): three Ray nodes on this machine
(``ray.cluster_utils``), one engine each, the local S3 server behind a link capped at
100 MiB/s for the whole cluster (``RSL_RELEASE_LINK_BYTES_PER_S``); the store's bytes are
what the link carried. GPU variant: the Ray cluster this runs on (4 nodes of 8xH100,
``RSL_RELEASE_ENGINES`` engines, 32 by default), the real store; the store's bytes are
each node's pull that read the store, from the load reports. Threshold: with peers the
store serves at most 1.1x the weights for the whole cluster
(``RSL_BENCH_MAX_PEERS_STORE_X``). Run: ``pytest release/benchmarks/cluster.py``.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import bench_store, engine_kwargs, finish

from ray_stream_llm.tools import bench_cluster


def run():
    with bench_store() as (store, workdir):
        if store.port is None:  # a real store and cluster
            engines = int(os.environ.get("RSL_RELEASE_ENGINES", "32"))
            figures = bench_cluster.on_running_cluster(
                store.model_uri, workdir, engines, engine_kwargs=engine_kwargs()
            )
        else:
            rate = float(os.environ.get("RSL_RELEASE_LINK_BYTES_PER_S", bench_cluster.DEFAULT_RATE))
            figures = bench_cluster.cluster(
                store.model_uri, store.env, store.port, workdir, rate=rate
            )
        result = finish("cluster", store, [{"cluster": figures}])
    assert all(f["rows"] == len(bench_cluster.PROMPTS) for f in figures.values())
    return result


def test_cluster():
    run()


if __name__ == "__main__":
    run()
