"""Only nodes that can host an engine pull the shared weights (issue 19, item 4).

The engine's resource needs are Ray's own (its vLLM stage's default ``{"GPU": 1}`` actor
with Ray Data's default CPU, a placement group's bundle, the ``accelerator_type``
resource), checked against the node's resources by each stage actor before it pulls; in a
Ray worker, a node whose resources cannot be read does not pull. Proven on a two-node
``ray.cluster_utils.Cluster`` (one node with a logical GPU, one CPU-only) against the real
S3 server: the CPU-only node's stage actor makes no region and the store serves each
weight object once."""

from __future__ import annotations

import dataclasses
import math
import os
import time
from pathlib import Path

import pytest
from helpers.configs import stream_config
from helpers.s3log import AccessLog, copy_model, prefix_of
from helpers.waiting import wait_until

from ray_stream_llm.integrations.ray.builder import resolve_sharing

GiB = 1 << 30


def _engine_remote_args(model_dir: str, **fields) -> dict:
    """What Ray's own builder gives its engine actor (Ray Data's defaults applied)."""
    from ray.data._internal.execution.operators.map_operator import (
        _canonicalize_ray_remote_args,
    )
    from ray.data.llm import vLLMEngineProcessorConfig

    from ray_stream_llm.integrations.ray.compat import ray_builds_with

    processor = ray_builds_with(vLLMEngineProcessorConfig(model_source=model_dir, **fields))
    [engine] = [s for s in processor.stages.values() if "vLLMEngineStage" in type(s).__name__]
    kwargs = engine.map_batches_kwargs
    args = {k: kwargs[k] for k in ("num_cpus", "num_gpus", "resources") if kwargs.get(k)}
    args = _canonicalize_ray_remote_args(args)
    needs = {"CPU": float(args.get("num_cpus") or 0), "GPU": float(args.get("num_gpus") or 0)}
    needs.update(args.get("resources") or {})
    if kwargs.get("accelerator_type"):  # Ray turns the option into this resource
        needs[f"accelerator_type:{kwargs['accelerator_type']}"] = 0.001
    return {k: v for k, v in needs.items() if v}


@pytest.fixture
def base():
    path = Path("/dev/shm") / f"rsl-nodes-{os.getpid()}-{time.monotonic_ns()}"
    yield path
    import shutil

    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.s3
@pytest.mark.e2e
def test_a_cpu_only_node_pulls_nothing(s3_server, s3_env, tiny_models, base, work, monkeypatch):
    """Two Ray nodes: "gpu" (a logical GPU) and "cpu" (none). A stage actor on each runs
    the streamed stage's first step (udfs._prepare) with the driver's sharing decision
    for Ray's default engine: only the GPU node makes a region; the store serves each
    weight object once (one node's pull); the CPU node's base holds nothing. The bundle
    equals what Ray's own builder asks for its engine actor; an accelerator_type neither
    node has means neither pulls; and a node whose resources cannot be read in a Ray
    worker does not pull."""
    import ray
    from helpers.models import build_layout
    from ray.cluster_utils import Cluster

    from ray_stream_llm.weights import pull

    model = copy_model(s3_server, tiny_models["sharded"], "engine-nodes")
    monkeypatch.setenv("RAY_TMPDIR", str(work))
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 2,
            "num_gpus": 1,
            "resources": {"node_gpu": 4},
            "include_dashboard": False,
        },
    )
    cluster.add_node(num_cpus=2, num_gpus=0, resources={"node_cpu": 4})
    log = AccessLog(s3_server)
    try:
        ray.init(address=cluster.address, runtime_env={"env_vars": dict(s3_env)})
        sharing = dataclasses.replace(
            resolve_sharing(stream_config(), {}, engine_on_cpu=False), base=str(base)
        )
        model_dir = str(build_layout("single", work / "ray-model"))
        assert sharing.engine_resources == _engine_remote_args(model_dir)
        accel = resolve_sharing(stream_config(accelerator_type="L40S"), {}, engine_on_cpu=False)
        assert accel.engine_resources == _engine_remote_args(model_dir, accelerator_type="L40S")

        @ray.remote(num_cpus=0.1)
        class Stage:
            def __init__(self, uri, sharing, accel):
                from ray_stream_llm.integrations.ray import node, udfs
                from ray_stream_llm.plan import Plan
                from ray_stream_llm.uri import parse_model_uri
                from ray_stream_llm.weights.reading import wait_for

                self.can_host = node.can_host_an_engine(sharing.engine_resources)
                self.accel_can_host = node.can_host_an_engine(accel.engine_resources)
                plan = Plan(parse_model_uri(uri), sharing)
                udfs._prepare(None, plan, uri)  # the stage actor's first step
                self.regions = [str(w.region) for w in udfs._prefetched]
                for w in udfs._prefetched:  # the pull done: every byte the store served
                    for o in w.objects:
                        wait_for(w.region, o.path)

            def seen(self):
                return {
                    "node": ray.get_runtime_context().get_node_id(),
                    "can_host": self.can_host,
                    "accel_can_host": self.accel_can_host,
                    "regions": self.regions,
                }

            def streamer(self, sharing):
                from ray_stream_llm.integrations.ray import node
                from ray_stream_llm.weights import memory

                env: dict[str, str] = {}
                engines = node.engines_per_node(sharing.engine_resources, most=8)
                assigned = node.assigned_memory()
                limit = memory.streamer_memory_limit({}, engines, environ=env, assigned=assigned)
                return engines, limit, env

            def unreadable(self, sharing):
                def broken():
                    raise ConnectionError("GCS unreachable")

                from ray_stream_llm.integrations.ray import node

                ray.nodes = broken  # the resources cannot be read here
                return node.can_host_an_engine(sharing.engine_resources)

            def done(self):
                from ray_stream_llm.integrations.ray import udfs

                for w in udfs._prefetched:
                    w.release()
                udfs._prefetched.clear()

        gpu = Stage.options(resources={"node_gpu": 1}, memory=4 * GiB).remote(
            model.uri, sharing, accel
        )
        cpu = Stage.options(resources={"node_cpu": 1}).remote(model.uri, sharing, accel)
        on_gpu, on_cpu = ray.get([gpu.seen.remote(), cpu.seen.remote()])
        assert on_gpu["node"] != on_cpu["node"]
        assert (on_gpu["can_host"], on_cpu["can_host"]) == (True, False)
        assert (on_gpu["accel_can_host"], on_cpu["accel_can_host"]) == (False, False)
        assert on_cpu["regions"] == []
        [region] = on_gpu["regions"]
        assert Path(region).parent == base / on_gpu["node"][:16]
        assert not (base / on_cpu["node"][:16]).exists()  # nothing made on the CPU node
        assert sorted(p.name for p in base.iterdir()) == [on_gpu["node"][:16]]
        for o in model.weights:
            assert (Path(region) / o).read_bytes() == (model.local / o).read_bytes()
        prefix = prefix_of(model.uri)
        gets = log.gets(prefix)
        sizes = {o: (model.local / o).stat().st_size for o in model.weights}
        assert {k: v for k, v in gets.items() if k.endswith(".safetensors")} == {
            prefix + o: math.ceil(size / pull.CHUNK) for o, size in sizes.items()
        }  # once: the GPU node's pull, none from the CPU node
        # the streamer's buffer from Ray's memory resource of the actor (4 GiB): a quarter
        engines, limit, env = ray.get(gpu.streamer.remote(sharing))
        assert (engines, limit, env) == (1, GiB, {"RUNAI_STREAMER_MEMORY_LIMIT": str(GiB)})
        assert ray.get(gpu.unreadable.remote(sharing)) is False  # fail closed in a worker
        ray.get([gpu.done.remote(), cpu.done.remote()])
        wait_until(lambda: not Path(region).exists(), 30, f"{region} not removed", poll=0.2)
    finally:
        ray.shutdown()
        cluster.shutdown()
