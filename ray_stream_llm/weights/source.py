"""Where one engine's weights come from: a :class:`WeightSource`.

The driver decides (its :class:`~ray_stream_llm.weights.region.Sharing`), the engine actor
acquires a source before vLLM starts (:func:`acquire`), prepares it before each start
attempt, names its :attr:`~WeightSource.model_weights` to the loader, reports it, and releases it
when the engine goes; the engine's processes await each file where the source fills as
they read (the loader's wait for each region file by its name). Two sources today, each in
its own module:

- :class:`~ray_stream_llm.weights.store.StoreWeights`: vLLM's Run:ai loader streams every
  file from the store's URI;
- :class:`~ray_stream_llm.weights.region.RegionWeights`: the node's one pull into its
  shared region (``/dev/shm``), read by every engine of the node, which gives itself up for
  the store when the pull does (``weight_sharing='auto'``). The pull reads the store or a
  peer node's region (``integrations/ray/peers.py``), and a region kept warm by an earlier job is
  the same source.

A new source is one more class with these members.
"""

from __future__ import annotations

import logging
from typing import Protocol

from ray_stream_llm.fetch import FetchReport
from ray_stream_llm.uri import ModelURI
from ray_stream_llm.weights.marks import PullRecord
from ray_stream_llm.weights.region import Holder, NodeWeights, RegionWeights, Sharing
from ray_stream_llm.weights.store import StoreWeights

logger = logging.getLogger(__name__)


class WeightSource(Protocol):
    """One engine's weights: what vLLM reads them from, and what the load report says."""

    @property
    def model_weights(self) -> str:
        """The model's URI, which the engine's loader streams (the node's region, where
        there is one, is ``region``: the engine actor names both to the loader,
        ``weights.reading``)."""
        ...

    @property
    def sharing(self) -> str:
        """The load report's ``weight_sharing``: ``"node"``, ``"off"`` or ``"off: <why>"``."""
        ...

    def prepare(self) -> WeightSource:
        """Before each start attempt: the source to start from (itself, or the one it gives
        itself up for). A region is read only through this library's loader, which awaits
        each file (the engine actor fails closed without it)."""
        ...

    def sizes(self) -> dict[str, int]:
        """Each file the engine may stream (as vLLM names it) and its size in the store."""
        ...

    def pull(self) -> PullRecord | None:
        """The status of what fills the source for the load report (None: nothing does)."""
        ...

    def release(self) -> None:
        """The engine is gone: let go of the source (idempotent)."""
        ...


def acquire(
    uri: ModelURI,
    fetched: FetchReport,
    sharing: Sharing | None,
    holder: Holder | None = None,
) -> WeightSource:
    """The engine's source under the driver's decision: the node's region where it shares
    and the region can be had (held as ``holder``: :class:`NodeWeights`), else the store
    (the report says why). Raises ``WeightSharingError`` where sharing was required
    (``'node'``) and cannot be had."""
    if sharing is None or sharing.mode != "node":
        return StoreWeights(uri, fetched)
    node = NodeWeights(uri, fetched.weight_objects, sharing, holder)
    try:
        region = node.acquire()
    except BaseException:
        node.release()  # a reference it may have taken before it failed
        raise
    if region is None:
        return StoreWeights(uri, fetched, f"off: {node.reason}")
    return RegionWeights(uri, fetched, node, region)
