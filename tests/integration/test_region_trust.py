"""The node's shared region fails closed and keeps its integrity (issue 19), without Ray and
without a vLLM engine: the real S3 server (SeaweedFS), the real Run:ai streamer wrapped by
the library's vLLM plugin, real processes and real shared-memory files."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path

import psutil
import pytest
import torch
from helpers.janitors import SEGMENT_MAPPER as _MAPPER
from helpers.links import TappedLink, slow_link
from helpers.s3log import copy_model
from helpers.waiting import wait_until
from safetensors.torch import load_file

from ray_stream_llm import stores
from ray_stream_llm.config import StreamingvLLMEngineProcessorConfig, resolve_sharing_dir
from ray_stream_llm.errors import (
    InvalidSettingError,
    NotStreamableError,
    ObjectChangedError,
    WeightSharingError,
)
from ray_stream_llm.fetch import fetch_metadata_report
from ray_stream_llm.integrations.vllm import shm
from ray_stream_llm.manifest import inspect_model
from ray_stream_llm.tools.link import Link
from ray_stream_llm.uri import parse_model_uri
from ray_stream_llm.weights import lifetime, marks, memory, pull, reading
from ray_stream_llm.weights.reading import wait_for
from ray_stream_llm.weights.region import NodeWeights, Sharing

pytestmark = [pytest.mark.s3]


@pytest.fixture
def base():
    """A region base on /dev/shm (memory-backed), private to the test, removed after."""
    import shutil

    path = Path("/dev/shm") / f"rsl-trust-{os.getpid()}-{time.monotonic_ns()}"
    yield path
    shutil.rmtree(path, ignore_errors=True)


# --- 1. fail closed: a region file is read only once complete, however it is spelled --------
def test_the_loader_waits_for_each_region_file_named_by_a_relative_path(
    s3_server, s3_env, tiny_models, base, monkeypatch
):
    """vLLM's runai_streamer loader, as the plugin registers it, given the region as a
    relative path while the pull is still on its way: every file is read whole (each is
    awaited by its name in the region, where it appears only once whole)."""
    from vllm.config.load import LoadConfig
    from vllm.model_executor.model_loader import get_model_loader

    from ray_stream_llm.integrations.vllm.loader import register

    register()
    model = copy_model(s3_server, tiny_models["sharded"], "relative")
    report = fetch_metadata_report(model.uri)
    names = [o.path for o in report.weight_objects]
    # the store behind a capped link for every client of this process (the first MiB at
    # once, the rest at 64 KiB/s)
    with slow_link(s3_server, rate=64 << 10, monkeypatch=monkeypatch):
        weights = NodeWeights(parse_model_uri(model.uri), report.weight_objects,
                              Sharing("node", base=str(base)))  # fmt: skip
        region = Path(weights.acquire())
        assert not all(marks.done(region, n) for n in names)  # still on its way
        monkeypatch.chdir(base)
        relative = os.path.relpath(region, base)  # "<node>/<key>"
        monkeypatch.delenv("RAY_STREAM_LLM_LOAD_REPORT_DIR", raising=False)
        loader = get_model_loader(LoadConfig(load_format="runai_streamer"))
        got = {name: tensor for name, tensor in loader._get_weights_iterator(relative, None)}
        weights.release()
    expected = {}
    for name in names:
        expected.update(load_file(str(model.local / name)))
    assert set(got) == set(expected) and all(torch.equal(got[k], expected[k]) for k in expected)


def test_a_region_lists_only_whole_files_and_none_is_sparse(
    s3_server, s3_env, tiny_models, base, monkeypatch
):
    """While the pull goes through a slow link, every weight file the region's directory
    lists (what any glob of it finds) has its full size and all its bytes in memory (no
    hole): the bytes still coming are in ``.partial/``, under no name a reader lists. At
    the end every file is listed, whole and equal to the store's."""
    model = copy_model(s3_server, tiny_models["sharded"], "whole-only")
    report = fetch_metadata_report(model.uri)
    sizes = {o.path: o.size for o in report.weight_objects}
    assert len(sizes) > 1
    monkeypatch.setattr(pull, "CHUNK", 128 << 10)  # each file in several ranges
    monkeypatch.setattr(pull, "WORKERS", 2)
    mid_file: set[str] = set()  # files seen part-written and not listed

    def all_listed_whole(region: Path) -> bool:
        listed = {p.name: p.stat() for p in region.iterdir() if p.is_file()}
        weights = {n: st for n, st in listed.items() if n.endswith(".safetensors")}
        for name, st in weights.items():
            assert st.st_size == sizes[name], (name, st.st_size, sizes[name])
            assert st.st_blocks * 512 >= st.st_size, (name, st.st_blocks, st.st_size)
        for name in set(sizes) - set(weights):
            try:
                if (region / ".partial" / name).stat().st_size > 0:
                    mid_file.add(name)
            except FileNotFoundError:
                pass  # not started, or renamed since the listing
        return set(weights) == set(sizes)

    with TappedLink(s3_server.port, rate=256 << 10, burst=64 << 10) as link:
        monkeypatch.setenv("AWS_ENDPOINT_URL", link.endpoint_url)
        weights = NodeWeights(parse_model_uri(model.uri), report.weight_objects,
                              Sharing("node", base=str(base)))  # fmt: skip
        region = Path(weights.acquire())
        wait_until(lambda: all_listed_whole(region), 120, "the pull never finished", poll=0.01)
    assert any(".safetensors" in r for r in link.requests)  # the pull went through the link
    assert mid_file, "no file was ever seen part-written: the pull was not observed mid-way"
    for name in sizes:
        assert (region / name).read_bytes() == (model.local / name).read_bytes()
    assert not any((region / ".partial").iterdir())
    weights.release()


def test_a_region_is_known_by_its_marker_and_lists_its_planned_files(base, tmp_path):
    region = base / "node" / "key"
    region.mkdir(parents=True)
    (region / "b.safetensors").write_bytes(b"")
    assert reading.region_of_dir(region) is None  # no marker yet
    assert reading.planned_files(region) is None
    objects = [
        {"path": p, "key": f"m/{p}", "size": 0, "etag": "x"}
        for p in ("b.safetensors", "a.safetensors")
    ]
    (region / marks.CREATED).write_text(json.dumps({"objects": objects}))
    for spelling in (str(region), str(region / ".." / "key"), os.path.relpath(region)):
        assert reading.region_of_dir(spelling) == region, spelling
        # the marker's order and names, not what a glob of the directory finds
        assert reading.planned_files(spelling) == [
            str(region / "b.safetensors"),
            str(region / "a.safetensors"),
        ]
    assert reading.region_of_dir(tmp_path) is None


def test_the_engine_finds_the_region_named_for_its_models_uri(base, tmp_path, monkeypatch):
    """vLLM is given the model's URI as ``model_weights`` (the same on every node: its
    compile key hashes it); the engine actor names the node's region in REGION_ENV, and the
    loader reads it only for the URI its marker records, however the URI is spelled."""
    region = base / "node" / "key"
    region.mkdir(parents=True)
    objects = [{"path": "a.safetensors", "key": "m/a.safetensors", "size": 0, "etag": "x"}]
    (region / marks.CREATED).write_text(json.dumps({"uri": "s3://bucket/m/", "objects": objects}))
    monkeypatch.delenv(reading.REGION_ENV, raising=False)
    assert reading.region_of("s3://bucket/m/") is None  # none named: the store
    monkeypatch.setenv(reading.REGION_ENV, str(region))
    for spelling in ("s3://bucket/m/", "s3://bucket/m"):
        assert reading.region_of(spelling) == region
        assert reading.planned_files(spelling) == [str(region / "a.safetensors")]
    assert reading.region_of("s3://bucket/other/") is None  # another model: not its region
    assert reading.region_of(str(region)) == region  # a region's directory, given directly
    monkeypatch.setenv(reading.REGION_ENV, str(tmp_path / "gone"))
    assert reading.region_of("s3://bucket/m/") is None


@pytest.mark.parametrize(
    ("value", "problem"),
    [("rel-region", "relative path"), ("./regions", "relative path"), ("", "directory path")],
)
def test_a_weight_sharing_dir_every_actor_would_read_differently_is_refused(value, problem):
    with pytest.raises(InvalidSettingError) as err:
        StreamingvLLMEngineProcessorConfig(
            model_source="s3://models/tiny/",
            engine_kwargs={"load_format": "runai_streamer"},
            weight_sharing="node",
            weight_sharing_dir=value,
        )
    assert repr(value) in str(err.value) and problem in str(err.value)


def test_a_weight_sharing_dir_is_resolved_on_the_driver(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    config = StreamingvLLMEngineProcessorConfig(
        model_source="s3://models/tiny/",
        engine_kwargs={"load_format": "runai_streamer"},
        weight_sharing_dir="~/regions/../shm/",
    )
    assert config.weight_sharing_dir == str(tmp_path / "shm")
    (tmp_path / "file").write_text("x")
    with pytest.raises(InvalidSettingError, match="is a file"):
        resolve_sharing_dir(str(tmp_path / "file"))


# --- 2. only what vLLM streams: the top level -------------------------------------------------
def test_nested_safetensors_are_neither_pulled_nor_taken_for_the_model(
    s3_server, s3_env, tiny_models, base
):
    model = copy_model(s3_server, tiny_models["single"], "nested")
    s3_server.put(model.uri + "lora/adapter_model.safetensors", b"not vLLM's to load")
    report = fetch_metadata_report(model.uri)
    assert [o.path for o in report.weight_objects] == ["model.safetensors"]
    weights = NodeWeights(parse_model_uri(model.uri), report.weight_objects,
                          Sharing("node", base=str(base)))  # fmt: skip
    region = Path(weights.acquire())
    for obj in report.weight_objects:
        wait_for(region, obj.path)
    assert sorted(p.name for p in region.iterdir() if not p.name.startswith(".")) == [
        "model.safetensors"
    ]
    weights.release()

    only_nested = f"s3://models/tiny/fetch-test/only-nested-{uuid.uuid4().hex[:8]}/"
    s3_server.put(only_nested + "config.json", (model.local / "config.json").read_bytes())
    s3_server.put(
        only_nested + "original/model.safetensors",
        (model.local / "model.safetensors").read_bytes(),
    )
    with pytest.raises(NotStreamableError) as err:
        inspect_model(only_nested).raise_if_not_streamable()
    assert "'original/model.safetensors'" in str(err.value) and "vLLM does not load" in str(
        err.value
    )


# --- 5. integrity ---------------------------------------------------------------------------
def test_an_object_replaced_mid_pull_fails_by_name_and_is_never_marked_done(
    s3_server, s3_env, tiny_models, base, monkeypatch
):
    model = copy_model(s3_server, tiny_models["single"], "replaced")
    report = fetch_metadata_report(model.uri)
    [obj] = report.weight_objects
    # 1.6 MB in 7 ranged GETs, 2 at a time, each about a second: most are asked for after
    # the new version landed
    monkeypatch.setattr(pull, "CHUNK", 256 << 10)
    monkeypatch.setattr(pull, "WORKERS", 2)
    assert obj.size > 6 * pull.CHUNK
    link = Link(s3_server.port, rate=256 << 10, burst=64 << 10)
    monkeypatch.setenv("AWS_ENDPOINT_URL", link.endpoint_url)
    with link:
        weights = NodeWeights(parse_model_uri(model.uri), report.weight_objects,
                              Sharing("node", base=str(base)))  # fmt: skip
        region = Path(weights.acquire())
        # another version of the same size lands while the ranges are on their way
        s3_server.put(model.uri + obj.path, os.urandom(obj.size))
        with pytest.raises(ObjectChangedError) as err:  # the pull's class, in the waiter
            wait_for(region, obj.path)
    message = str(err.value)
    assert message.startswith("the shared pull of the weights failed: "), message
    assert repr(obj.path) in message, message
    assert not marks.done(region, obj.path)
    weights.release()


def test_a_region_pinned_to_a_listing_the_store_no_longer_has_is_refused(
    s3_server, s3_env, tiny_models, base
):
    model = copy_model(s3_server, tiny_models["single"], "stale-listing")
    report = fetch_metadata_report(model.uri)
    [obj] = report.weight_objects
    s3_server.put(model.uri + obj.path, os.urandom(obj.size))  # replaced after the listing
    weights = NodeWeights(parse_model_uri(model.uri), report.weight_objects,
                          Sharing("node", base=str(base)))  # fmt: skip
    region = Path(weights.acquire())
    with pytest.raises(ObjectChangedError, match="changed in the store") as err:
        wait_for(region, obj.path)
    assert repr(obj.path) in str(err.value)
    weights.release()


def test_the_pull_has_a_connection_per_worker_and_a_budget_for_its_size(s3_env, tiny_models):
    client, _ = stores.list_model(
        parse_model_uri(tiny_models["single"].uri), None, connections=pull.WORKERS
    )
    assert client.meta.config.max_pool_connections == pull.WORKERS
    assert pull.pull_timeout(10 << 30, 30.0) == 30.0 + (10 << 30) / (1 << 20)
    assert pull.pull_timeout(0, 30.0) == 30.0


def test_regions_no_live_process_uses_are_swept_at_the_next_start(
    s3_server, s3_env, tiny_models, base
):
    """A job killed with its keeper leaves a region under a node id no one uses any more:
    the next region made on the node removes it; one still held is kept."""
    left = base / "old-node-id" / "0123456789abcdef"
    (left / ".refs").mkdir(parents=True)
    (left / ".lock").touch()
    (left / "model.safetensors").write_bytes(b"\0" * 4096)
    (left / ".refs" / "999999999-0").touch()  # a process that is gone
    held = base / "other-node" / "fedcba9876543210"
    (held / ".refs").mkdir(parents=True)
    (held / ".lock").touch()
    start = lifetime._proc_start(os.getpid())
    (held / ".refs" / f"{os.getpid()}-{start}").touch()  # this live process
    report = fetch_metadata_report(tiny_models["single"].uri)
    weights = NodeWeights(parse_model_uri(report.uri), report.weight_objects,
                          Sharing("node", base=str(base)))  # fmt: skip
    region = Path(weights.acquire())
    assert not left.exists() and not left.parent.exists()
    assert held.exists() and region.exists()
    weights.release()


# --- 5. the shm janitor removes only what the engine's own processes mapped ------------------


def _engine_with_worker(worker: str, then: str = "") -> subprocess.Popen:
    """A process standing for an engine actor, with one child running ``worker`` (it prints
    "mapped" once its segment is mapped); the engine prints that word and the child's pid,
    runs the statements ``then`` and waits."""
    code = (
        textwrap.dedent(f"""
        import subprocess, sys, time
        kid = subprocess.Popen([sys.executable, "-c", {worker!r}], stdout=subprocess.PIPE,
                               text=True)
        print(kid.stdout.readline().strip(), kid.pid, flush=True)
    """)
        + textwrap.dedent(then)
        + "time.sleep(600)\n"
    )
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)


def _until(path: Path) -> str:
    """A worker's statement: wait until ``path`` exists (the test's signal to go on)."""
    return f"while not os.path.exists({str(path)!r}): time.sleep(0.02)"


@pytest.fixture
def janitor_saw(monkeypatch: pytest.MonkeyPatch) -> set[str]:
    """The segments the janitor's own polls have recorded so far (its ``_mapped_by``, the
    real one, seen from the test): the signal that it knows a segment before the engine dies."""
    saw: set[str] = set()
    real = shm._mapped_by

    def mapped_by(procs):
        found = real(procs)
        saw.update(found)
        return found

    monkeypatch.setattr(shm, "_mapped_by", mapped_by)
    return saw


@pytest.fixture
def janitor_checks(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Each answer of the janitor's own check whether the engine's processes still live."""
    answers: list[bool] = []
    real = shm._alive

    def alive(members):
        answers.append(real(members))
        return answers[-1]

    monkeypatch.setattr(shm, "_alive", alive)
    return answers


@pytest.mark.parametrize("prefix", shm.PREFIXES)  # the ring buffers; TP ranks' broadcast
def test_the_janitor_removes_only_segments_the_engines_processes_mapped(
    tmp_path, janitor_saw, prefix
):
    tag = uuid.uuid4().hex[:8]
    own, foreign = f"{prefix}rsl{tag}own", f"{prefix}rsl{tag}other"
    since = time.time() - 1
    fd = os.open(f"/dev/shm/{foreign}", os.O_RDWR | os.O_CREAT, 0o600)  # not the engine's
    os.close(fd)
    child = subprocess.Popen(
        [sys.executable, "-c", _MAPPER.format(name=own)], stdout=subprocess.PIPE, text=True
    )
    rpc = tmp_path / "rsl-rpc-x"
    rpc.mkdir()
    watcher = threading.Thread(target=shm.watch, args=(child.pid, since, [str(rpc)], 0.05))
    try:
        assert child.stdout.readline().strip() == "mapped"
        watcher.start()
        wait_until(lambda: own in janitor_saw, 30, "the janitor never saw the segment")
        child.send_signal(signal.SIGKILL)  # the engine dies without unlinking its segment
        child.wait()
        watcher.join(timeout=30)
        assert not watcher.is_alive()
        assert not Path(f"/dev/shm/{own}").exists()  # the engine's own: removed
        assert Path(f"/dev/shm/{foreign}").exists()  # unmapped, but not the engine's: kept
        assert not rpc.exists()
    finally:
        child.kill()
        for name in (own, foreign):
            Path(f"/dev/shm/{name}").unlink(missing_ok=True)


def test_the_janitor_keeps_a_segment_older_than_the_engine_and_says_so(caplog):
    """A segment the engine mapped but that was there before it started is not the engine's
    to remove: kept, and logged as such, not as one still mapped."""
    name = f"psm_rsl{uuid.uuid4().hex[:8]}old"
    child = subprocess.Popen(
        [sys.executable, "-c", _MAPPER.format(name=name)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout.readline().strip() == "mapped"
        since = time.time() + 3600  # the engine started after the segment was written
        watcher = threading.Thread(target=shm.watch, args=(child.pid, since, [], 0.05))
        with caplog.at_level(logging.INFO, logger=shm.logger.name):
            watcher.start()
            wait_until(lambda: "watching actor" in caplog.text, 30, "the janitor never looked")
            child.send_signal(signal.SIGKILL)
            child.wait()
            watcher.join(timeout=30)
        assert not watcher.is_alive()
        assert Path(f"/dev/shm/{name}").exists()
        assert f"older than the engine or unmapped only now: ['{name}']" in caplog.text
        assert "still mapped" not in caplog.text, caplog.text
    finally:
        child.kill()
        Path(f"/dev/shm/{name}").unlink(missing_ok=True)


def test_the_janitor_waits_for_workers_that_outlive_the_engine(
    tmp_path, janitor_saw, janitor_checks
):
    """vLLM's workers can outlive the actor by seconds on a loaded node (CI saw two
    segments left that way): the janitor waits for every process of the engine's tree, then
    removes what they mapped."""
    name = f"psm_rsl{uuid.uuid4().hex[:8]}late"
    release = tmp_path / "release"  # the worker exits once it exists
    worker = _MAPPER.format(name=name).replace("time.sleep(600)", _until(release))
    engine = _engine_with_worker(worker)
    watcher = threading.Thread(target=shm.watch, args=(engine.pid, time.time() - 1, [], 0.05))
    try:
        word, kid = engine.stdout.readline().split()
        assert word == "mapped"
        watcher.start()
        wait_until(lambda: name in janitor_saw, 30, "the janitor never saw the segment")
        engine.send_signal(signal.SIGKILL)  # the actor dies; its worker lives on, mapping it
        engine.wait()
        # the janitor looked three times more at the worker (alive, mapping it): kept
        after = len(janitor_checks)
        wait_until(lambda: len(janitor_checks) >= after + 3, 30, "the janitor stopped looking")
        assert Path(f"/dev/shm/{name}").exists() and watcher.is_alive()  # still mapped: kept
        release.touch()
        watcher.join(timeout=30)
        assert not watcher.is_alive()
        assert not psutil.pid_exists(int(kid)) or psutil.Process(int(kid)).status() == "zombie"
        assert not Path(f"/dev/shm/{name}").exists()  # removed once the worker exited
    finally:
        engine.kill()
        Path(f"/dev/shm/{name}").unlink(missing_ok=True)


def test_the_janitor_removes_what_a_worker_maps_after_the_engine_died(tmp_path, janitor_saw):
    """A worker that outlives the actor can still map a segment (vLLM's workers shut down
    after their engine): the janitor records what the tree maps until it has exited, not
    only while the actor lived, and removes it too."""
    tag = uuid.uuid4().hex[:8]
    first, later = f"psm_rsl{tag}first", f"psm_rsl{tag}later"
    go, end = tmp_path / "map-later", tmp_path / "end"  # the worker's cues, from the test
    # the second mapping prints nothing: the engine reading the worker's output is gone
    then = _MAPPER.format(name=later).replace('print("mapped", flush=True)', "")
    worker = _MAPPER.format(name=first).replace(
        "time.sleep(600)", _until(go) + "\n" + then.replace("time.sleep(600)", _until(end))
    )
    engine = _engine_with_worker(worker)
    watcher = threading.Thread(target=shm.watch, args=(engine.pid, time.time() - 1, [], 0.05))
    try:
        word, kid = engine.stdout.readline().split()
        assert word == "mapped"
        watcher.start()
        wait_until(lambda: first in janitor_saw, 30, "the janitor never saw the segment")
        engine.send_signal(signal.SIGKILL)  # the actor dies before its worker maps `later`
        engine.wait()
        assert later not in janitor_saw
        go.touch()  # the worker, outliving the actor, maps `later`
        wait_until(lambda: later in janitor_saw, 30, "the janitor never saw the later segment")
        assert watcher.is_alive()  # seen while the worker outlived the actor
        end.touch()
        watcher.join(timeout=60)
        assert not watcher.is_alive()
        assert not Path(f"/dev/shm/{first}").exists() and not Path(f"/dev/shm/{later}").exists()
    finally:
        engine.kill()
        for name in (first, later):
            Path(f"/dev/shm/{name}").unlink(missing_ok=True)


def test_the_janitor_ends_workers_a_killed_engine_left_running(tmp_path, janitor_saw):
    """An actor killed outright (Ray's memory monitor sends SIGKILL) leaves vLLM's engine
    core and workers running with nobody to serve, holding memory and segments: after its
    grace the janitor ends them (SIGTERM; SIGKILL for one that ignores it) and removes
    what they mapped."""
    name = f"psm_rsl{uuid.uuid4().hex[:8]}stuck"
    stubborn = "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    worker = stubborn + _MAPPER.format(name=name)  # never exits by itself
    engine = _engine_with_worker(worker)
    watcher = threading.Thread(
        target=shm.watch,
        args=(engine.pid, time.time() - 1, [], 0.05),
        kwargs={"grace": 1.0, "term_wait": 1.0},  # the worker ignores SIGTERM: SIGKILL after 1 s
    )
    kid = None
    try:
        word, kid = engine.stdout.readline().split()
        assert word == "mapped"
        watcher.start()
        wait_until(lambda: name in janitor_saw, 30, "the janitor never saw the segment")
        engine.send_signal(signal.SIGKILL)
        engine.wait()
        watcher.join(timeout=30)
        assert not watcher.is_alive()
        assert not psutil.pid_exists(int(kid)) or psutil.Process(int(kid)).status() == "zombie"
        assert not Path(f"/dev/shm/{name}").exists()
    finally:
        engine.kill()
        if kid and psutil.pid_exists(int(kid)):
            psutil.Process(int(kid)).kill()
        Path(f"/dev/shm/{name}").unlink(missing_ok=True)


def test_segments_of_sees_a_process_and_its_children():
    name = f"psm_rsl{uuid.uuid4().hex[:8]}kid"
    parent = _engine_with_worker(_MAPPER.format(name=name))
    try:
        word, kid = parent.stdout.readline().split()
        assert word == "mapped" and psutil.pid_exists(int(kid))
        assert name in shm.segments_of(parent.pid)  # its child maps it
        other = subprocess.Popen(["sleep", "30"])  # not of that process tree
        try:
            assert name not in shm.segments_of(other.pid)
        finally:
            other.kill()
            other.wait()
    finally:
        for proc in psutil.Process(parent.pid).children(recursive=True):
            proc.kill()
        parent.kill()
        parent.wait()
        Path(f"/dev/shm/{name}").unlink(missing_ok=True)


# --- 6. the library's own cache heals; a user's dest is refused at the first foreign file ----
@pytest.mark.parametrize("marker", [b"{garbage", None], ids=["damaged-marker", "no-marker"])
def test_a_cache_directory_whose_marker_is_damaged_is_fetched_again(
    s3_server, s3_env, tiny_models, marker
):
    """Before: every later fetch raised ForeignFilesError naming the files it had written
    itself, and every job on the node failed until someone deleted the directory."""
    from helpers.s3log import AccessLog, prefix_of

    from ray_stream_llm.fetch import MARKER

    model = copy_model(s3_server, tiny_models["single"], "heal-marker")
    path = fetch_metadata_report(model.uri).path
    files = {p.name: p.read_bytes() for p in path.iterdir() if p.name != MARKER}
    if marker is None:
        (path / MARKER).unlink()
    else:
        (path / MARKER).write_bytes(marker)
    log = AccessLog(s3_server)
    report = fetch_metadata_report(model.uri)
    assert report.downloaded and report.path == path
    assert {p.name: p.read_bytes() for p in path.iterdir() if p.name != MARKER} == files
    assert set(log.gets(prefix_of(model.uri))) == {prefix_of(model.uri) + n for n in files}
    assert not fetch_metadata_report(model.uri).downloaded  # healed: reused from now on


def test_refusing_a_users_dest_stops_at_the_first_foreign_file(
    s3_env, tiny_models, tmp_path, monkeypatch
):
    """Before: the refusal listed every file under dest first (dest='/' walked 553,647
    files, 13.9 s)."""
    from ray_stream_llm import fetch
    from ray_stream_llm.errors import ForeignFilesError

    dest = tmp_path / "mine"
    for i in range(50):
        (dest / f"d{i}").mkdir(parents=True)
        (dest / f"d{i}" / "notes.txt").write_text("mine\n")
    walked: list[str] = []
    real_walk = os.walk

    def counting_walk(top, *args, **kwargs):
        for entry in real_walk(top, *args, **kwargs):
            walked.append(entry[0])
            yield entry

    monkeypatch.setattr(fetch.os, "walk", counting_walk)
    with pytest.raises(ForeignFilesError) as err:
        fetch.fetch_model_metadata(tiny_models["single"].uri, dest)
    assert "first found: 'd" in str(err.value) and "nothing was changed" in str(err.value)
    assert len(walked) <= 2  # dest, then the first folder with a file: not all 51
    assert all((dest / f"d{i}" / "notes.txt").read_text() == "mine\n" for i in range(50))


# --- 3. a region that no longer fits when its pull starts -------------------------------------
@pytest.mark.parametrize("required", [False, True], ids=["auto", "node"])
def test_a_region_refused_when_its_pull_starts(
    s3_server, s3_env, tiny_models, base, monkeypatch, required
):
    """Another model's region took the room between the region's making and its pull:
    'auto' engines stream each file from the store instead, 'node' fails by the sizes."""
    from ray_stream_llm.integrations.vllm.loader import stream_weights

    real = memory.memory_problem

    def full_at_pull_time(base_dir, weight_bytes, *, region=None, **kwargs):
        if region is None:  # the check when the region is made: it fits then
            return real(base_dir, weight_bytes, **kwargs)
        return "the node has 0.10 GiB of memory available, the weights need 0.50 GiB"

    monkeypatch.setattr(memory, "memory_problem", full_at_pull_time)
    model = copy_model(s3_server, tiny_models["sharded"], "refused-at-pull")
    report = fetch_metadata_report(model.uri)
    first = sorted(o.path for o in report.weight_objects)[0]
    weights = NodeWeights(parse_model_uri(model.uri), report.weight_objects,
                          Sharing("node", base=str(base), required=required))  # fmt: skip
    region = Path(weights.acquire())
    if required:
        with pytest.raises(WeightSharingError, match="pull of the weights failed: .*0.50 GiB"):
            wait_for(region, first)
    else:
        monkeypatch.delenv("RAY_STREAM_LLM_LOAD_REPORT_DIR", raising=False)
        got = dict(stream_weights([first], distributed=False, region=str(region)))  # the loader's
        expected = load_file(str(model.local / first))
        assert set(got) == set(expected)
        assert all(torch.equal(got[k], expected[k]) for k in expected)
        assert "0.50 GiB" in pull.unshared(region)
        assert not any(marks.done(region, o.path) for o in report.weight_objects)
    weights.release()
