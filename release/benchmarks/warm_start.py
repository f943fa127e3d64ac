"""Release test: warm engine starts (issue 20). vLLM's default (compiling) start cold, on a
warm node (the same job again: vLLM's local compile cache, the weights kept warm) and on a
fresh node with the compile cache shipped through the store (``compile_cache_uri``), at 1
engine and at ``RSL_RELEASE_ENGINES`` engines (2 on the CPU variant, 8 on one 8-GPU node),
side by side in one run.

CPU variant (no ``RSL_RELEASE_MODEL_URI``): the local S3 server behind a link capped at
100 MiB/s, the compile cache on it. GPU variant: the real store; the compile cache under
``RSL_RELEASE_COMPILE_CACHE_URI`` (an s3:// prefix the job may write). Thresholds: a warm
node's slowest engine ready at most 0.35x the cold one's (``RSL_BENCH_MAX_WARM_READY_RATIO``),
a fresh node with the shipped cache at most 0.5x (``RSL_BENCH_MAX_FRESH_READY_RATIO``), two
engines starting together on a cold node within 1.2x of one alone
(``RSL_BENCH_MAX_TWO_ENGINES_READY_RATIO``). Run: ``pytest release/benchmarks/warm_start.py``.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import bench_store, engine_kwargs, finish

from ray_stream_llm.tools import bench_warm


def run():
    engines = int(os.environ.get("RSL_RELEASE_ENGINES", "2"))
    with bench_store() as (store, workdir):
        prefix = os.environ.get("RSL_RELEASE_COMPILE_CACHE_URI", "s3://bench/compile-cache/")
        figures = bench_warm.warm_starts(
            store.model_uri,
            store.env,
            store.port,
            workdir,
            cache_prefix=prefix,
            engines=tuple(sorted({1, engines})),
            num_cpus=max(os.cpu_count() or 2, 2 * engines),
            engine_kwargs=engine_kwargs(),
        )
        result = finish("warm_start", store, [{"warm": figures}])
    assert all(f["rows"] == len(bench_warm.PROMPTS) for f in figures.values())
    return result


def test_warm_start():
    run()


if __name__ == "__main__":
    run()
