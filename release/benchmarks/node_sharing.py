"""Release test: node weight sharing. Plain streaming, Ray's download path and shared
streaming, side by side in one run, at 1 engine and at ``RSL_RELEASE_ENGINES`` engines
(2 on the CPU variant, 8 on one 8-GPU node).

CPU variant (no ``RSL_RELEASE_MODEL_URI``): the local S3 server behind a link capped at
100 MiB/s (``RSL_RELEASE_LINK_BYTES_PER_S``), standing for a node's share of a real
store's link; the store's bytes are what the link carried. GPU variant: the real store
and link; the store's bytes come from the load reports (each node's one pull when
shared, each engine's stream otherwise). Thresholds: with N engines the store serves
1.0x the weight bytes when shared (``RSL_BENCH_MAX_SHARED_STORE_X``, default 1.1) and
the slowest weight phase is at most 0.6x plain streaming's
(``RSL_BENCH_MAX_SHARED_WEIGHT_RATIO_2``); with 1 engine within 5%
(``RSL_BENCH_MAX_SHARED_WEIGHT_RATIO_1``). Run: ``pytest release/benchmarks/node_sharing.py``.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import bench_store, finish

from ray_stream_llm.tools import bench_sharing


def run():
    engines = int(os.environ.get("RSL_RELEASE_ENGINES", "2"))
    rate = float(os.environ.get("RSL_RELEASE_LINK_BYTES_PER_S", bench_sharing.DEFAULT_RATE))
    with bench_store() as (store, workdir):
        figures = bench_sharing.node_sharing(
            store.model_uri,
            store.env,
            store.port,
            workdir,
            rate=rate,
            engines=(1, engines),
            num_cpus=max(os.cpu_count() or 2, 2 * engines),
        )
        result = finish("node_sharing", store, [{"sharing": figures}])
    assert all(f["rows"] == len(bench_sharing.PROMPTS) for f in figures.values())
    assert all(set(f["shared"]) == {"node"} for k, f in figures.items() if k.startswith("shared"))
    return result


def test_node_sharing():
    run()


if __name__ == "__main__":
    run()
