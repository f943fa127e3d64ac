"""What a worker knows of its node (integrations/ray/node.py), outside Ray: what
``weights/`` assumes there (one node, ``local``, nothing assigned, this process keeps and
pulls). Inside Ray: tests/integration/test_engine_nodes.py (a GPU node, a CPU-only node, an
unreadable node table) and the integration tests of the agent and the peers."""

from __future__ import annotations

import ray

from ray_stream_llm.integrations.ray import node
from ray_stream_llm.weights.region import Holder


def test_outside_ray_each_says_what_weights_assumes():
    assert not ray.is_initialized()
    assert node.holder() == Holder()
    assert node.holder().node == "local" and node.holder().keeper is None
    assert node.can_host_an_engine({"GPU": 1.0}) is True
    assert node.engines_per_node({"GPU": 1.0}, most=4) == 1
    assert node.assigned_memory() is None


def test_an_engine_that_asks_for_nothing_fits_any_node_once():
    assert node.can_host_an_engine({"GPU": 0.0}) is True
    assert node.engines_per_node({}) == 1
