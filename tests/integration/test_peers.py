"""A node's region filled from another node's over Ray (integrations/ray/peers.py): three
Ray nodes on this machine (``ray.cluster_utils.Cluster``), each with its own object store,
so what one node serves another crosses Ray's object manager. The store sits behind a
link of 1 MiB/s (a bucket's share), so the tree fills while its root still reads. Measured
by the store's access log, the regions' bytes and the pulls' own status."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import time
from pathlib import Path

import pytest
from helpers.s3log import AccessLog, copy_model, prefix_of
from helpers.waiting import wait_until

from ray_stream_llm.errors import ObjectChangedError
from ray_stream_llm.fetch import fetch_metadata_report
from ray_stream_llm.integrations.ray import peers
from ray_stream_llm.integrations.ray.agent import agent_name
from ray_stream_llm.tools.link import Link
from ray_stream_llm.weights import marks, pull

pytestmark = [pytest.mark.s3, pytest.mark.e2e]

NODES = ("node_a", "node_b", "node_c")


@pytest.fixture
def base():
    path = Path("/dev/shm") / f"rsl-test-{os.getpid()}-{time.monotonic_ns()}"
    yield path
    import shutil

    shutil.rmtree(path, ignore_errors=True)


def _ray_nodes(work, monkeypatch, names):
    """Ray nodes, one user slot each (resource ``<name>``); stopped after the test."""
    import ray
    from ray.cluster_utils import Cluster

    monkeypatch.setenv("RAY_TMPDIR", str(work))
    made = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "resources": {names[0]: 1}, "include_dashboard": False},
    )
    for name in names[1:]:
        made.add_node(num_cpus=1, resources={name: 1})
    yield made
    ray.shutdown()
    made.shutdown()


@pytest.fixture
def cluster(work, monkeypatch):
    """Three Ray nodes, one user slot each."""
    yield from _ray_nodes(work, monkeypatch, NODES)


@pytest.fixture
def first_nodes(work, monkeypatch, request):
    """``request.param`` Ray nodes (the test adds the others)."""
    yield from _ray_nodes(work, monkeypatch, NODES[: request.param])


def _users(cluster, env, uri, base, nodes=NODES):
    import ray

    if not ray.is_initialized():
        ray.init(address=cluster.address, runtime_env={"env_vars": env})

    @ray.remote(num_cpus=0.1)
    class User:
        def __init__(self, uri_text, base_dir):
            from ray_stream_llm.fetch import fetch_metadata_report
            from ray_stream_llm.integrations.ray import node, peers
            from ray_stream_llm.uri import parse_model_uri
            from ray_stream_llm.weights.pull import start_pull
            from ray_stream_llm.weights.region import NodeWeights, Sharing

            report = fetch_metadata_report(uri_text)
            self.objects = report.weight_objects
            uri = parse_model_uri(report.uri)
            # as a job's actors hold it: the node's agent keeps it (and serves it); pulled
            # here, so that a test may end the server alone
            holder = dataclasses.replace(
                node.holder(),
                puller=lambda region: start_pull(region, uri, self.objects, peers=peers),
            )
            self.weights = NodeWeights(
                uri, report.weight_objects, Sharing("node", base=base_dir, peers=True), holder
            )
            self.region = self.weights.acquire()

        def where(self):
            return self.region, ray.get_runtime_context().get_node_id()

        def wait(self):
            from ray_stream_llm.weights.reading import wait_for

            for o in self.objects:
                wait_for(self.region, o.path, timeout=300)

        def done(self):
            self.weights.release()

    # half a node's slot: two users may share a node
    return [User.options(resources={n: 0.5}).remote(uri, str(base)) for n in nodes]


def _named_actors():
    """The peers' directories left (the node agents end on their own once idle: the suite's
    end checks that none is left)."""
    import ray

    return [
        a
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a["namespace"] == "ray_stream_llm" and not a["name"].startswith("rsl-agent-")
    ]


def _tree(key: str) -> dict:
    """The model's directory's tree (each node's parent), {} before it is made."""
    import ray

    try:
        directory = ray.get_actor(peers.directory_name(key), namespace=peers.NAMESPACE)
        return dict(ray.get(directory.tree.remote(), timeout=30))
    except (ValueError, ray.exceptions.RayActorError):
        return {}


def _finish(users, regions):
    """Every user lets go; every region and every peer actor is gone."""
    import ray

    ray.get([u.done.remote() for u in users])

    def left() -> tuple[list, list]:
        return [r for r in regions if Path(r).exists()], _named_actors()

    wait_until(lambda: not any(left()), 30, lambda: repr(left()), poll=0.5)


def _statuses(regions):
    """Each region's pull record: written just after its last file is whole (what the
    users waited for), so read once the pull has ended; in its file's JSON form."""
    return {r: json.loads(pull.finished_pull(r).to_json()) for r in regions}


def test_three_nodes_read_the_store_once_and_fill_from_each_other(
    s3_server, s3_env, tiny_models, base, cluster
):
    """One node reads the store; the other two fill from it (or from each other) over Ray
    while it still reads; every region equals the store's bytes; the store served each
    weight object once for the cluster; nothing is left after the users let go."""
    import ray

    model = copy_model(s3_server, tiny_models["sharded"], "peers-once")
    objects = fetch_metadata_report(model.uri).weight_objects
    size = sum(o.size for o in objects)
    log = AccessLog(s3_server)
    with Link(s3_server.port, rate=1 << 20, burst=256 << 10) as link:
        users = _users(cluster, link.store_env(dict(s3_env)), model.uri, base)
        where = ray.get([u.where.remote() for u in users])
        ray.get([u.wait.remote() for u in users])
    regions = [r for r, _ in where]
    assert len(set(regions)) == 3 and len({n for _, n in where}) == 3  # a region per node
    for region in regions:
        for o in objects:
            assert (Path(region) / o.path).read_bytes() == (model.local / o.path).read_bytes()
    gets = log.gets(prefix_of(model.uri))
    assert {k: v for k, v in gets.items() if k.endswith(".safetensors")} == {
        prefix_of(model.uri) + o.path: math.ceil(o.size / pull.CHUNK) for o in objects
    }  # once for the cluster
    status = _statuses(regions)
    print(json.dumps(status, indent=1))
    [root] = [r for r, s in status.items() if s["source"] == "store"]
    children = [s for r, s in status.items() if r != root]
    assert all(s["source"].startswith("peer ") and s["store_bytes"] == 0 for s in children)
    assert all(s["peer_bytes"] == size for s in children)
    # the children filled while the root still read the store (1 MiB/s: seconds)
    assert all(s["started"] < status[root]["finished"] for s in children)
    _finish(users, regions)


@pytest.mark.parametrize("first_nodes", [2, 1], indirect=True, ids=["after-two", "after-one"])
def test_a_node_added_after_the_others_filled_fills_from_a_peer(
    s3_server, s3_env, tiny_models, base, first_nodes
):
    """Issue 33 item 3 (an autoscaled or replaced node): the cluster's first nodes fill
    (one from the store, the other from it; or one node alone, whose pull starts the
    directory and its server beside it); a node joins the cluster afterwards and a user on
    it takes the region: it copies every byte from a peer and reads none from the store,
    the store served each weight range once for the whole cluster, and nothing is left."""
    import ray

    model = copy_model(s3_server, tiny_models["sharded"], "peers-later")
    objects = fetch_metadata_report(model.uri).weight_objects
    size = sum(o.size for o in objects)
    log = AccessLog(s3_server)
    env = dict(s3_env)
    before = len(first_nodes.list_all_nodes())  # 2 or 1
    first = _users(first_nodes, env, model.uri, base, nodes=NODES[:before])
    ray.get([u.wait.remote() for u in first])
    where = ray.get([u.where.remote() for u in first])
    regions = [r for r, _ in where]
    status = _statuses(regions)
    sources = sorted(s["source"].split()[0] for s in status.values())
    assert sources == ["peer", "store"][2 - before :], status
    # each is in the model's directory with its server (a node alone joins beside its
    # pull: wait for it), they are whole and their users hold them: a node joins now
    key = Path(regions[0]).name
    wait_until(lambda: len(_tree(key)) >= before, 60, lambda: repr(_tree(key)), poll=0.1)
    assert peers.cluster_nodes() == before
    first_nodes.add_node(num_cpus=1, resources={NODES[before]: 1})
    first_nodes.wait_for_nodes()
    [late] = _users(first_nodes, env, model.uri, base, nodes=[NODES[before]])
    ray.get(late.wait.remote())
    late_region, late_node = ray.get(late.where.remote())
    assert late_node not in {n for _, n in where} and late_region not in regions
    for o in objects:
        assert (Path(late_region) / o.path).read_bytes() == (model.local / o.path).read_bytes()
    late_status = _statuses([late_region])[late_region]
    print(json.dumps({**status, late_region: late_status}, indent=1))
    assert late_status["source"].startswith("peer "), late_status
    assert late_status["store_bytes"] == 0 and late_status["peer_bytes"] == size, late_status
    gets = log.gets(prefix_of(model.uri))
    assert {k: v for k, v in gets.items() if k.endswith(".safetensors")} == {
        prefix_of(model.uri) + o.path: math.ceil(o.size / pull.CHUNK) for o in objects
    }  # once for the whole cluster
    _finish([*first, late], [*regions, late_region])


@pytest.mark.parametrize("first_nodes", [1], indirect=True)
def test_a_whole_region_taken_again_serves_the_nodes_that_join_later(
    s3_server, s3_env, tiny_models, base, first_nodes
):
    """A node's region is whole and its server, the node's agent, is gone (as when the
    region was kept warm from an earlier Ray session, whose actors ended with it: here the
    agent is killed); a second user on that node takes the region, which has nothing to
    pull: the node's server starts again and is in the tree, so a node added afterwards
    copies from it and reads nothing from the store."""
    import ray

    model = copy_model(s3_server, tiny_models["sharded"], "peers-whole")
    size = sum(o.size for o in fetch_metadata_report(model.uri).weight_objects)
    env = dict(s3_env)
    [first] = _users(first_nodes, env, model.uri, base, nodes=NODES[:1])
    ray.get(first.wait.remote())
    region, node = ray.get(first.where.remote())
    key = Path(region).name
    wait_until(lambda: _tree(key) == {node: None}, 60, lambda: repr(_tree(key)), poll=0.1)
    old = ray.get_actor(agent_name(node), namespace=peers.NAMESPACE)  # the node's server
    old_pid = ray.get(old.pid.remote())
    ray.kill(old)
    [again] = _users(first_nodes, env, model.uri, base, nodes=NODES[:1])
    assert ray.get(again.where.remote()) == (region, node)  # the same region, whole

    def server_pid() -> int | None:
        try:
            server = ray.get_actor(agent_name(node), namespace=peers.NAMESPACE)
            return int(ray.get(server.pid.remote(), timeout=10))
        except (ValueError, ray.exceptions.RayActorError):
            return None

    wait_until(
        lambda: server_pid() not in (None, old_pid),
        60,
        "the node's server never started again",
        poll=0.1,
    )
    first_nodes.add_node(num_cpus=1, resources={NODES[1]: 1})
    first_nodes.wait_for_nodes()
    [late] = _users(first_nodes, env, model.uri, base, nodes=NODES[1:2])
    ray.get(late.wait.remote())
    late_region, _ = ray.get(late.where.remote())
    status = _statuses([late_region])[late_region]
    print(json.dumps(status, indent=1))
    assert status["source"] == f"peer {node[:16]}" and status["peers_lost"] == [], status
    assert status["store_bytes"] == 0 and status["peer_bytes"] == size, status
    _finish([first, again, late], [region, late_region])


def test_a_byte_damaged_in_a_peers_copy_is_a_typed_error_never_a_served_weight(
    s3_server, s3_env, tiny_models, base, cluster, tmp_path
):
    """Issue 35: a weight object uploaded in two parts (its ETag, ``<hex>-2``, is no MD5 of
    its bytes, so a copy of it cannot be checked against the store's ETag). Node A pulls it
    from the store and records each file's sha256; one byte of A's copy is then flipped in
    its memory. Node B, filling from A, hashes what it copied and compares with A's record:
    ObjectChangedError naming the object and the peer, and B's region never lists the file
    (nothing reads it)."""
    import uuid

    import numpy as np
    import ray
    from safetensors.numpy import save_file

    from ray_stream_llm.weights.marks import failure

    # the single-file model, its weights 6 MiB (S3's parts are 5 MiB at least but the last)
    local = tmp_path / "model"
    shutil.copytree(tiny_models["single"].local, local)
    name = "model.safetensors"
    save_file({"w": np.arange(6 << 18, dtype=np.float32)}, str(local / name))
    uri = f"s3://models/tiny/fetch-test/peers-damaged-{uuid.uuid4().hex[:8]}/"
    s3_server.upload_dir(local, uri)
    body = (local / name).read_bytes()
    client, key = s3_server.client(), prefix_of(uri) + name
    upload = client.create_multipart_upload(Bucket="models", Key=key)["UploadId"]
    half = 5 << 20
    parts = [
        {"PartNumber": n, "ETag": client.upload_part(
            Bucket="models", Key=key, UploadId=upload, PartNumber=n, Body=chunk)["ETag"]}
        for n, chunk in ((1, body[:half]), (2, body[half:]))
    ]  # fmt: skip
    client.complete_multipart_upload(
        Bucket="models", Key=key, UploadId=upload, MultipartUpload={"Parts": parts}
    )
    [obj] = fetch_metadata_report(uri).weight_objects
    assert obj.etag.endswith("-2"), obj.etag  # multipart: no MD5 to check a copy against

    [a] = _users(cluster, dict(s3_env), uri, base, nodes=NODES[:1])
    ray.get(a.wait.remote())
    region_a, _ = ray.get(a.where.remote())
    with open(Path(region_a) / name, "r+b") as f:  # one byte of A's copy, in its memory
        f.seek(len(body) // 3)
        byte = f.read(1)
        f.seek(len(body) // 3)
        f.write(bytes([byte[0] ^ 0x01]))

    [b] = _users(cluster, dict(s3_env), uri, base, nodes=NODES[1:2])
    region_b, _ = ray.get(b.where.remote())
    with pytest.raises(ray.exceptions.RayTaskError) as err:
        ray.get(b.wait.remote())
    # the waiter's error crosses Ray's boundary as its class: Ray's wrapper is an instance of it
    assert isinstance(err.value, ObjectChangedError), type(err.value).__mro__
    kind, failed = failure(Path(region_b)) or ("", "no .failed mark")
    print(f"\nnode B's pull: {kind}: {failed}")
    assert kind == "ObjectChangedError" and repr(name) in failed, (kind, failed)
    assert "copied from peer node" in failed and "sha256" in failed, failed
    assert "the shared pull of the weights failed" in str(err.value), err.value
    assert not (Path(region_b) / name).exists()  # never under its name: nobody reads it
    _finish([a, b], [region_a, region_b])


def test_a_peer_killed_mid_copy_is_replaced_and_every_region_completes(
    s3_server, s3_env, tiny_models, base, cluster
):
    """The root's server (its node agent) is killed while the others copy from it: they
    report it lost, the directory gives one of them the store and the other that one (never
    a cycle), and every region completes with the store's bytes."""
    import ray

    model = copy_model(s3_server, tiny_models["sharded"], "peers-kill")
    objects = fetch_metadata_report(model.uri).weight_objects
    with Link(s3_server.port, rate=1 << 20, burst=256 << 10) as link:
        users = _users(cluster, link.store_env(dict(s3_env)), model.uri, base)
        where = ray.get([u.where.remote() for u in users])
        regions = [r for r, _ in where]
        key = Path(regions[0]).name
        seen: dict = {}

        def joined() -> dict | None:  # the pulls join in the users' background threads
            try:
                directory = ray.get_actor(peers.directory_name(key), namespace=peers.NAMESPACE)
            except ValueError:
                return None  # not made yet
            seen.update(tree=ray.get(directory.tree.remote()))
            return seen["tree"] if len(seen["tree"]) >= 3 else None

        tree = wait_until(joined, 60, lambda: repr(seen.get("tree", {})), poll=0.1)
        [root] = [n for n, parent in tree.items() if parent is None]
        # mid-copy: the root has part of the weights, not all
        root_region = next(r for r, n in where if n == root)
        wait_until(
            lambda: any(peers.progress(Path(root_region), o.path) for o in objects),
            60,
            f"no progress in the root's region {root_region}",
        )
        assert not all(marks.done(Path(root_region), o.path) for o in objects)
        ray.kill(ray.get_actor(agent_name(root), namespace=peers.NAMESPACE))  # its server
        ray.get([u.wait.remote() for u in users])
    for region in regions:
        for o in objects:
            assert (Path(region) / o.path).read_bytes() == (model.local / o.path).read_bytes()
    status = _statuses(regions)
    print(json.dumps(status, indent=1))
    children = [s for r, s in status.items() if r != root_region]
    assert all(s["peers_lost"] == [root[:16]] or s["peers_lost"] == [] for s in children)
    assert any(s["peers_lost"] == [root[:16]] for s in children)
    # one of them took the store over, the other copied from it
    assert sorted(s["source"].split()[0] for s in children) == ["peer", "store"]
    _finish(users, regions)


def test_the_directory_builds_a_tree_and_never_a_cycle():
    """The directory's choices, without Ray: each node's parent is the earliest with room
    (fan-out 2: a tree, not a star); a lost parent hands its children to other nodes that
    are not below them, or to the store."""
    d = peers.Directory(2)
    assert d.join("a", "server-a") == (None, None)  # the first reads the store
    assert d.join("b", "server-b") == ("a", "server-a")
    assert d.join("c", "server-c") == ("a", "server-a")
    assert d.join("d", "server-d") == ("b", "server-b")  # a serves two already
    assert d.join("e", "server-e") == ("b", "server-b")
    assert d.join("f", "server-f") == ("c", "server-c")
    # b is lost: d and e get new parents with room (a serves c alone now)
    assert d.lost("d", "b") == ("a", "server-a")
    assert d.lost("e", "b") == ("c", "server-c")
    assert d.tree() == {"a": None, "c": "a", "d": "a", "e": "c", "f": "c"}
    # the root is lost: its children ask in turn, and never get one below themselves
    assert d.lost("c", "a") == ("d", "server-d")
    assert d.lost("d", "a") == (None, None)  # c, e and f are below d now: the store
    d.leave("f")
    assert d.tree() == {"c": "d", "d": None, "e": "c"}
    chain = peers.Directory(1)
    assert [chain.join(n, n)[0] for n in "xyz"] == [None, "x", "y"]
    assert chain.lost("z", "y") == ("x", "x")  # the middle is lost: the tail goes to the root
