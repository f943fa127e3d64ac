"""The node's one pull of the weights (issue 12), without Ray: against the real S3 server,
measured by its access log and the files in the memory-backed region."""

from __future__ import annotations

import dataclasses
import math
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from helpers.s3log import AccessLog, copy_model, prefix_of
from helpers.waiting import wait_until

from ray_stream_llm.errors import ModelNotFoundError, WeightSharingError
from ray_stream_llm.fetch import fetch_metadata_report
from ray_stream_llm.stores import ObjectInfo
from ray_stream_llm.tools.link import Link
from ray_stream_llm.uri import parse_model_uri
from ray_stream_llm.weights import lifetime, marks, pull, reading
from ray_stream_llm.weights.reading import wait_for
from ray_stream_llm.weights.region import NodeWeights, Sharing

pytestmark = [pytest.mark.s3]


@pytest.fixture
def base(tmp_path_factory):
    """A region base on /dev/shm (memory-backed), private to the test, removed after."""
    path = Path("/dev/shm") / f"rsl-test-{os.getpid()}-{time.monotonic_ns()}"
    yield path
    import shutil

    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def spawn(base):
    """``subprocess.Popen`` for the test's holders: one still running when the test ends (a
    failure before its own kill or release) is killed before ``base`` is removed, so that
    it writes nothing there after."""
    started: list[subprocess.Popen] = []

    def start(*args, **kwargs) -> subprocess.Popen:
        started.append(subprocess.Popen(*args, **kwargs))
        return started[-1]

    yield start
    for proc in started:
        proc.kill()  # (a process that ended already: nothing is sent)
        proc.communicate()


def _wait_gone(region: Path, timeout: float = 20.0) -> None:
    wait_until(lambda: not region.exists(), timeout, f"{region} is still there", poll=0.2)


def _weights(s3_server, tiny_models, name):
    model = copy_model(s3_server, tiny_models["sharded"], name)
    report = fetch_metadata_report(model.uri)
    return model, parse_model_uri(model.uri), report.weight_objects


def test_each_weight_source_gives_vllm_its_weights_and_lets_go(
    s3_server, s3_env, tiny_models, base
):
    """The engine actor's view (weights.source): without sharing, the store's URI and each
    file's size; with it, the node's region, whose files the loader streams (its marker's
    list, each once complete, equal to the store's), its pull's status, and gone once
    released; a region the pull gave up ('auto') hands the engine over to the store, saying
    why."""
    from ray_stream_llm.weights import source

    model = copy_model(s3_server, tiny_models["sharded"], "sources")
    uri = parse_model_uri(model.uri)
    fetched = fetch_metadata_report(model.uri)
    store = source.acquire(uri, fetched, None)
    assert (store.model_weights, store.sharing) == (model.uri, "off")
    assert store.prepare() is store and store.pull() is None
    assert store.sizes() == dict(fetched.streamable)

    shared = source.acquire(uri, fetched, Sharing("node", base=str(base)))
    # vLLM is given the URI on every node (its compile key hashes it); the loader finds the
    # region the engine actor names in reading.REGION_ENV
    assert shared.model_weights == model.uri
    region = Path(shared.region)
    assert (region.parent.parent, shared.sharing) == (base, "node")
    assert shared.prepare() is shared
    os.environ[reading.REGION_ENV] = str(region)
    try:
        files = reading.planned_files(shared.model_weights)  # what the loader streams
    finally:
        del os.environ[reading.REGION_ENV]
    assert reading.planned_files(shared.model_weights) is None  # no region named: the store
    assert files == reading.planned_files(region)
    assert files == [str(region / o.path) for o in fetched.weight_objects]
    for path in files:
        reading.wait_for(region, Path(path).name, timeout=120)
        assert Path(path).read_bytes() == (model.local / Path(path).name).read_bytes()
    assert shared.sizes() == {str(region / o.path): o.size for o in fetched.weight_objects}
    assert shared.pull().bytes == sum(o.size for o in fetched.weight_objects)
    shared.release()
    shared.release()  # idempotent
    _wait_gone(region)

    given_up = source.acquire(uri, fetched, Sharing("node", base=str(base)))
    region = Path(given_up.region)
    # the mark an 'auto' pull leaves when the region no longer fits
    # (tests/integration/test_region_trust.py makes a pull leave it for real)
    (region / marks.UNSHARED).write_text("not pulled: it no longer fits")
    fallback = given_up.prepare()
    assert fallback.model_weights == model.uri
    assert fallback.sharing == "off: not pulled: it no longer fits"
    _wait_gone(region)  # the engine let go of it: the last reference


def test_one_pull_each_range_once_and_files_equal(s3_server, s3_env, tiny_models, base):
    model, uri, objects = _weights(s3_server, tiny_models, "share")
    log = AccessLog(s3_server)
    weights = NodeWeights(uri, objects, Sharing("node", base=str(base)))
    region = Path(weights.acquire())
    for obj in objects:
        wait_for(region, obj.path)
        assert (region / obj.path).read_bytes() == (model.local / obj.path).read_bytes()
    prefix = prefix_of(model.uri)
    gets = log.gets(prefix)
    # the listing's metadata is not read again; each weight object in ranged GETs of 8 MiB,
    # each range once: ceil(size / chunk) GETs, no more
    assert {k: v for k, v in gets.items() if k.endswith(".safetensors")} == {
        prefix + o.path: math.ceil(o.size / pull.CHUNK) for o in objects
    }
    assert pull.finished_pull(region).bytes == sum(o.size for o in objects)
    # its keeper: outside Ray, a thread of the holding process (in Ray, the node's agent)
    assert "rsl-reap" in [t.name for t in threading.enumerate()]
    weights.release()  # the last reference: the region goes
    _wait_gone(region)
    assert not base.exists() or not any(base.rglob("*"))


def test_two_processes_share_one_pull(s3_server, s3_env, tiny_models, base, spawn):
    model, uri, objects = _weights(s3_server, tiny_models, "share-two")
    log = AccessLog(s3_server)
    code = textwrap.dedent(f"""
        import sys, time
        from ray_stream_llm.fetch import fetch_metadata_report
        from ray_stream_llm.weights.reading import wait_for
        from ray_stream_llm.weights.region import NodeWeights, Sharing
        from ray_stream_llm.uri import parse_model_uri
        report = fetch_metadata_report({model.uri!r})
        w = NodeWeights(parse_model_uri(report.uri), report.weight_objects,
                        Sharing("node", base={str(base)!r}))
        region = w.acquire()
        for o in report.weight_objects:
            wait_for(region, o.path)
        print("region", region, flush=True)
        sys.stdin.readline()  # hold the reference until told
        w.release()
    """)
    procs = [
        spawn(
            [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    regions = {_region_printed(p) for p in procs}
    assert len(regions) == 1
    region = Path(regions.pop())
    gets = log.gets(prefix_of(model.uri))
    assert sum(v for k, v in gets.items() if k.endswith(".safetensors")) == sum(
        math.ceil(o.size / pull.CHUNK) for o in objects
    )  # one pull for both
    procs[0].communicate("\n", timeout=30)
    assert region.exists()  # the other process still holds it
    procs[1].communicate("\n", timeout=30)
    _wait_gone(region)


def _region_printed(proc: subprocess.Popen) -> str:
    """The region the process printed ("region <path>"): its other lines are vLLM's log,
    which goes to stdout where Ray's LLM stages import vLLM with ray.data.llm (Ray 2.54)."""
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("region "):
            return line.removeprefix("region ").strip()
    raise AssertionError(f"the process printed no region (exit {proc.wait()})")


def test_a_killed_holders_region_is_removed_by_its_keeper(
    s3_server, s3_env, tiny_models, base, spawn
):
    """The holder is SIGKILLed: the region's keeper (the node's agent in a Ray job:
    tests/integration/test_agent.py; here this process) removes it."""
    model, uri, objects = _weights(s3_server, tiny_models, "share-killed")
    code = textwrap.dedent(f"""
        from ray_stream_llm.fetch import fetch_metadata_report
        from ray_stream_llm.weights.region import NodeWeights, Sharing
        from ray_stream_llm.uri import parse_model_uri
        report = fetch_metadata_report({model.uri!r})
        w = NodeWeights(parse_model_uri(report.uri), report.weight_objects,
                        Sharing("node", base={str(base)!r}))
        print("region", w.acquire(), flush=True)
        import time; time.sleep(600)
    """)
    proc = spawn([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    region = Path(_region_printed(proc))
    assert region.exists()
    keeper = threading.Thread(target=lifetime.reap, args=(region,), kwargs={"poll": 0.1})
    keeper.start()
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    keeper.join(timeout=20)
    assert not keeper.is_alive() and not region.exists()


def test_a_dead_pullers_region_is_pulled_on_by_its_other_holder(
    s3_server, s3_env, tiny_models, base, spawn
):
    """The puller, one of a region's two holders, is killed mid-pull (a slow link): the
    other holder, which asks for the pull each second (``NodeWeights.tend``), pulls the rest
    in its thread (the pull's record names it), and every file completes with the store's
    bytes; its reader only waited."""
    model, uri, objects = _weights(s3_server, tiny_models, "share-takeover")
    with Link(s3_server.port, latency=0.3) as proxy:
        env = {**os.environ, "AWS_ENDPOINT_URL": proxy.endpoint_url}
        code = textwrap.dedent(f"""
            from ray_stream_llm.fetch import fetch_metadata_report
            from ray_stream_llm.weights.region import NodeWeights, Sharing
            from ray_stream_llm.uri import parse_model_uri
            report = fetch_metadata_report({model.uri!r})
            w = NodeWeights(parse_model_uri(report.uri), report.weight_objects,
                            Sharing("node", base={str(base)!r}))
            print("region", w.acquire(), flush=True)
            import time; time.sleep(600)
        """)
        puller = spawn([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env)
        region = Path(_region_printed(puller))
        reader = NodeWeights(uri, objects, Sharing("node", base=str(base)))
        assert reader.acquire() == str(region)
        os.kill(puller.pid, signal.SIGKILL)  # mid-pull: the link is slow
        puller.wait()
        assert not all(marks.done(region, o.path) for o in objects)
    for obj in objects:  # the store directly now (the proxy is gone)
        wait_for(region, obj.path, timeout=120)
        assert (region / obj.path).read_bytes() == (model.local / obj.path).read_bytes()
    assert pull.finished_pull(region).pid == os.getpid()
    reader.release()
    _wait_gone(region)


def test_a_failed_pull_fails_every_waiter_with_the_cause(s3_server, s3_env, tiny_models, base):
    model, uri, objects = _weights(s3_server, tiny_models, "share-failed")
    s3_server.client().delete_object(Bucket="models", Key=uri.key(objects[0].path))
    weights = NodeWeights(uri, objects, Sharing("node", base=str(base)))
    region = Path(weights.acquire())
    with pytest.raises(ModelNotFoundError, match="the shared pull of the weights failed: ") as err:
        wait_for(region, objects[0].path, timeout=60)
    assert objects[0].path in str(err.value)
    weights.release()
    _wait_gone(region)


def test_sharing_that_cannot_fit_is_refused_by_size_when_asked_for(s3_env, base):
    huge = (
        ObjectInfo(path="model.safetensors", key="m/model.safetensors", size=1 << 50, etag="x"),
    )
    uri = parse_model_uri("s3://models/huge/")
    with pytest.raises(WeightSharingError) as err:
        NodeWeights(uri, huge, Sharing("node", base=str(base), required=True)).acquire()
    assert "1048576.00 GiB" in str(err.value) and "weight_sharing='off'" in str(err.value)
    # auto: direct streaming, with the reason logged
    assert NodeWeights(uri, huge, Sharing("node", base=str(base))).acquire() is None
    assert not any(base.rglob("*.safetensors"))


@pytest.mark.e2e
def test_two_ray_nodes_pull_once_each_and_clean_up(
    s3_server, s3_env, tiny_models, base, work, monkeypatch
):
    """Two Ray nodes on this machine (ray.cluster_utils.Cluster), two actors on each using
    the shared weights: the store serves the weights once per node, each node's region
    holds the store's bytes, and every region is removed when its actors are done. (The
    actors call the node-sharing code directly; the vLLM engines are covered on one node
    by tests/e2e/test_sharing.py.)"""
    import ray
    from ray.cluster_utils import Cluster

    model, uri, objects = _weights(s3_server, tiny_models, "share-nodes")
    monkeypatch.setenv("RAY_TMPDIR", str(work))  # the clusters' sessions live here, not /tmp/ray
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 2,
            "resources": {"node_a": 4},
            "include_dashboard": False,
        },
    )
    cluster.add_node(num_cpus=2, resources={"node_b": 4})
    log = AccessLog(s3_server)
    try:
        ray.init(address=cluster.address, runtime_env={"env_vars": dict(s3_env)})

        @ray.remote(num_cpus=0.1)
        class User:
            def __init__(self, uri_text, base_dir):
                from ray_stream_llm.fetch import fetch_metadata_report
                from ray_stream_llm.integrations.ray import node
                from ray_stream_llm.uri import parse_model_uri
                from ray_stream_llm.weights.reading import wait_for
                from ray_stream_llm.weights.region import NodeWeights, Sharing

                report = fetch_metadata_report(uri_text)
                self.weights = NodeWeights(
                    parse_model_uri(report.uri),
                    report.weight_objects,
                    Sharing("node", base=base_dir),
                    # this node's, kept and pulled by this process (not the node's agent)
                    dataclasses.replace(node.holder(), keeper=None, puller=None),
                )
                self.region = self.weights.acquire()
                for o in report.weight_objects:
                    wait_for(self.region, o.path)

            def where(self):
                return self.region, ray.get_runtime_context().get_node_id()

            def done(self):
                self.weights.release()

        users = [
            User.options(resources={node: 1}).remote(model.uri, str(base))
            for node in ("node_a", "node_a", "node_b", "node_b")
        ]
        where = ray.get([u.where.remote() for u in users])
        regions = {region for region, _ in where}
        assert len(regions) == 2 and len({node for _, node in where}) == 2  # one per node
        for region in regions:
            for o in objects:
                assert (Path(region) / o.path).read_bytes() == (model.local / o.path).read_bytes()
        gets = log.gets(prefix_of(model.uri))
        assert {k: v for k, v in gets.items() if k.endswith(".safetensors")} == {
            prefix_of(model.uri) + o.path: 2 * math.ceil(o.size / pull.CHUNK) for o in objects
        }  # once per node
        ray.get([u.done.remote() for u in users])
        for region in regions:
            _wait_gone(Path(region))
    finally:
        ray.shutdown()
        cluster.shutdown()
