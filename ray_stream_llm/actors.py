"""The library's own Ray actors (the peers' directories, the node agents): named in one
namespace, detached, asking for no CPU; the one of that name if it runs."""

from __future__ import annotations

import functools
import logging
from typing import Any

NAMESPACE = "ray_stream_llm"


def agent_name(node_id: str) -> str:
    """The name of the node agent of ``node_id`` (``integrations/ray/agent.py``)."""
    return f"rsl-agent-{node_id}"


def library_actor(cls: type, name: str, node: str | None = None, **options: Any) -> Any:
    """``cls`` as the library's actor ``name``, ready for ``.remote(...)``: detached, in
    :data:`NAMESPACE`, ``num_cpus=0``, the running one of that name if there is one; with
    ``node``, pinned to that node (not elsewhere if it is gone). ``options``: Ray's others."""
    if node is not None:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node, soft=False)
    return _actor_class(cls).options(
        name=name,
        namespace=NAMESPACE,
        lifetime="detached",
        get_if_exists=True,
        num_cpus=0,
        **options,
    )


@functools.cache
def _actor_class(cls: type) -> Any:
    import ray

    return ray.remote(cls)


def actor_logging() -> None:
    """In the actors this library creates (its stage actors, its node agents; never in the
    user's own processes), show its INFO lines (fetch, pull and load figures) in the worker
    log and the driver, as Ray's own libraries do, unless logging was configured there
    already."""
    package = logging.getLogger("ray_stream_llm")
    if package.level == logging.NOTSET:
        package.setLevel(logging.INFO)
    if not package.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        package.addHandler(handler)
