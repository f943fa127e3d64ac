"""Memory a container really has (issue 19, item 3): the cgroup's limits, the tmpfs, the
node's other regions and the CPU KV cache, checked when a region is made and again before
its pull starts; the streamer's CPU buffer derived from the actor's memory.

The computation is tested with numbers; the readings under a real memory cap: a child
process in a cgroup v1 ``memory`` controller made for the test (root on this machine),
removed after."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import psutil
import pytest

from ray_stream_llm.weights import memory
from ray_stream_llm.weights.memory import (
    CgroupLevel,
    MemoryView,
    Regions,
    Tmpfs,
    assess,
    cgroup_levels,
    derive_streamer_limit,
    kv_cache_default_bytes,
    regions_under,
    streamer_memory_limit,
)

GiB, MiB = 1 << 30, 1 << 20
V1_MEMORY = Path("/sys/fs/cgroup/memory")


@pytest.fixture
def base():
    """A region base on /dev/shm (memory-backed), private to the test, removed after."""
    path = Path("/dev/shm") / f"rsl-mem-{os.getpid()}-{time.monotonic_ns()}"
    yield path
    import shutil

    shutil.rmtree(path, ignore_errors=True)


# --- the computation ----------------------------------------------------------------------


def _view(host: int, limit: int | None = None, usage: int = 0) -> MemoryView:
    level = CgroupLevel("/sys/fs/cgroup/memory/pod", 1, limit, usage) if limit else None
    return MemoryView(host_available=host, binding=level)


def test_a_cgroup_limit_binds_where_the_host_has_plenty():
    """1.5 TB available on the host, a pod of 32 GiB with 30 GiB in use: 8 GiB of weights
    do not fit, and the message names the cgroup, its limit, the use and every need."""
    problem = assess(
        weight_bytes=8 * GiB,
        regions=Regions(),
        kv_cache_bytes=0,
        tmpfs=Tmpfs("/dev/shm", free=700 * GiB, size=750 * GiB),
        view=_view(1500 * GiB, limit=32 * GiB, usage=30 * GiB),
    )
    assert problem == (
        "the cgroup /sys/fs/cgroup/memory/pod allows 2.00 GiB more (memory.limit_in_bytes "
        "32.00 GiB, 30.00 GiB in use), 8.50 GiB is needed (the weights need 8.00 GiB; "
        "0.50 GiB is kept free)"
    )
    # the same node without the pod's limit: it fits
    assert (
        assess(
            weight_bytes=8 * GiB,
            regions=Regions(),
            kv_cache_bytes=0,
            tmpfs=Tmpfs("/dev/shm", free=700 * GiB, size=750 * GiB),
            view=_view(1500 * GiB),
        )
        is None
    )


def test_other_regions_count_at_full_size_and_the_kv_cache_counts():
    """Another model's region, 1 GiB in of 6 GiB, will take 5 GiB more: 4 GiB of
    weights then do not fit in 9 GiB (they do alone); nor with a 2 GiB KV cache in 6 GiB."""
    view = _view(9 * GiB)
    tmpfs = Tmpfs("/dev/shm", free=64 * GiB, size=64 * GiB)
    other = Regions(count=1, present=1 * GiB, pending=5 * GiB)
    problem = assess(
        weight_bytes=4 * GiB, regions=other, kv_cache_bytes=0, tmpfs=tmpfs, view=view, base="/b"
    )
    assert problem is not None
    assert "9.50 GiB is needed" in problem
    assert "1 other region(s) under /b hold 1.00 GiB and will take 5.00 GiB more" in problem
    assert (
        assess(weight_bytes=4 * GiB, regions=Regions(), kv_cache_bytes=0, tmpfs=tmpfs, view=view)
        is None
    )
    kv = assess(
        weight_bytes=4 * GiB,
        regions=Regions(),
        kv_cache_bytes=2 * GiB,
        tmpfs=tmpfs,
        view=_view(6 * GiB),
    )
    assert kv is not None and "an engine's CPU KV cache takes 2.00 GiB" in kv
    assert "6.50 GiB is needed" in kv


def test_the_tmpfs_size_binds_before_memory():
    problem = assess(
        weight_bytes=3 * GiB,
        regions=Regions(),
        kv_cache_bytes=0,
        tmpfs=Tmpfs("/dev/shm", free=2 * GiB, size=4 * GiB),
        view=_view(100 * GiB),
    )
    assert problem is not None
    assert problem.startswith("/dev/shm has 2.00 GiB free of 4.00 GiB, 3.50 GiB is needed")


def test_kv_cache_and_streamer_limits_from_the_memory_there():
    assert kv_cache_default_bytes(10 * GiB) == 2 * GiB  # 20%
    assert kv_cache_default_bytes(100 * MiB) == 256 * MiB  # at least 256 MiB
    assert kv_cache_default_bytes(1000 * GiB) == 8 * GiB  # at most 8 GiB
    # never more than the engine can hold: 256 sequences (vLLM's CPU default per worker) of
    # max_model_len tokens, 2 (K, V) x layers x KV heads x head_dim x 2 bytes each, +25%
    llama = {
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "hidden_size": 128,
        "max_position_embeddings": 512,
        "torch_dtype": "bfloat16",
    }
    per_token = 2 * 2 * 2 * 32 * 2
    assert memory.kv_cache_usable_bytes(llama, {}) == 256 * 512 * per_token * 5 // 4
    given = {"max_model_len": 128, "max_num_seqs": 8}
    assert memory.kv_cache_usable_bytes(llama, given) == 8 * 128 * per_token * 5 // 4
    # TP=2: each rank holds half the KV heads for twice the default sequences; fp8: 1 byte
    assert memory.kv_cache_usable_bytes(llama, {"tensor_parallel_size": 2}) == (
        512 * 512 * per_token // 2 * 5 // 4
    )
    assert memory.kv_cache_usable_bytes(llama, {"kv_cache_dtype": "fp8"}) == (
        256 * 512 * per_token // 2 * 5 // 4
    )
    # no bound where the config does not say, or the layers keep other state (Mamba)
    assert memory.kv_cache_usable_bytes({**llama, "num_hidden_layers": None}, {}) is None
    assert memory.kv_cache_usable_bytes({"text_config": {"hidden_size": 8}}, {}) is None
    assert memory.kv_cache_usable_bytes({**llama, "mamba_d_state": 16}, {}) is None
    # the default takes the bound: whole MiB, rounded up, never under the minimum
    assert kv_cache_default_bytes(10 * GiB, 1 * GiB + 1) == 1 * GiB + MiB
    assert kv_cache_default_bytes(10 * GiB, 1 * MiB) == 256 * MiB
    assert kv_cache_default_bytes(10 * GiB, 100 * GiB) == 2 * GiB
    # a 10 GiB pod with one engine: 2.5 GiB (the marin report: a 2 GiB limit kept such a
    # pod alive); two engines: 1.25 GiB each; below 1 GiB: one tensor at a time (0)
    assert derive_streamer_limit(10 * GiB, 1) == 2560 * MiB
    assert derive_streamer_limit(10 * GiB, 2) == 1280 * MiB
    assert derive_streamer_limit(2 * GiB, 1) == 0
    assert derive_streamer_limit(10_000 * GiB, 1) == memory.STREAMER_DEFAULT


def test_a_streamer_limit_the_user_chose_is_kept(monkeypatch):
    levels = [CgroupLevel("/c", 1, 10 * GiB, 0)]
    env: dict[str, str] = {}
    given = {"model_loader_extra_config": {"memory_limit": 0}}
    assert streamer_memory_limit(given, 1, levels=levels, environ=env) is None and env == {}
    env = {"RUNAI_STREAMER_MEMORY_LIMIT": "-1"}
    assert streamer_memory_limit({}, 1, levels=levels, environ=env) is None
    assert env == {"RUNAI_STREAMER_MEMORY_LIMIT": "-1"}
    env = {}
    assert streamer_memory_limit({}, 1, levels=[], environ=env) is None and env == {}
    assert streamer_memory_limit({}, 2, levels=levels, environ=env) == 1280 * MiB
    assert env == {"RUNAI_STREAMER_MEMORY_LIMIT": str(1280 * MiB)}


def test_which_ranks_the_streamer_divides_its_limit_among():
    """runai-model-streamer 0.17 divides RUNAI_STREAMER_MEMORY_LIMIT among an engine's ranks
    only in its distributed mode: vLLM's 'distributed' option with 'runai_streamer', on
    NCCL (not vLLM's CPU build) unless RUNAI_STREAMER_DIST says otherwise."""
    dist = {"load_format": "runai_streamer", "model_loader_extra_config": {"distributed": True}}
    tp4 = {"tensor_parallel_size": 4}
    cases = [
        ({}, False, {}, (1, False)),
        ({**tp4, "pipeline_parallel_size": 2}, False, {}, (8, False)),
        ({**tp4, **dist}, False, {}, (4, True)),
        ({**tp4, **dist}, True, {}, (4, False)),  # the CPU build's gloo: each rank alone
        ({**tp4, **dist}, True, {"RUNAI_STREAMER_DIST": "1"}, (4, True)),
        ({**tp4, **dist}, False, {"RUNAI_STREAMER_DIST": "0"}, (4, False)),
        ({**tp4, **dist, "load_format": "runai_streamer_sharded"}, False, {}, (4, False)),
        ({**dist}, False, {}, (1, False)),
    ]
    for kwargs, cpu_build, env, expected in cases:
        got = memory.streamer_ranks(kwargs, cpu_build=cpu_build, environ=env)
        assert got == expected, (kwargs, cpu_build, env, got)


def _engine_ring_bytes(value: int, sizes: list[int], ranks: int, splits: bool, monkeypatch) -> int:
    """The host memory runai-model-streamer 0.17 itself sizes for one engine's rings given
    RUNAI_STREAMER_MEMORY_LIMIT=``value``: each rank's ring (buffers x buffer size, the
    streamer's _ring_sizing) for the bytes that rank streams (all of them; a 1/ranks share
    in distributed mode) under the limit that rank applies (the value itself, or the
    distributed streamer's rank_memory_limit of it), summed over the ranks."""
    from runai_model_streamer.distributed_streamer.distributed_streamer import (
        _distributedStreamer,
    )
    from runai_model_streamer.file_streamer.requests_iterator import (
        FileChunks,
        _get_memory_mode,
        _ring_sizing,
    )

    if splits:
        monkeypatch.setenv("RUNAI_STREAMER_MEMORY_LIMIT", str(value))  # the streamer reads it
        divider = _distributedStreamer(None)
        divider.num_processes_on_node, divider.max_chunk = ranks, max(sizes)
        per_rank, mine = divider.rank_memory_limit(), sizes[::ranks]
    else:
        per_rank, mine = value, sizes
    chunks = [FileChunks.contiguous(0, "model.safetensors", 0, mine)]
    buffer_size, buffers = _ring_sizing(_get_memory_mode(per_rank), chunks, per_rank)
    return ranks * buffer_size * buffers


def test_derived_streamer_limit_bounds_the_engines_rings_as_the_streamer_sizes_them(
    monkeypatch,
):
    """The engine's rings together, as the streamer sizes them from the derived value, are
    a quarter of the engine's share of the limit (within 10%, never above); each rank of a
    tensor-parallel engine streams with its own ring unless the streamer divides the value
    (the value before this change gave each rank the engine's whole quarter: 2x-4x)."""
    # the actor's view: a tensor-parallel engine's ranks each get their part
    env: dict[str, str] = {}
    tp2 = {"tensor_parallel_size": 2}
    levels = [CgroupLevel("/c", 1, 20 * GiB, 0)]
    assert streamer_memory_limit(tp2, 1, levels=levels, environ=env) == 2560 * MiB
    assert env == {"RUNAI_STREAMER_MEMORY_LIMIT": str(2560 * MiB)}
    sizes = [64 * MiB] * 400 + [512 * MiB]  # 25.5 GiB in tensors of 64 MiB, one of 512
    for budget, engines, ranks, splits in [
        (64 * GiB, 2, 1, False),
        (64 * GiB, 2, 2, False),
        (64 * GiB, 1, 4, False),
        (64 * GiB, 1, 4, True),
        (64 * GiB, 1, 8, True),
    ]:
        quarter = budget // engines // 4
        value = derive_streamer_limit(budget, engines, ranks, splits)
        rings = _engine_ring_bytes(value, sizes, ranks, splits, monkeypatch)
        assert 0.9 * quarter <= rings <= quarter, (budget, engines, ranks, splits, value, rings)
        # the value as it was derived before, one engine's quarter whatever the ranks
        if ranks > 1 and not splits:
            before = _engine_ring_bytes(quarter, sizes, ranks, splits, monkeypatch)
            assert before >= ranks * 0.9 * quarter
    # a rank's part under 1 GiB: one tensor at a time (the streamer's 0), in either mode
    assert derive_streamer_limit(8 * GiB, 1, 4) == 0  # before: 2 GiB for each of the 4
    assert derive_streamer_limit(8 * GiB, 1, 4, splits=True) == 0
    assert _engine_ring_bytes(0, sizes, 4, False, monkeypatch) == 4 * 512 * MiB
    # the parts in whole MiB; the divided value is the ranks' parts together
    assert derive_streamer_limit(10 * GiB + 3, 1, 2) == 1280 * MiB
    assert derive_streamer_limit(10 * GiB + 3, 1, 2, splits=True) == 2560 * MiB
    assert derive_streamer_limit(10_000 * GiB, 1, 8, splits=True) == memory.STREAMER_DEFAULT


def test_cgroup_v2_read_through_mountinfo_and_walked_up(tmp_path):
    """A cgroup v2 tree (its files as the kernel writes them) under a mount named by
    mountinfo: the process's level has no limit, its parent's binds, the root has none."""
    root = tmp_path / "cg2"
    pod = root / "kubepods" / "pod1"
    ctr = pod / "ctr"
    ctr.mkdir(parents=True)
    for directory, limit, current in ((ctr, "max", 3 * GiB), (pod, str(4 * GiB), 3 * GiB)):
        (directory / "memory.max").write_text(f"{limit}\n")
        (directory / "memory.current").write_text(f"{current}\n")
        (directory / "memory.stat").write_text(f"anon 1\ninactive_file {GiB // 2}\nshmem 2\n")
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "cgroup").write_text("0::/kubepods/pod1/ctr\n")
    (proc / "mountinfo").write_text(
        f"30 25 0:26 / {root} rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
        "31 25 0:27 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,cpu\n"
    )
    levels = cgroup_levels(str(proc))
    assert [(lv.path, lv.limit, lv.usage) for lv in levels] == [
        (str(ctr), None, 3 * GiB - GiB // 2),
        (str(pod), 4 * GiB, 3 * GiB - GiB // 2),
    ]
    assert levels[1].headroom == GiB + GiB // 2
    # a cgroup namespace: /proc/self/cgroup says "/", the mount is the container's own
    (proc / "cgroup").write_text("0::/\n")
    (proc / "mountinfo").write_text(f"30 25 0:26 / {pod} rw - cgroup2 cgroup2 rw\n")
    assert [lv.limit for lv in cgroup_levels(str(proc))] == [4 * GiB]


def test_regions_under_a_base_count_what_their_markers_plan(base):
    """Bytes present and to come of the node's other regions: the objects each marker plans,
    less what the whole files (under their names) and the partial ones hold; a file the
    marker does not list, a region still being made (no marker) and the region excluded
    (the one being checked) do not count."""
    other = base / "node" / "aaaa"
    (other / ".partial").mkdir(parents=True)
    planned = [
        {"path": "a.safetensors", "key": "m/a.safetensors", "size": 4 * MiB, "etag": "x"},
        {"path": "b.safetensors", "key": "m/b.safetensors", "size": 64 * MiB, "etag": "y"},
        {"path": "c.safetensors", "key": "m/c.safetensors", "size": 16 * MiB, "etag": "z"},
    ]
    (other / ".created").write_text(json.dumps({"objects": planned}))
    (other / "a.safetensors").write_bytes(os.urandom(4 * MiB))  # whole
    (other / ".partial" / "b.safetensors").write_bytes(os.urandom(8 * MiB))  # on its way
    (other / "stray.safetensors").write_bytes(os.urandom(MiB))  # not the region's
    making = base / "node" / "bbbb"
    making.mkdir()
    (making / "model.safetensors").write_bytes(os.urandom(MiB))
    found = regions_under(base)
    assert (found.count, found.present, found.pending) == (1, 12 * MiB, 72 * MiB)
    assert regions_under(base, exclude=other) == Regions()
    assert memory._region_bytes(other) == (12 * MiB, 72 * MiB)


# --- under a real memory cap ------------------------------------------------------------


def _v1_writable() -> bool:
    return os.geteuid() == 0 and os.access(V1_MEMORY, os.W_OK) and (V1_MEMORY / "tasks").exists()


needs_cgroup = pytest.mark.skipif(
    not _v1_writable(),
    reason="needs root and a writable cgroup v1 memory controller at /sys/fs/cgroup/memory",
)


@pytest.fixture
def capped():
    """A cgroup capped at a given size, with an unlimited child (the process goes there: its
    parent's limit must be found by walking up); both removed after."""
    made: list[Path] = []

    def make(limit: int) -> Path:
        parent = V1_MEMORY / f"rsl-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        parent.mkdir()
        made.append(parent)
        (parent / "memory.limit_in_bytes").write_text(str(limit))
        inner = parent / "inner"
        inner.mkdir()
        return inner

    yield make
    for parent in made:
        for directory in (parent / "inner", parent):
            for _ in range(50):  # a child that just exited may still be listed for a moment
                try:
                    directory.rmdir()
                    break
                except OSError:
                    time.sleep(0.1)
        assert not parent.exists(), f"{parent} not removed"


CHILD = textwrap.dedent(
    """
    import json, os, sys, time
    from pathlib import Path
    cgroup, base, step = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    Path(cgroup, "cgroup.procs").write_text(str(os.getpid()))  # from here on, capped
    import psutil
    from ray_stream_llm.errors import WeightSharingError
    from ray_stream_llm.weights import memory
    from ray_stream_llm.weights import memory, pull
    from ray_stream_llm.weights import reading
    from ray_stream_llm.weights.region import NodeWeights, Sharing
    from ray_stream_llm.stores import ObjectInfo
    from ray_stream_llm.uri import parse_model_uri

    GiB, MiB = 1 << 30, 1 << 20
    out = {"cgroup": Path("/proc/self/cgroup").read_text()}
    uri = parse_model_uri("s3://models/never-read/")

    def objects(size):
        return (ObjectInfo(path="model.safetensors", key="k", size=size, etag="e"),)

    if step == "check":
        view = memory.memory_view()
        out["binding"] = [view.binding.path, view.binding.limit]
        out["host_available"] = psutil.virtual_memory().available
        # one engine's KV cache still to come (vLLM's CPU build: Sharing.kv_cache_engines)
        out["two_gib"] = memory.memory_problem(base, 2 * GiB, kv_cache_engines=1)
        out["hundred_mib"] = memory.memory_problem(base, 100 * MiB)
        try:
            required = Sharing("node", base=str(base), required=True)
            NodeWeights(uri, objects(2 * GiB), required).acquire()
        except WeightSharingError as exc:
            out["node"] = str(exc)
        out["auto"] = NodeWeights(uri, objects(2 * GiB), Sharing("node", base=str(base))).acquire()
        # tmpfs pages this process writes are charged to its cgroup
        before = memory.memory_view().available
        with open(base / "filler", "wb") as f:
            for _ in range(70):
                f.write(b"x" * (10 * MiB))
        out["charged"] = before - memory.memory_view().available
        out["after_fill"] = memory.memory_problem(base, 300 * MiB, kv_cache_engines=1)
        (base / "filler").unlink()
        # a region that fit when made; another model's region arrives before its pull starts
        region = base / "local" / "mine"
        region.mkdir(parents=True)
        import dataclasses
        marker = {"uri": str(uri), "objects": [dataclasses.asdict(o) for o in objects(100 * MiB)],
                  "required": True}  # weight_sharing='node': the waiter fails by the sizes
        (region / ".created").write_text(json.dumps(marker))  # as NodeWeights.acquire writes it
        out["mine_alone"] = memory.memory_problem(base, 100 * MiB, region=region)
        other = base / "local" / "other"
        other.mkdir()
        planned = [dataclasses.asdict(o) for o in objects(GiB)]  # nothing of it in yet
        (other / ".created").write_text(json.dumps({"objects": planned}))
        out["started"] = pull.start_pull(region, uri, objects(100 * MiB)) is not None
        try:
            reading.wait_for(region, "model.safetensors")
        except Exception as exc:
            out["waiter"] = f"{type(exc).__name__}: {exc}"
    else:
        env = {}
        out["limit"] = memory.streamer_memory_limit({}, int(step), environ=env)
        out["env"] = env
    print("RESULT " + json.dumps(out))
    """
)


def _run_capped(cgroup: Path, base: Path, step: str) -> dict:
    base.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(cgroup), str(base), step],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT ") :])


@needs_cgroup
def test_memory_problem_sees_a_real_cgroup_cap(capped, base):
    """A process in a cgroup capped at 1.5 GiB on a host with far more available: 2 GiB of
    weights are refused naming the cap ('node': WeightSharingError; 'auto': not shared),
    100 MiB fit; 700 MiB written to the tmpfs are charged to the cgroup (after them 300 MiB
    no longer fit); a region that fit when made is refused before its pull starts when
    another model's region (1 GiB, none of it in yet) arrived meanwhile, and its waiter gets why."""
    inner = capped(3 * GiB // 2)
    out = _run_capped(inner, base, "check")
    parent = str(inner.parent)
    assert f"memory:/{inner.relative_to(V1_MEMORY)}" in out["cgroup"]
    assert out["binding"] == [parent, 3 * GiB // 2]
    # the host alone (the check before this change) would have said yes
    assert out["host_available"] > 4 * GiB
    cap = f"the cgroup {parent} allows"
    assert out["two_gib"].startswith(cap), out["two_gib"]
    assert "memory.limit_in_bytes 1.50 GiB" in out["two_gib"]
    assert (
        "2.75 GiB is needed (the weights need 2.00 GiB; an engine's CPU KV cache takes "
        "0.25 GiB; 0.50 GiB is kept free)" in (out["two_gib"])
    )
    assert out["hundred_mib"] is None
    assert "weight_sharing='node'" in out["node"] and cap in out["node"]
    assert "(2.00 GiB)" in out["node"]
    assert out["auto"] is None
    assert out["charged"] >= 690 * MiB, out["charged"]
    assert out["after_fill"] is not None and out["after_fill"].startswith(cap)
    assert out["mine_alone"] is None
    assert out["started"] is True
    waiter = out["waiter"]
    assert "WeightSharingError" in waiter and "not pulled into" in waiter, waiter
    assert "1 other region(s)" in waiter and "will take 1.00 GiB more" in waiter
    assert "the weights need 0.10 GiB" in waiter


@needs_cgroup
def test_streamer_limit_derived_from_a_real_cgroup_cap(capped, base):
    """No memory_limit given: an actor in a cgroup capped at 8 GiB with 2 engines per node
    gets RUNAI_STREAMER_MEMORY_LIMIT of 1 GiB (a quarter of each engine's 4 GiB); capped at
    2 GiB, the streamer's 0 (one tensor at a time)."""
    out = _run_capped(capped(8 * GiB), base, "2")
    assert out["limit"] == GiB
    assert out["env"] == {"RUNAI_STREAMER_MEMORY_LIMIT": str(GiB)}
    out = _run_capped(capped(2 * GiB), base, "1")
    assert out["limit"] == 0 and out["env"] == {"RUNAI_STREAMER_MEMORY_LIMIT": "0"}


def test_this_process_cgroup_is_found():
    """Where the machine has a memory cgroup, this process's own is found (its path in
    /proc/self/cgroup), innermost first."""
    text = Path("/proc/self/cgroup").read_text()
    levels = cgroup_levels()
    if "memory" not in text and not any(line.startswith("0::") for line in text.splitlines()):
        pytest.skip("no memory cgroup here")
    # found from inside a cgroup namespace too (where /proc/self/cgroup says "/"): the
    # innermost level is the directory whose cgroup.procs lists this process, each next one
    # its parent, each level's limit the one its file holds
    assert levels, text
    assert str(os.getpid()) in (Path(levels[0].path) / "cgroup.procs").read_text().split()
    for inner, outer in itertools.pairwise(levels):
        assert Path(inner.path).parent == Path(outer.path), (inner.path, outer.path)
    for level in levels:
        raw = (Path(level.path) / level.limit_file).read_text().strip()
        expected = None if raw == "max" or int(raw) >= memory.UNLIMITED else int(raw)
        assert level.limit == expected, (level, raw)
    # one view, judged on its own readings (a second reading of the host's memory, moments
    # later, differs on a busy machine: comparing with one made that test racy)
    view = memory.memory_view(levels)
    assert 0 < view.host_available <= psutil.virtual_memory().total
    assert view.available <= view.host_available
    limited = [lv.headroom for lv in levels if lv.headroom is not None]
    assert view.available == min([view.host_available, *limited]), (view, levels)
