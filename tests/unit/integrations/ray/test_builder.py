"""Which engines share a node's pull, and the engine bundle Ray asks for
(integrations/ray/builder.py, issue 19 item 4), from configs alone: no Ray, no store. On a
two-node cluster: tests/integration/test_engine_nodes.py."""

from __future__ import annotations

import pytest
from helpers.configs import STREAM, stream_config

from ray_stream_llm.config import StreamingvLLMEngineProcessorConfig
from ray_stream_llm.errors import InvalidSettingError
from ray_stream_llm.integrations.ray.builder import _engine_bundle, resolve_sharing


def test_the_engine_bundle_is_what_ray_asks_for():
    # Ray's default: the engine actor asks num_gpus=1 (tp x pp) and Ray Data's default CPU
    assert _engine_bundle(stream_config(), {}) == {"GPU": 1.0, "CPU": 1.0}
    # accelerator_type: Ray adds its accelerator_type:<type> resource
    assert _engine_bundle(stream_config(accelerator_type="L40S"), {}) == {
        "GPU": 1.0,
        "CPU": 1.0,
        "accelerator_type:L40S": 0.001,
    }
    # a placement group: its bundle (bundle_per_worker or the first of bundles)
    per_worker = {"bundle_per_worker": {"GPU": 1, "CPU": 4, "big_mem": 1}}
    assert _engine_bundle(stream_config(placement_group_config=per_worker), {}) == {
        "GPU": 1.0,
        "CPU": 4.0,
        "big_mem": 1.0,
    }
    bundles = {"bundles": [{"GPU": 1, "CPU": 2}], "strategy": "PACK"}
    assert _engine_bundle(stream_config(placement_group_config=bundles), {}) == {
        "GPU": 1.0,
        "CPU": 2.0,
    }
    # engines this library placed on CPUs (the placement update), or on Ray 2.48's CPUs
    cpu_update = {"placement_group_config": {"bundles": [{"CPU": 1}]}}
    assert _engine_bundle(stream_config(), cpu_update) == {"CPU": 1.0}
    assert _engine_bundle(stream_config(), {}, engine_on_cpu=True) == {"CPU": 1.0}
    # the driver's decision carries it to every stage actor
    sharing = resolve_sharing(stream_config(), {}, engine_on_cpu=False)
    assert sharing.mode == "node" and sharing.engine_resources == {"GPU": 1.0, "CPU": 1.0}


def test_which_engines_share_the_nodes_pull():
    """'auto' shares wherever every worker of the engine reads this node's memory: one engine
    alone too, and a tensor or pipeline parallel engine whose workers are its actor's
    processes ('mp'); not Ray's executor's workers (other nodes, maybe), nor rank files."""

    def mode(concurrency=1, sharing="auto", backend=None, **engine):
        kwargs = {**STREAM, **engine}
        if backend:
            kwargs["distributed_executor_backend"] = backend
        config = StreamingvLLMEngineProcessorConfig(
            model_source="s3://models/m/",
            engine_kwargs=kwargs,
            concurrency=concurrency,
            weight_sharing=sharing,
        )
        return resolve_sharing(config, {}, engine_on_cpu=False).mode

    assert mode() == "node"  # one engine alone
    assert mode(tensor_parallel_size=2, backend="mp") == "node"
    assert mode(pipeline_parallel_size=2, backend="mp") == "node"
    assert mode(tensor_parallel_size=2) == "off"  # Ray's stage picks its 'ray' executor
    assert mode(tensor_parallel_size=2, backend="ray") == "off"
    sharded = {"load_format": "runai_streamer_sharded"}
    assert mode(tensor_parallel_size=2, backend="mp", **sharded) == "off"
    assert mode(sharing="off") == "off"
    # the CPU build's builder gives parallel engines 'mp' in its updates: they count
    config = StreamingvLLMEngineProcessorConfig(
        model_source="s3://models/m/", engine_kwargs={**STREAM, "tensor_parallel_size": 2}
    )
    updates = {"engine_kwargs": {**config.engine_kwargs, "distributed_executor_backend": "mp"}}
    assert resolve_sharing(config, updates, engine_on_cpu=True).mode == "node"
    # 'node' where a worker may be elsewhere: refused on the driver, naming the fix
    with pytest.raises(InvalidSettingError, match="distributed_executor_backend'\\]='mp'"):
        mode(sharing="node", tensor_parallel_size=2, backend="ray")
