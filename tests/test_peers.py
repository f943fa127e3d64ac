"""A node's region filled from another node's over Ray (issue 22, weights/peers.py): three
Ray nodes on this machine (``ray.cluster_utils.Cluster``), each with its own object store,
so what one node serves another crosses Ray's object manager. The store sits behind a
link of 1 MiB/s (a bucket's share), so the tree fills while its root still reads. Measured
by the store's access log, the regions' bytes and the pulls' own status."""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from pathlib import Path

import pytest
from helpers.s3log import AccessLog, copy_model, prefix_of

from ray_stream_llm.fetch import fetch_metadata_report
from ray_stream_llm.tools.link import Link
from ray_stream_llm.weights import peers
from ray_stream_llm.weights import region as node_weights

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
            from ray_stream_llm.uri import parse_model_uri
            from ray_stream_llm.weights.region import NodeWeights, Sharing

            report = fetch_metadata_report(uri_text)
            self.objects = report.weight_objects
            self.weights = NodeWeights(
                parse_model_uri(report.uri),
                report.weight_objects,
                Sharing("node", base=base_dir, peers=True),
            )
            self.region = self.weights.acquire()

        def where(self):
            return self.region, ray.get_runtime_context().get_node_id()

        def wait(self):
            from ray_stream_llm.weights.region import wait_for

            for o in self.objects:
                wait_for(self.region, o.path, timeout=300)

        def done(self):
            self.weights.release()

    # half a node's slot: two users may share a node
    return [User.options(resources={n: 0.5}).remote(uri, str(base)) for n in nodes]


def _named_actors():
    import ray

    return [
        a
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a["namespace"] == "ray_stream_llm"
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
    deadline = time.monotonic() + 30
    while any(Path(r).exists() for r in regions) or _named_actors():
        assert time.monotonic() < deadline, (
            [r for r in regions if Path(r).exists()],
            _named_actors(),
        )
        time.sleep(0.5)


def _statuses(regions):
    return {r: json.loads((Path(r) / ".pull.json").read_text()) for r in regions}


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
        prefix_of(model.uri) + o.path: math.ceil(o.size / node_weights.CHUNK) for o in objects
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
    deadline = time.monotonic() + 60
    while len(_tree(key)) < before:
        assert time.monotonic() < deadline, _tree(key)
        time.sleep(0.1)
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
        prefix_of(model.uri) + o.path: math.ceil(o.size / node_weights.CHUNK) for o in objects
    }  # once for the whole cluster
    _finish([*first, late], [*regions, late_region])


@pytest.mark.parametrize("first_nodes", [1], indirect=True)
def test_a_whole_region_taken_again_serves_the_nodes_that_join_later(
    s3_server, s3_env, tiny_models, base, first_nodes
):
    """A node's region is whole and its server is gone (as when the region was kept warm
    from an earlier Ray session, whose actors ended with it: here the server is killed);
    a second user on that node takes the region, which has nothing to pull: the node's
    server starts again and is in the tree, so a node added afterwards copies from it and
    reads nothing from the store."""
    import ray

    model = copy_model(s3_server, tiny_models["sharded"], "peers-whole")
    size = sum(o.size for o in fetch_metadata_report(model.uri).weight_objects)
    env = dict(s3_env)
    [first] = _users(first_nodes, env, model.uri, base, nodes=NODES[:1])
    ray.get(first.wait.remote())
    region, node = ray.get(first.where.remote())
    key = Path(region).name
    deadline = time.monotonic() + 60
    while _tree(key) != {node: None}:
        assert time.monotonic() < deadline, _tree(key)
        time.sleep(0.1)
    old = ray.get_actor(peers.server_name(key, node), namespace=peers.NAMESPACE)
    old_pid = ray.get(old.pid.remote())
    ray.kill(old)
    [again] = _users(first_nodes, env, model.uri, base, nodes=NODES[:1])
    assert ray.get(again.where.remote()) == (region, node)  # the same region, whole

    def server_pid() -> int | None:
        try:
            server = ray.get_actor(peers.server_name(key, node), namespace=peers.NAMESPACE)
            return int(ray.get(server.pid.remote(), timeout=10))
        except (ValueError, ray.exceptions.RayActorError):
            return None

    while server_pid() in (None, old_pid):
        assert time.monotonic() < deadline, "the node's server never started again"
        time.sleep(0.1)
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

    from ray_stream_llm.weights.marks import FAILED

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
    failed = (Path(region_b) / FAILED).read_text()
    print(f"\nnode B's pull: {failed}")
    assert "ObjectChangedError" in failed and repr(name) in failed, failed
    assert "copied from peer node" in failed and "sha256" in failed, failed
    assert "the shared pull of the weights failed" in str(err.value), err.value
    assert not (Path(region_b) / name).exists()  # never under its name: nobody reads it
    _finish([a, b], [region_a, region_b])


def test_a_peer_killed_mid_copy_is_replaced_and_every_region_completes(
    s3_server, s3_env, tiny_models, base, cluster
):
    """The root's server is killed while the others copy from it: they report it lost, the
    directory gives one of them the store and the other that one (never a cycle), and every
    region completes with the store's bytes."""
    import ray

    model = copy_model(s3_server, tiny_models["sharded"], "peers-kill")
    objects = fetch_metadata_report(model.uri).weight_objects
    with Link(s3_server.port, rate=1 << 20, burst=256 << 10) as link:
        users = _users(cluster, link.store_env(dict(s3_env)), model.uri, base)
        where = ray.get([u.where.remote() for u in users])
        regions = [r for r, _ in where]
        key = Path(regions[0]).name
        deadline = time.monotonic() + 60
        tree: dict = {}
        while len(tree) < 3:  # the pulls join in the users' background threads
            assert time.monotonic() < deadline, tree
            time.sleep(0.1)
            try:
                directory = ray.get_actor(peers.directory_name(key), namespace=peers.NAMESPACE)
            except ValueError:
                continue  # not made yet
            tree = ray.get(directory.tree.remote())
        [root] = [n for n, parent in tree.items() if parent is None]
        # mid-copy: the root has part of the weights, not all
        root_region = next(r for r, n in where if n == root)
        while not any(peers.progress(Path(root_region), o.path) for o in objects):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert not all(node_weights.done(Path(root_region), o.path) for o in objects)
        ray.kill(ray.get_actor(peers.server_name(key, root), namespace=peers.NAMESPACE))
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


QUESTIONS = [f"Count to {n}." for n in range(1, 7)]


def _regions_now(base: Path) -> dict[Path, dict]:
    records = {}
    for record in base.glob("*/*/.peer.json"):
        try:
            records[record.parent] = json.loads(record.read_text())
        except (OSError, ValueError):
            continue  # being replaced
    return records


def _kill_the_middle_mid_copy(base: Path, objects, local: Path, seen: dict, stop) -> None:
    """In the test, beside the job: once the three nodes form their chain (root -> middle ->
    tail), SIGKILL the middle node's server while the tail has part of the weights, then,
    once every region is complete (the engines still hold them), compare each with the
    model's bytes."""
    import signal

    def complete(region: Path) -> bool:
        return all(node_weights.done(region, o.path) for o in objects)

    while not stop.is_set() and "killed" not in seen:
        records = _regions_now(base)
        parents = {
            r["node"]: r["source"].removeprefix("peer ") if r["source"] != "store" else None
            for r in records.values()
        }
        middle = [n for n, p in parents.items() if p and n in parents.values()]
        if len(records) == 3 and middle:
            regions = {r["node"]: (region, r) for region, r in records.items()}
            [tail] = [n for n, p in parents.items() if p == middle[0]]
            tail_region = regions[tail][0]
            if complete(tail_region):
                seen["too_late"] = True  # the tail had it all: the link was too fast
                return
            if any(peers.progress(tail_region, o.path) for o in objects):
                os.kill(regions[middle[0]][1]["server_pid"], signal.SIGKILL)
                seen["killed"] = {
                    "middle": middle[0],
                    "tail": tail,
                    "tail_had": {o.path: peers.progress(tail_region, o.path) for o in objects},
                }
        time.sleep(0.02)
    while not stop.is_set():
        regions = list(_regions_now(base))
        if len(regions) == 3 and all(complete(r) for r in regions):
            seen["equal"] = {
                str(r): all(
                    (r / o.path).read_bytes() == (local / o.path).read_bytes() for o in objects
                )
                for r in regions
            }
            return
        time.sleep(0.1)


@pytest.mark.engine
def test_a_job_on_three_nodes_reads_the_store_once_and_survives_a_dead_peer(
    s3_server, s3_env, tiny_models, work
):
    """The issue's job: three Ray nodes with one engine slot each (and a head for the CPU
    stages), the store behind a 48 KiB/s link, weight_peers=1 so that the nodes form a
    chain (root -> middle -> tail). The middle node's server is killed (SIGKILL) while the
    tail copies from it: the tail reports it lost and copies the rest from the root. Every
    row is answered; the store's access log shows each weight object read once for the
    whole cluster; every region equals the store's bytes; no region, peer actor or
    segment is left."""
    import threading

    from helpers.jobs import run_isolated, store_through
    from helpers.s3log import AccessLog

    from ray_stream_llm.weights.region import DEFAULT_BASE

    model = copy_model(s3_server, tiny_models["sharded"], "peers-job")
    objects = fetch_metadata_report(model.uri).weight_objects
    log = AccessLog(s3_server)
    seen: dict = {}
    stop = threading.Event()
    # room on each engine node for the engine and one actor of each CPU stage (Ray Data
    # spreads those), so that no engine waits for a CPU
    slot = {"num_cpus": 4, "resources": {"slot": 1}}
    with Link(s3_server.port, rate=48 << 10, burst=256 << 10) as link:
        killer = threading.Thread(
            target=_kill_the_middle_mid_copy,
            args=(Path(DEFAULT_BASE), objects, model.local, seen, stop),
            daemon=True,
        )
        killer.start()
        try:
            out, written, seconds = run_isolated(
                s3_server,
                work,
                model.uri,
                "runai_streamer",
                QUESTIONS,
                max_tokens=4,
                config={
                    "weight_peers": 1,
                    "concurrency": [3, 3],
                    "placement_group_config": {"bundles": [{"CPU": 1, "slot": 1}]},
                },
                # the store's settings in the config, through the link
                object_store=store_through(s3_server, link.endpoint_url),
                nodes=[{"num_cpus": 4}, slot, slot, slot],
            )
        finally:
            stop.set()
            killer.join(timeout=10)
    print(json.dumps({k: v for k, v in out.items() if k == "load_reports"}, indent=1)[:6000])
    print(json.dumps(seen, indent=1))
    assert "too_late" not in seen and "killed" in seen, seen
    answers = {r["question"]: r["answer"] for r in out["rows"]}
    assert sorted(answers) == sorted(QUESTIONS) and all(answers.values()), out["rows"]
    # the store served each weight object once for the three nodes: each 8 MiB range once,
    # and the two reads of the driver's preflight (the header's length, then the header)
    gets = log.gets(prefix_of(model.uri))
    assert {k: v for k, v in gets.items() if k.endswith(".safetensors")} == {
        prefix_of(model.uri) + o.path: math.ceil(o.size / node_weights.CHUNK) + 2 for o in objects
    }, gets
    assert seen["equal"] and all(seen["equal"].values()), seen
    reports = out["load_reports"]
    assert len(reports) == 3 and all(r["weight_sharing"] == "node" for r in reports), reports
    assert sorted(r["pull_source"].split()[0] for r in reports) == ["peer", "peer", "store"]
    # nothing left: regions (run_isolated waited for their reapers), peer actors, segments
    assert written == {} and out["peer_actors_left"] == [] and out["shm_left"] == []
    print(f"three nodes, a dead peer: {seconds:.1f}s, {link.bytes_down} bytes through the link")


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
