"""A node's region filled from another node's region over Ray: one store read per cluster.

Where the plan shares weights with peers (``weight_peers``, the fan-out, 2 by default),
each node's pull (its agent's: :func:`ray_stream_llm.weights.pull.pull_with`, given this
module as its ``peers``) joins
the model's *directory*: a detached Ray actor named for the region's key (``rsl-peers-<key>``,
namespace ``ray_stream_llm``, created by the first node that asks, atomically). Each node's
*server* is its node agent (``integrations/ray/agent.py``), which keeps the node's region
and reads ranges of its files for other nodes (:func:`read_range`). Both ask for no CPU,
and both start on a cluster of one node too, so that a node that joins later (an autoscaled
or replaced one) fills from a peer: a node alone in its cluster reads the store at once
and joins beside its pull (:func:`join`); a node that finds its region already whole (kept
warm across Ray sessions) joins as a server (:func:`serve`). The directory gives each node
that joins a parent: the earliest node that serves fewer than ``weight_peers`` others and
is not below it in the tree (a tree, not a star: a node serves while it fills), or none:
that node reads the store. The copy goes range by
range through Ray's object manager; a range is served once the parent has it (its puller
records the contiguous prefix of each file it writes, ``.partial/<name>``, in
``.progress/<name>``; a whole file is served from ``<name>``), so a node's engines stream
while the tree still fills. ``.peer.json`` in each region says where it reads from.

What a peer serves is held to the same checks as the store's bytes: the region's key is
the model's URI with each object's size and ETag, so a parent holds the objects of the
store's listing that the child itself made (the child lists the store first, and its pull
refuses objects that changed); each range's length is checked, the file's total against
the listing, and its MD5 against the ETag where the ETag is one. A parent that dies, fails
or stalls for :data:`STALL_S` is reported lost: the directory hands the node another parent,
or the store, and the pull goes on from the range it was at, pinned to the same ETag.

The node's agent serves its region until it removes it, then tells the directory
(:func:`leave`); the directory ends when its last node has left. A region kept warm
(``keep_warm_s``) is kept by its agent, so it is served, and the directory lives, until it
is removed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ray_stream_llm.actors import NAMESPACE, agent_name, library_actor
from ray_stream_llm.files import sha256_of, write_whole
from ray_stream_llm.weights.marks import (
    CREATED,
    FAILED,
    PEER_RECORD,
    UNSHARED,
    PullSource,
    digest_of,
    done,
    objects_of,
    partial,
    progress,
)

logger = logging.getLogger(__name__)

STALL_S = 60.0  # seconds a parent may serve nothing new before it is given up
POLL_S = 0.02


def directory_name(key: str) -> str:
    return f"rsl-peers-{key}"


class Directory:
    """The tree of one region's nodes (a detached actor, one per region key)."""

    def __init__(self, fanout: int) -> None:
        self.fanout = fanout
        # node -> server, parent; in the order the nodes joined (the earliest is asked first)
        self.members: dict[str, dict[str, Any]] = {}

    def _children(self, node: str) -> int:
        return sum(1 for m in self.members.values() if m["parent"] == node)

    def _below(self, node: str, other: str) -> bool:
        """Whether ``other`` is ``node`` or below it in the tree."""
        seen: set[str] = set()  # never a loop, even on a tree this code did not expect
        current: str | None = other
        while current is not None and current not in seen:
            if current == node:
                return True
            seen.add(current)
            current = self.members.get(current, {}).get("parent")
        return False

    def _parent_for(self, node: str) -> tuple[str | None, Any]:
        room = (n for n in self.members if self._children(n) < self.fanout)
        parent = next((n for n in room if not self._below(node, n)), None)
        self.members[node]["parent"] = parent
        return parent, (self.members[parent]["server"] if parent else None)

    def join(self, node: str, server: Any, whole: bool = False) -> tuple[str | None, Any]:
        """``node`` fills its region: its parent's node and server, or (None, None) for
        the store. ``whole``: its region is whole already; it only serves (no parent)."""
        self.members.setdefault(node, {"parent": None})["server"] = server
        if whole:
            self.members[node]["parent"] = None
            return None, None
        return self._parent_for(node)

    def _drop(self, node: str) -> None:
        """``node`` leaves the tree; its children are given new parents when they ask."""
        self.members.pop(node, None)
        for member in self.members.values():
            if member["parent"] == node:
                member["parent"] = None

    def lost(self, node: str, peer: str) -> tuple[str | None, Any]:
        """``node`` could not read from ``peer``: ``peer`` leaves the tree, ``node`` gets
        another parent or the store."""
        self._drop(peer)
        if node not in self.members:
            return None, None
        return self._parent_for(node)

    def leave(self, node: str) -> None:
        """``node``'s region is gone; the directory ends with its last node."""
        self._drop(node)
        if not self.members:
            import ray

            ray.actor.exit_actor()

    def tree(self) -> dict[str, str | None]:
        """Each node's parent (None: the store)."""
        return {n: m["parent"] for n, m in self.members.items()}


def _check_name(region: Path, name: str) -> None:
    """Refuse ``name`` unless it is a weight file of ``region`` (its marker lists it): the
    only files a node serves."""
    try:
        names = {o.path for o in objects_of(region)}
    except FileNotFoundError:
        raise FileNotFoundError(f"{region} was removed") from None
    if name not in names:
        raise ValueError(f"{name!r} is not a weight file of {region}")


def read_range(region: Path, name: str, start: int, end: int) -> bytes:
    """In the node's agent: bytes ``start``..``end`` (inclusive) of ``name`` once this node
    has them; raises when its pull failed, its region went, or nothing new came in for
    STALL_S."""
    _check_name(region, name)
    last, since = -1, time.monotonic()
    while True:
        have = progress(region, name)
        if have > end or done(region, name):
            whole = done(region, name)
            path = region / name if whole else partial(region, name)
            with contextlib.suppress(FileNotFoundError):  # renamed since: look again
                with open(path, "rb") as f:
                    data = os.pread(f.fileno(), end - start + 1, start)
                if len(data) == end - start + 1:
                    return data
        if any((region / mark).exists() for mark in (FAILED, UNSHARED)):
            raise RuntimeError(f"{region} cannot serve {name}: its pull stopped")
        if not (region / CREATED).exists():
            raise FileNotFoundError(f"{region} was removed")
        if have != last:
            last, since = have, time.monotonic()
        elif time.monotonic() - since > STALL_S:
            raise TimeoutError(f"{region}: {name} stuck at {have} bytes for {STALL_S}s")
        time.sleep(POLL_S)


def file_digest(region: Path, name: str) -> str:
    """In the node's agent: the sha256 this node's own pull recorded for ``name``, once the
    file is whole (a child asks when it has copied every byte of it: the rename is moments
    away)."""
    _check_name(region, name)
    deadline = time.monotonic() + STALL_S
    while (found := digest_of(region, name)) is None or not done(region, name):
        if found is None and done(region, name):  # kept from before digests: hash it
            return sha256_of(region / name)
        if any((region / mark).exists() for mark in (FAILED, UNSHARED)):
            raise RuntimeError(f"{region} cannot vouch for {name}: its pull stopped")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{region}: {name} not whole after {STALL_S}s")
        time.sleep(POLL_S)
    return found


def leave(region: Path, node: str) -> None:
    """In the node's agent, once it has removed ``region``: this node leaves the model's
    tree, if there is one."""
    import ray

    with contextlib.suppress(ValueError):  # no directory (no peers, or it ended already)
        ray.get_actor(directory_name(region.name), namespace=NAMESPACE).leave.remote(node)


def cluster_nodes() -> int:
    import ray

    return sum(1 for n in ray.nodes() if n.get("Alive"))


class PeerRead:
    """A node's reads of its region's files: from its parent in the tree, or the store
    (``store_read``) when it has none; a parent that fails is reported and replaced."""

    def __init__(self, region: Path, node: str, store_read: Callable[[str, int, int], bytes]):
        self.region, self.node, self.store_read = region, node, store_read
        self.directory: Any = None  # none, and no parent, until :meth:`attach`
        self.parent: str | None = None
        self.server: Any = None
        self.server_pid: int | None = None
        self.lock = threading.Lock()
        self.generation = 0
        self.peer_bytes = 0
        self.store_bytes = 0
        self.lost: list[str] = []

    def _record(self) -> None:
        """``.peer.json``: this node, where it reads from, the pid of its own server."""
        record = {"node": self.node[:16], "server_pid": self.server_pid}
        write_whole(
            self.region / PEER_RECORD,
            json.dumps({**record, **dataclasses.asdict(self.status())}),
        )

    def _from_parent(self, call: Callable[[Any, str], Any]) -> tuple[str, Any] | None:
        """``call(agent, region)`` of this node's parent, awaited: the parent and its answer;
        a parent that dies, fails or stalls is replaced (:meth:`_replace`) and the next one
        asked. None once this node reads the store."""
        import ray

        while True:
            with self.lock:
                parent, server, generation = self.parent, self.server, self.generation
            if parent is None:
                return None
            try:
                agent, served = server
                return parent, ray.get(call(agent, served), timeout=STALL_S + 30)
            except Exception as exc:  # the peer died, failed or stalled: another source
                self._replace(parent, generation, exc)

    def __call__(self, name: str, start: int, end: int) -> bytes:
        served = self._from_parent(
            lambda agent, region: agent.read.remote(region, name, start, end)
        )
        data = served[1] if served else self.store_read(name, start, end)
        with self.lock:
            if served:
                self.peer_bytes += len(data)
            else:
                self.store_bytes += len(data)
        return data

    def digest(self, name: str) -> tuple[str, str] | None:
        """The sha256 of ``name`` as the node this one copies from recorded it, and that
        node (for the check of what was copied); None when this node reads the store (its
        ETag, and MD5 where the ETag is one, are checked instead) or no peer can vouch for
        it any more (the peers' directory is gone: a warning says so). Any peer holds the
        same digest: one that dies or fails is replaced."""
        found = self._from_parent(lambda agent, region: agent.digest.remote(region, name))
        if found is None:
            if self.peer_bytes:
                logger.warning(
                    "%s: part of it came from a peer that is gone, and no other peer "
                    "can vouch for it; checked by size (and MD5 where the ETag is one)",
                    name,
                )
            return None
        return str(found[1]), f"peer node {found[0][:16]}"

    def attach(self, fanout: int) -> bool:
        """Join the tree (:func:`_attach`; False where that failed: the store); where the
        directory gives this node a parent, the ranges not yet read come from that peer. A
        node alone in its cluster attaches beside its pull, reading the store meanwhile."""
        joined = _attach(self.region, self.node, fanout)
        if joined is None:
            return False
        with self.lock:
            self.directory, (self.parent, self.server), self.server_pid = joined
            self.generation += 1
            self._record()
        return True

    def _replace(self, parent: str, generation: int, exc: BaseException) -> None:
        import ray

        with self.lock:
            if self.generation != generation:
                return  # another range reported it already
            self.generation += 1
            self.lost.append(parent)
            try:
                self.parent, self.server = ray.get(
                    self.directory.lost.remote(self.node, parent), timeout=30
                )
            except Exception as err:  # the directory is gone too: the store
                logger.warning("The peers' directory is gone (%s): reading the store", err)
                self.parent, self.server = None, None
            logger.warning(
                "Peer node %s stopped serving (%s: %s); reading from %s",
                parent[:16],
                type(exc).__name__,
                (str(exc).splitlines() or [""])[0][:300],
                f"node {self.parent[:16]}" if self.parent else "the store",
            )
            self._record()

    def status(self) -> PullSource:
        return PullSource(
            source=f"peer {self.parent[:16]}" if self.parent else "store",
            peer_bytes=self.peer_bytes,
            store_bytes=self.store_bytes,
            peers_lost=tuple(p[:16] for p in self.lost),
        )


def _attach(
    region: Path, node: str, fanout: int, whole: bool = False
) -> tuple[Any, tuple[str | None, Any], int] | None:
    """This node's region served by its agent, and the tree joined: the directory, this
    node's parent (node and server: that node's agent and region; (None, None): the store)
    and this node's agent's pid; None where there is no agent or Ray refused (a warning
    says so: the store, as without peers). The agent keeps the region (its holders asked it
    before the pull began: ``weights.region.NodeWeights``' keeper) and serves it until it
    removes it; the node then leaves the tree (:func:`leave`), and the directory ends with
    its last member. A region removed before this node was in the tree leaves it from here."""
    import ray

    key = region.name
    try:
        server = (ray.get_actor(agent_name(node), namespace=NAMESPACE), str(region))
    except ValueError:
        logger.warning(
            "No node agent keeps %s (its holders' keeper is not the agent): this node "
            "serves no peer and reads the store",
            region,
        )
        return None
    try:
        for attempt in range(3):  # a directory that ended as this node asked: make another
            directory = library_actor(Directory, directory_name(key)).remote(fanout)
            try:
                parent = ray.get(directory.join.remote(node, server, whole), timeout=60)
                break
            except ray.exceptions.RayActorError:
                if attempt == 2:
                    raise
        if not (region / CREATED).exists():  # its agent may have left before this joined
            directory.leave.remote(node)
        server_pid = ray.get(server[0].pid.remote(), timeout=60)
    except Exception as exc:
        logger.warning(
            "Could not join the peers of %s (%s: %s): this node reads the store",
            region,
            type(exc).__name__,
            exc,
        )
        return None
    return directory, parent, server_pid


def join(
    region: Path, store_read: Callable[[str, int, int], bytes], fanout: int
) -> PeerRead | None:
    """In a Ray worker pulling ``region``: the region served by this node's agent, the tree
    joined; the reads to pull with, or None (not in Ray, or Ray refused: the store, as without
    peers). A node alone in its cluster reads the store at once and joins beside its pull
    (:meth:`PeerRead.attach`): the directory and its server are there for the nodes that
    join later."""
    import ray

    if not ray.is_initialized():
        return None
    peer = PeerRead(region, ray.get_runtime_context().get_node_id(), store_read)
    if cluster_nodes() < 2:
        peer._record()
        threading.Thread(
            target=peer.attach, args=(fanout,), daemon=True, name="rsl-peers-join"
        ).start()
        return peer
    if not peer.attach(fanout):
        return None
    logger.info(
        "Weights of %s from %s",
        region,
        f"peer node {peer.parent[:16]}" if peer.parent else "the store",
    )
    return peer


def serve(region: Path, fanout: int) -> None:
    """In a Ray worker that found ``region`` whole (nothing to pull: kept warm, perhaps
    from an earlier Ray session whose actors are gone): this node's server started and in
    the tree, in the background, so that nodes that join later copy from it."""
    import ray

    if not ray.is_initialized():
        return
    node = ray.get_runtime_context().get_node_id()
    threading.Thread(
        target=_attach, args=(region, node, fanout, True), daemon=True, name="rsl-peers-serve"
    ).start()
