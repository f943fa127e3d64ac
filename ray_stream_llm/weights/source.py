"""Where one engine's weights come from: a :class:`WeightSource`.

The driver decides (its :class:`~ray_stream_llm.weights.region.Sharing`), the engine actor
acquires a source before vLLM starts (:func:`acquire`), prepares it before each start
attempt, gives vLLM its :attr:`~WeightSource.model_weights`, reports it, and releases it
when the engine goes; the engine's processes await each file where the source fills as
they read (the plugin's wait for a region file's completion mark). Two sources today:

- :class:`StoreWeights`: vLLM's Run:ai loader streams every file from the store's URI;
- :class:`RegionWeights`: the node's one pull into its shared region (``/dev/shm``), read
  by every engine of the node, which gives itself up for the store when the pull does
  (``weight_sharing='auto'``).

A new source (a peer node, a warm cache) is one more class with these members.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from ray_stream_llm.fetch import FetchReport
from ray_stream_llm.uri import ModelURI
from ray_stream_llm.weights.region import (
    NodeWeights,
    Sharing,
    finished_pull,
    start_pull,
    unshared,
)

logger = logging.getLogger(__name__)


class WeightSource(Protocol):
    """One engine's weights: what vLLM reads them from, and what the load report says."""

    @property
    def model_weights(self) -> str:
        """What vLLM is given as ``model_weights``: a store URI or a local directory."""
        ...

    @property
    def sharing(self) -> str:
        """The load report's ``weight_sharing``: ``"node"``, ``"off"`` or ``"off: <why>"``."""
        ...

    @property
    def fills_while_read(self) -> bool:
        """Whether files may be read before they are complete (the engine's processes then
        await each one)."""
        ...

    def prepare(self) -> WeightSource:
        """Before each start attempt: the source to start from (itself, or the one it gives
        itself up for). A source that fills while read is read only through this library's
        loader, which awaits each file (the engine actor fails closed without it)."""
        ...

    def sizes(self) -> dict[str, int]:
        """Each file the engine may stream (as vLLM names it) and its size in the store."""
        ...

    def pull(self) -> dict[str, Any] | None:
        """The status of what fills the source for the load report (None: nothing does)."""
        ...

    def release(self) -> None:
        """The engine is gone: let go of the source (idempotent)."""
        ...


class StoreWeights:
    """Every file streamed from the store."""

    def __init__(self, uri: ModelURI, fetched: FetchReport, sharing: str = "off"):
        self.uri, self.fetched, self._sharing = uri, fetched, sharing

    @property
    def model_weights(self) -> str:
        return str(self.uri)

    @property
    def sharing(self) -> str:
        return self._sharing

    fills_while_read = False

    def prepare(self) -> WeightSource:
        return self

    def sizes(self) -> dict[str, int]:
        return dict(self.fetched.streamable)

    def pull(self) -> dict[str, Any] | None:
        return None

    def release(self) -> None:
        pass


class RegionWeights:
    """The node's shared region, filled by the node's one pull."""

    def __init__(self, uri: ModelURI, fetched: FetchReport, node: NodeWeights, region: str):
        self.uri, self.fetched, self.node, self.region = uri, fetched, node, region
        self._released = False

    @property
    def model_weights(self) -> str:
        return self.region

    @property
    def sharing(self) -> str:
        return "node"

    fills_while_read = True

    def prepare(self) -> WeightSource:
        # the pull starts (or is taken over, after a puller that died) with each attempt
        start_pull(Path(self.region), self.uri, self.fetched.weight_objects)
        why = unshared(self.region)
        if why is None:
            return self
        self.release()  # 'auto' gave the region up: the store, for this engine
        return StoreWeights(self.uri, self.fetched, f"off: {why}")

    def sizes(self) -> dict[str, int]:
        return {os.path.join(self.region, o.path): o.size for o in self.fetched.weight_objects}

    def pull(self) -> dict[str, Any] | None:
        return finished_pull(self.region)  # its record follows the last file by moments

    def release(self) -> None:
        if not self._released:
            self._released = True
            self.node.release()  # the node's last engine removes the region (or keeps it warm)


def acquire(
    uri: ModelURI,
    fetched: FetchReport,
    sharing: Sharing | None,
    keeper: Callable[[Path], None] | None = None,
) -> WeightSource:
    """The engine's source under the driver's decision: the node's region where it shares
    and the region can be had (handed to ``keeper``: :class:`NodeWeights`), else the store
    (the report says why). Raises ``WeightSharingError`` where sharing was required
    (``'node'``) and cannot be had."""
    if sharing is None or sharing.mode != "node":
        return StoreWeights(uri, fetched)
    node = NodeWeights(uri, fetched.weight_objects, sharing, keeper)
    try:
        region = node.acquire()
    except BaseException:
        node.release()  # a reference it may have taken before it failed
        raise
    if region is None:
        return StoreWeights(uri, fetched, f"off: {node.reason}")
    return RegionWeights(uri, fetched, node, region)
