"""What a Ray worker knows of its node, read here and handed to ``weights/`` (which
imports no Ray): the node's id and resources, the actor's memory, and the holder of a
region (``weights.region.Holder``) that the node's agent keeps and pulls for. Outside Ray
(a test, a tool) each says what ``weights/`` assumes there: one node, nothing assigned."""

from __future__ import annotations

import logging

from ray_stream_llm.weights.region import Holder

logger = logging.getLogger(__name__)


def node_id() -> str:
    """This worker's Ray node id (hex)."""
    import ray

    return str(ray.get_runtime_context().get_node_id())


def resources() -> dict[str, float]:
    """This node's total resources as Ray's node table has them; raises where it cannot be
    read."""
    import ray

    node = node_id()
    [info] = [n for n in ray.nodes() if n.get("NodeID") == node]
    return dict(info.get("Resources", {}))


def can_host_an_engine(engine_resources: dict[str, float]) -> bool:
    """Whether this node has the resources one engine asks for (a CPU-only node of a GPU
    cluster does not: its stage actors must not pull weights there). Unknown (the node
    table cannot be read) is no: the engines pull on their own nodes."""
    import ray

    wanted = {k: v for k, v in engine_resources.items() if v}
    if not wanted or not ray.is_initialized():
        return True
    try:
        have = resources()
    except Exception as exc:
        logger.warning(
            "Not pulling the shared weights on this node: its resources could not be "
            "read (%s: %s); the engines pull on their own nodes",
            type(exc).__name__,
            exc,
        )
        return False
    missing = {k: v for k, v in wanted.items() if have.get(k, 0) < v}
    if missing:
        logger.info(
            "Not pulling the shared weights on this node: an engine asks for %s, the node has %s",
            missing,
            {k: have.get(k, 0) for k in missing},
        )
    return not missing


def engines_per_node(engine_resources: dict[str, float], most: int | None = None) -> int:
    """How many engines of ``engine_resources`` this node can hold (at most ``most``); 1
    when they ask for nothing or the node table cannot be read."""
    import ray

    wanted = {k: v for k, v in engine_resources.items() if v}
    if not wanted or not ray.is_initialized():
        return 1
    try:
        have = resources()
    except Exception:
        return 1
    fit = max(1, min(int(have.get(k, 0) // v) for k, v in wanted.items()))
    return min(fit, most) if most else fit


def assigned_memory() -> int | None:
    """Ray's ``memory`` resource assigned to this actor (bytes), None where it has none."""
    import ray

    if not ray.is_initialized():
        return None
    memory = ray.get_runtime_context().get_assigned_resources().get("memory")
    return int(memory) if memory else None


def holder() -> Holder:
    """This actor as a region's holder: its node, its actor id, and the node's agent as the
    region's keeper and puller (``integrations/ray/agent.py``)."""
    import ray

    from ray_stream_llm.integrations.ray.agent import keep_region, pull_region

    if not ray.is_initialized():
        return Holder()
    return Holder(
        node=node_id()[:16],
        actor=ray.get_runtime_context().get_actor_id(),
        keeper=keep_region,
        puller=pull_region,
    )
