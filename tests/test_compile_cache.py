"""vLLM's compile cache on a node: the same job run twice in one HOME with default engine
arguments (vLLM's CPU build compiles the model with torch.compile); the second engine
loads the AOT artifact the first saved (issue 20). Real parts throughout: vLLM's CPU
build, the Run:ai streamer, SeaweedFS, Ray Data; nothing mocked.

The pure parts (the outcome rules, the feature detection of the load fix) are checked
without an engine.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from helpers import compile_store
from helpers.jobs import run_isolated

from ray_stream_llm.files import try_locked
from ray_stream_llm.integrations.vllm import compile_cache, compile_target

QUESTIONS = ["hello world", "ray data"]


@pytest.mark.s3
@pytest.mark.e2e
@pytest.mark.engine
def test_engines_compile_once_per_node_and_another_node_loads_it_from_the_store(
    s3_server, tiny_models, work
):
    """Three Ray nodes (``ray.cluster_utils.Cluster``). Nodes A and B have each their own
    vLLM cache, library cache, Inductor cache and TMPDIR, as two machines' disks would be:
    two engines start together on node A, one compiles, the other waits for its artifact
    and loads it, and the compiled engine ships the artifact to ``compile_cache_uri``; then
    the same job's engine on node B, whose cache is empty, fetches it before vLLM starts
    and loads it. Node C is on node A's host (its disk, vLLM's cache directory included)
    but its raylet has ``ATEN_CPU_CAPABILITY=avx2``, as an older CPU would (issue 32): its
    engine loads neither node A's artifact from the shared directory nor the store's, says
    why, compiles AVX2 code and ships it under its own target. (The same node's second start
    loading vLLM's local cache is tests/test_readme.py's own-model job.)"""
    model = tiny_models["single"]
    cache_uri = f"s3://models/compile-cache/{uuid.uuid4().hex[:8]}/"
    disks = {name: work / f"node-{name}" for name in ("a", "b")}
    for disk in disks.values():
        for sub in ("inductor", "tmp"):
            (disk / sub).mkdir(parents=True)
    # an instruction set below this CPU's: AVX2 on an AVX-512 CPU, none on an AVX2 one
    older = "avx2" if " avx512f" in Path("/proc/cpuinfo").read_text() else "default"
    older_target = {
        "avx2": "CPU AVX2, Inductor avx2",
        "default": "CPU DEFAULT, Inductor INVALID_VEC_ISA",
    }[older]
    widest = {"avx2": "zmm", "default": "ymm"}[older]  # registers only the wider ISA has

    def node(name: str, cpus: int, slots: int, disk: str, env: dict | None = None) -> dict:
        return {
            "num_cpus": cpus,
            "resources": {f"node_{name}": slots},
            "env_vars": {
                "VLLM_CACHE_ROOT": str(disks[disk] / "vllm"),
                "RAY_STREAM_LLM_CACHE": str(disks[disk] / "ray_stream_llm"),
                "TORCHINDUCTOR_CACHE_DIR": str(disks[disk] / "inductor"),
                "TMPDIR": str(disks[disk] / "tmp"),
                **(env or {}),
            },
        }

    def on(name: str, engines: int) -> dict:
        return {
            "concurrency": [engines, engines],  # a fixed pool: all start together
            "placement_group_config": {"bundles": [{"CPU": 1, f"node_{name}": 1}]},
        }

    before = s3_server.served()
    started = time.monotonic()
    out, _, _ = run_isolated(
        s3_server,
        work,
        model.uri,
        "runai_streamer",
        QUESTIONS,
        max_tokens=4,
        engine_kwargs={"enforce_eager": False},  # vLLM's default: compile
        config={"weight_sharing": "off", "compile_cache_uri": cache_uri},
        # every engine is ready before the rows flow, so that each reports: the product's
        # default (the rows wait for the engines a job starts with)
        nodes=[
            node("a", 6, 2, "a"),  # room for the CPU stages too
            node("b", 4, 1, "b"),
            node("c", 4, 1, "a", {"ATEN_CPU_CAPABILITY": older}),
        ],
        runs=[on("a", 2), on("b", 1), on("c", 1)],
        timeout=1200,
    )
    seconds = time.monotonic() - started
    log = (work / "job.log").read_text("utf-8", "replace")
    (out1, out2, out3) = out["runs"]
    together, [warm], [other] = (o["load_reports"] for o in out["runs"])
    # what each node's vLLM cache holds: node B only the artifact it fetched, unpacked whole;
    # node A's disk node A's and node C's
    aot = Path("torch_compile_cache/torch_aot_compile")
    compiled = sorted(p.name for p in (disks["a"] / "vllm" / aot).iterdir())
    fetched = [p.name for p in (disks["b"] / "vllm" / aot).iterdir()]
    # vLLM's own record, by where each process's cache is: one engine of node A compiled
    # and saved the artifact, the other loaded it, and so did node B's engine; node C's
    # engine compiled its own (another key: the CPU's ISA is in it) on the same disk and
    # loaded nothing; nobody compiled over a failed load
    saved = re.findall(r"saved AOT compiled function to (\S+)", log)
    loaded = re.findall(r"Directly load AOT compilation from path (\S+)", log)
    assert len(saved) == 2 and all(p.startswith(str(disks["a"])) for p in saved), log[-3000:]
    first, own = (Path(p).parts[-3] for p in saved)  # .../<hash>/rank_0_0/model
    assert first != own
    assert sorted(Path(p).relative_to(work).parts[0] for p in loaded) == ["node-a", "node-b"]
    assert {Path(p).parts[-3] for p in loaded} == {first}
    assert log.count("loaded the compiled artifact another engine of this node made") == 1
    assert "Compiling model again" not in log
    assert log.count("compile cache: shipped") == 2 and log.count("compile cache: fetched") == 1
    # the load reports say the same, from the engines' processes; node C's says why
    assert sorted(r["compile_cache"] for r in together) == ["hit", "miss"], together
    assert warm["compile_cache"] == "hit", warm  # (how much faster: bench --suite warm)
    assert other["compile_cache"].startswith("miss (artifact for CPU "), other
    assert other["compile_cache"].endswith(f"; this node {older_target})"), other
    # through the store: node A's artifact written (the tar, then its marker) and read by
    # node B, then node C's under the same model and another target
    cache = [r for r in s3_server.served()[len(before) :] if r.uri.startswith(cache_uri)]
    puts = list(
        dict.fromkeys(
            r.uri.removeprefix(cache_uri) for r in cache if r.method == "PUT" and r.status == 200
        )
    )
    names = [p.rsplit("/", 1)[1] for p in puts]
    assert names == [f"{first}.tar", f"{first}.done", f"{own}.tar", f"{own}.done"], puts
    models, targets = {p.split("/")[0] for p in puts}, [p.split("/")[1] for p in puts]
    assert len(models) == 1 and targets[0] == targets[1] != targets[2] == targets[3], puts
    assert compiled == sorted([first, own]) and fetched == [first]
    assert any(r.method == "GET" and r.uri.endswith(puts[0]) for r in cache)
    # node C's compiled kernels hold no instruction of node A's wider ISA: the capability
    # reached the engine's processes, and so would they run on an older CPU
    wide = {d: _kernels_with(disks["a"] / "vllm" / aot / d, widest) for d in (first, own)}
    assert wide[first][0] > 0 and wide[own][0] == 0 < wide[own][1], wide
    # the loaded code computes what the compiled code did (greedy decoding)
    answers = [{r["question"]: r["answer"] for r in o["rows"]} for o in (out1, out2, out3)]
    assert answers[0] == answers[1] and len(answers[0]) == len(answers[2]) == len(QUESTIONS)
    print(
        "\ncompile cache: two engines together "
        + ", ".join(
            f"ready {r['ready_seconds']:.1f}s compile {r['compile_seconds']:.1f}s "
            f"({r['compile_cache']})"
            for r in together
        )
        + f"; node B through the store: ready {warm['ready_seconds']:.1f}s, compile "
        f"{warm['compile_seconds']:.1f}s ({warm['compile_cache']}); node C "
        f"({older}): ready {other['ready_seconds']:.1f}s, compile "
        f"{other['compile_seconds']:.1f}s ({other['compile_cache']}); kernels with "
        f"{widest}: {wide}; answers {'the same' if answers[2] == answers[0] else 'differ'}; "
        f"job {seconds:.0f}s"
    )


def _kernels_with(artifact: Path, register: str) -> tuple[int, int]:
    """How many of an artifact's compiled kernels (Inductor's ``.so`` files, without the
    probes it builds to test each ISA) use ``register`` (``zmm``: AVX-512), of how many."""
    found = [0, 0]
    for kernel in sorted(artifact.rglob("*.so")):
        code = subprocess.run(
            ["objdump", "-d", str(kernel)], capture_output=True, text=True, check=True
        ).stdout
        if "_chk_kernel" in code:  # cpu_vec_isa's probe of an ISA, not the model's code
            continue
        found[0] += f"%{register}" in code
        found[1] += 1
    return found[0], found[1]


# --- without an engine -------------------------------------------------------------------------
def test_outcomes_from_the_records():
    base = {"pid": 1, "seconds": 2.0, "blocks": 1, "aot": True, "rank": 0}
    assert compile_cache.outcome({**base, "aot_loaded": 1}) == "hit"
    assert compile_cache.outcome({**base, "aot_compiles": 1}) == "miss"
    failed = {**base, "aot_compiles": 1, "load_failures": ["'function' object has no attribute"]}
    assert compile_cache.outcome(failed) == "load failed: 'function' object has no attribute"
    off = {**base, "aot": False, "inductor_cache": {"hit": 3, "miss": 0}}
    assert compile_cache.outcome(off) == "inductor hit"
    assert compile_cache.outcome({**off, "inductor_cache": {"hit": 3, "miss": 1}}) == "miss"
    # an engine: the slowest rank's seconds; one outcome, or each rank's when they differ
    rank1 = {**base, "pid": 2, "rank": 1, "seconds": 3.0}
    two = [{**base, "aot_loaded": 1}, {**rank1, "aot_loaded": 1}]
    assert compile_cache.figures(two) == {"compile_seconds": 3.0, "compile_cache": "hit"}
    two[1] = {**two[1], "aot_loaded": 0, "aot_compiles": 1}
    assert compile_cache.figures(two)["compile_cache"] == "rank 0: hit; rank 1: miss"
    # nothing compiled (enforce_eager, or the plugin excluded): no figures
    assert compile_cache.figures([]) == {"compile_seconds": None, "compile_cache": None}
    # why the store had nothing for this node, on a miss only
    why = "artifact for CPU AVX512; this node CPU AVX2"
    assert compile_cache.figures(two, why)["compile_cache"] == f"rank 0: hit; rank 1: miss ({why})"
    assert compile_cache.figures(two[:1], why)["compile_cache"] == "hit"


def test_records_written_in_the_directory_are_collected(tmp_path):
    (tmp_path / "compile").mkdir()
    (tmp_path / "compile" / "7.json").write_text('{"pid": 7, "blocks": 1, "seconds": 1.5}')
    (tmp_path / "compile" / "8.json.tmp").write_text("{")  # a write in progress: skipped
    (tmp_path / "0-1.json").write_text("{}")  # a streaming session: not a compile record
    assert compile_cache.collect(str(tmp_path)) == [{"pid": 7, "blocks": 1, "seconds": 1.5}]
    assert compile_cache.collect(str(tmp_path / "gone")) == []


def test_a_process_records_what_vllm_said_and_never_remakes_a_removed_directory(
    tmp_path, monkeypatch
):
    import logging
    import os

    monkeypatch.delenv("RAY_STREAM_LLM_LOAD_REPORT_DIR", raising=False)
    recorder = compile_cache._Recorder(str(tmp_path))
    reason = "'function' object has no attribute 'finalize_loading'"
    # vLLM's own warning, as decorators.py logs it
    recorder.handle(
        logging.LogRecord(
            "vllm.compilation.decorators",
            logging.WARNING,
            __file__,
            1,
            "Compiling model again due to a load failure from %s, reason: %s",
            ("/x/rank_0_0/model", reason),
            None,
        )
    )
    # vLLM 0.32's: the compile tag first
    recorder.handle(
        logging.LogRecord(
            "vllm.compilation.decorators",
            logging.WARNING,
            __file__,
            1,
            "%sCompiling model again due to a load failure from %s, reason: %s",
            ("[backbone] ", "/x/rank_0_0/model", "Compile cache file corrupted."),
            None,
        )
    )
    recorder.seconds, recorder.blocks = 2.5, 2
    recorder.write()
    [record] = compile_cache.collect(str(tmp_path))
    assert (record["pid"], record["seconds"], record["blocks"]) == (os.getpid(), 2.5, 2)
    assert record["load_failures"] == [reason, "Compile cache file corrupted."]
    assert compile_cache.outcome(record) == "load failed: Compile cache file corrupted."
    gone = compile_cache._Recorder(str(tmp_path / "removed"))
    gone.blocks = 1
    gone.write()
    assert not (tmp_path / "removed").exists()


def test_the_load_fix_is_feature_detected():
    """On this stack (vLLM 0.29 calls finalize_loading on every loaded artifact, torch's
    bundled artifact has none) the fix is needed; once applied it is not needed again,
    and it only adds a method that does nothing."""
    from torch._dynamo.aot_compile_types import BundledAOTAutogradSerializableCallable as cls

    had = "finalize_loading" in vars(cls)
    try:
        if not had:
            assert compile_cache.needs_fix()
        compile_cache.fix_aot_load()
        assert not compile_cache.needs_fix()
        assert cls.finalize_loading(object.__new__(cls), None) is None
    finally:
        if not had and "finalize_loading" in vars(cls):
            del cls.finalize_loading


def test_a_shared_region_keys_the_compile_cache_by_its_digest_not_its_node(tiny_layout, tmp_path):
    """vLLM's AOT cache key hashes model_weights; an engine on the node's shared region has
    ``<base>/<ray node id>/<digest>`` there. With the plugin's key, the same region on
    another node (or the same node in a new Ray cluster) gives the same key, another
    region another key, and anything else is keyed as vLLM keys it."""
    from vllm.compilation import caching
    from vllm.engine.arg_utils import EngineArgs

    from ray_stream_llm.weights.region import CREATED

    regions = []
    for node, digest in (("node-a", "0123"), ("node-b", "0123"), ("node-b", "4567")):
        (tmp_path / node / digest).mkdir(parents=True)
        (tmp_path / node / digest / CREATED).write_text("{}")
        regions.append(str(tmp_path / node / digest))
    config = EngineArgs(
        model=str(tiny_layout("single")), load_format="runai_streamer"
    ).create_engine_config()

    def key(weights: str) -> list[str]:
        config.model_config.model_weights = weights
        return list(caching.aot_compile_hash_factors(config))

    installed = caching.aot_compile_hash_factors  # vLLM's, or the plugin's if it ran here
    original = getattr(installed, "__wrapped__", installed)
    caching.aot_compile_hash_factors = original
    assert key(regions[0]) != key(regions[1])  # vLLM's own key: one per node
    try:
        assert compile_cache.stable_key()
        assert key(regions[0]) == key(regions[1]) != key(regions[2])
        assert config.model_config.model_weights == regions[2]  # left as vLLM had it
        assert compile_cache.stable_key()  # idempotent
        target = compile_target.key_factor(compile_target.target())
        for weights in ("s3://models/tiny/single/", str(tmp_path / "node-a"), ""):
            config.model_config.model_weights = weights  # not a region: vLLM's own key
            assert caching.aot_compile_hash_factors(config) == [*original(config), target]
    finally:
        caching.aot_compile_hash_factors = installed


def test_the_same_metadata_under_two_uris_keys_alike(tiny_layout, tmp_path):
    """Every engine's ``model`` is this library's metadata directory, named after the model's
    URI: with the plugin's key a copy of the model under another URI (the same files) gets
    the same key, streamed from the store or from the node's region, a changed config.json
    another, and a directory the library did not fetch is keyed as vLLM keys it."""
    import json
    import shutil

    from vllm.compilation import caching
    from vllm.engine.arg_utils import EngineArgs

    from ray_stream_llm.fetch import MARKER, _crc32
    from ray_stream_llm.weights.marks import CREATED

    source = tiny_layout("single")
    names = sorted(p.name for p in source.iterdir() if p.is_file() and "safetensors" not in p.name)
    dirs = {}
    for name in ("aaaa", "bbbb", "cccc"):
        dirs[name] = tmp_path / name
        dirs[name].mkdir()
        for file in names:
            shutil.copy(source / file, dirs[name] / file)
    config_json = json.loads((dirs["cccc"] / "config.json").read_text())
    config_json["rms_norm_eps"] = config_json.get("rms_norm_eps", 1e-6) * 10
    (dirs["cccc"] / "config.json").write_text(json.dumps(config_json))
    for uri, name in (("s3://a/m/", "aaaa"), ("s3://b/copy/", "bbbb"), ("s3://c/m/", "cccc")):
        files = {  # as fetch_model_metadata records them; ETags differ between stores
            f: {
                "size": (dirs[name] / f).stat().st_size,
                "etag": f"{name}-{f}",
                "crc32": _crc32(dirs[name] / f),
            }
            for f in names
        }
        (dirs[name] / MARKER).write_text(json.dumps({"version": 2, "uri": uri, "files": files}))
    config = EngineArgs(
        model=str(dirs["aaaa"]), load_format="runai_streamer"
    ).create_engine_config()

    uris = {"aaaa": "s3://a/m/", "bbbb": "s3://b/copy/", "cccc": "s3://c/m/"}

    def key(model: Path) -> list[str]:
        config.model_config.model = str(model)
        config.model_config.model_weights = uris[model.name]  # streamed from there
        return list(caching.aot_compile_hash_factors(config))

    installed = caching.aot_compile_hash_factors
    original = getattr(installed, "__wrapped__", installed)
    caching.aot_compile_hash_factors = original
    assert key(dirs["aaaa"]) != key(dirs["bbbb"])  # vLLM's own key: one per path
    try:
        assert compile_cache.stable_key()
        assert key(dirs["aaaa"]) == key(dirs["bbbb"]) != key(dirs["cccc"])
        assert config.model_config.model == str(dirs["cccc"])  # left as vLLM had it
        assert config.model_config.model_weights == "s3://c/m/"
        # streamed from the node's region (named by a digest of the URI) or from the store:
        # the same key, whatever the URI
        region = tmp_path / "node-a" / "0123"
        region.mkdir(parents=True)
        (region / CREATED).write_text("{}")
        streamed = key(dirs["aaaa"])
        config.model_config.model_weights = str(region)
        assert list(caching.aot_compile_hash_factors(config)) == streamed
        config.model_config.model_weights = uris["bbbb"]
        (dirs["bbbb"] / MARKER).unlink()  # not fetched by the library: vLLM's own key
        config.model_config.model = str(dirs["bbbb"])
        target = compile_target.key_factor(compile_target.target())
        assert caching.aot_compile_hash_factors(config) == [*original(config), target]
    finally:
        caching.aot_compile_hash_factors = installed


def _hold_then(artifact: str, cache: str, seconds: float, save: bool, ready) -> None:
    """Another engine's process: claims the artifact, 'compiles' for ``seconds``, saves it
    (or not) and ends its compile block, which releases the lock (its exit would too)."""
    os.environ["RAY_STREAM_LLM_CACHE"] = cache
    assert compile_cache.claim_or_wait(artifact, lambda: None) is None  # it compiles
    ready.set()
    time.sleep(seconds)
    if save:
        Path(artifact).write_text("compiled")
    Path(artifact + ".released").write_text(repr(time.time()))  # the moment it lets go
    compile_cache._release()


@pytest.mark.parametrize("save", [True, False])
def test_an_engine_waits_for_the_node_compile_then_loads_or_compiles_itself(
    tmp_path, monkeypatch, save
):
    """The lock protocol between two real processes: while one compiles, the other waits;
    it loads the artifact once saved, or compiles itself once the holder ends without one."""
    import multiprocessing

    monkeypatch.setenv("RAY_STREAM_LLM_CACHE", str(tmp_path / "cache"))
    artifact = str(tmp_path / "rank_0_0" / "model")
    Path(artifact).parent.mkdir()
    ctx = multiprocessing.get_context("fork")
    ready = ctx.Event()
    holder = ctx.Process(
        target=_hold_then, args=(artifact, str(tmp_path / "cache"), 2.0, save, ready)
    )
    holder.start()
    try:
        assert ready.wait(30)  # the holder has claimed the artifact
        got = compile_cache.claim_or_wait(artifact, lambda: Path(artifact).read_text())
        returned = time.time()
    finally:
        holder.join(30)
    # it waited for the holder: it returned only once the holder had let go (a moment the
    # holder recorded, not a duration, which a loaded machine stretches either way)
    assert returned >= float(Path(artifact + ".released").read_text())
    if save:
        assert got == "compiled" and not compile_cache._held  # loaded; holds nothing
    else:
        assert got is None and artifact in compile_cache._held  # compiles itself, locked
        compile_cache._release()


def test_the_wait_for_another_engines_compile_is_bounded(tmp_path, monkeypatch):
    monkeypatch.setenv("RAY_STREAM_LLM_CACHE", str(tmp_path / "cache"))
    artifact = str(tmp_path / "model")
    held = try_locked(compile_cache._lock_path(artifact))  # held by "another"
    assert held is not None
    with held:
        start = time.monotonic()
        assert compile_cache.claim_or_wait(artifact, lambda: "x", wait_s=1.0) is None
        assert 1.0 <= time.monotonic() - start < 10


# --- the store's half, against the real S3 server (no engine; GCS and Azure: test_gcs.py,
# test_azure.py) ----------------------------------------------------------------------------
@pytest.mark.s3
def test_an_artifact_shipped_is_fetched_whole_and_never_replaced(s3_env, s3_server, tmp_path):
    s3_server.create_bucket("compile-cache")
    compile_store.shipped_is_fetched_whole_and_never_replaced(
        compile_store.unique("s3://compile-cache/"), None, tmp_path
    )


@pytest.mark.s3
def test_a_damaged_artifact_is_named_and_not_used(s3_env, s3_server, tmp_path, caplog):
    s3_server.create_bucket("compile-cache")
    compile_store.damaged_is_named_and_not_used(
        compile_store.unique("s3://compile-cache/"), None, tmp_path, caplog
    )


@pytest.mark.s3
def test_an_artifact_for_another_cpu_is_never_unpacked_and_the_fetch_says_why(
    s3_env, s3_server, tmp_path, caplog
):
    s3_server.create_bucket("compile-cache")
    compile_store.other_target_is_never_unpacked(
        compile_store.unique("s3://compile-cache/"), None, tmp_path, caplog
    )


KEYS_SCRIPT = """
import json, sys
from ray_stream_llm.integrations.vllm import compile_store, compile_target
target = compile_target.target()
print(json.dumps({
    "target": target,
    "store": str(compile_store.cache_key(sys.argv[1])),
    "local": compile_target.key_factor(target),  # what stable_key adds to vLLM's key
}))
"""


def _as_fetched(source: Path, dest: Path, uri: str) -> Path:
    """A copy of a model's metadata files with the marker ``fetch_model_metadata`` writes."""
    import shutil

    from ray_stream_llm.fetch import MARKER, _crc32

    dest.mkdir()
    files = {}
    for path in sorted(p for p in source.iterdir() if p.is_file()):
        if "safetensors" not in path.name:
            shutil.copy(path, dest / path.name)
            size, crc = path.stat().st_size, _crc32(dest / path.name)
            files[path.name] = {"size": size, "etag": "e", "crc32": crc}
    (dest / MARKER).write_text(json.dumps({"version": 2, "uri": uri, "files": files}))
    return dest


def test_the_keys_hold_the_cpu_instruction_set_torch_and_inductor_use(tiny_layout, tmp_path):
    """Issue 32: the same model on nodes whose ``ATEN_CPU_CAPABILITY`` differs (torch and
    Inductor then emit code for another instruction set, as on an older CPU) gets other
    keys, vLLM's local one (two Ray nodes of one host share its directory; the factor
    stable_key adds to it, as the key tests above check) and the store's; nodes whose
    capability is the same get the same keys. Each node is a fresh interpreter with that
    environment."""
    model = _as_fetched(tiny_layout("single"), tmp_path / "model", "s3://models/tiny/")
    env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
    nodes = {"as it is": {}, "avx2": {"ATEN_CPU_CAPABILITY": "avx2"}}
    nodes |= {"avx512": {"ATEN_CPU_CAPABILITY": "avx512"}}  # this CPU's own, spelled out
    nodes |= {"default": {"ATEN_CPU_CAPABILITY": "default"}}  # no vector ISA at all
    logs = {name: tmp_path / f"{name.replace(' ', '-')}.log" for name in nodes}
    procs = {}
    for name, extra in nodes.items():  # together; their output in files (no pipe to fill)
        with open(logs[name], "w") as log:
            procs[name] = subprocess.Popen(
                [sys.executable, "-c", KEYS_SCRIPT, str(model)],
                env={**env, **extra},
                stdout=log,
                stderr=subprocess.STDOUT,
            )
    keys = {}
    for name, proc in procs.items():
        assert proc.wait(timeout=600) == 0, logs[name].read_text()[-3000:]
        [line] = [x for x in logs[name].read_text().splitlines() if x.startswith('{"target"')]
        keys[name] = json.loads(line)
    print("\n" + "\n".join(f"{n}: {compile_target.describe(k['target'])}" for n, k in keys.items()))
    assert keys["avx2"]["target"]["cpu_capability"] == "AVX2"
    assert keys["avx2"]["target"]["vec_isa"] == "avx2"
    assert keys["default"]["target"]["vec_isa"] == "INVALID_VEC_ISA"
    isa = ("cpu_capability", "vec_isa", "vec_isa_flags")
    pairs = [(a, b) for a in keys for b in keys if a < b]
    for a, b in pairs:
        same = [keys[a]["target"][f] for f in isa] == [keys[b]["target"][f] for f in isa]
        for kind in ("local", "store"):
            assert (keys[a][kind] == keys[b][kind]) == same, (a, b, kind, keys[a], keys[b])
    # both answers occur: the check can fail either way
    assert keys["as it is"]["store"] == keys["avx512"]["store"]  # AVX-512 or AVX2-only CPU
    assert keys["as it is"]["store"] != keys["default"]["store"]
    # the store's key: the model's part is the same, the target's differs
    models = {k["store"].split("/")[0] for k in keys.values()}
    assert len(models) == 1 and "None" not in models


def test_compile_cache_uri_is_checked_on_the_driver():
    from ray_stream_llm import StreamingvLLMEngineProcessorConfig
    from ray_stream_llm.errors import InvalidSettingError

    kwargs = {"model_source": "s3://models/x/", "engine_kwargs": {"load_format": "runai_streamer"}}
    config = StreamingvLLMEngineProcessorConfig(**kwargs, compile_cache_uri="s3://bucket/cache/")
    assert config.compile_cache_uri == "s3://bucket/cache/"
    for good in ("gs://bucket/cache/", "az://container/cache/"):
        assert StreamingvLLMEngineProcessorConfig(**kwargs, compile_cache_uri=good)
    for bad in ("/local/dir", "cache", "hf://org/model", "s3://"):
        with pytest.raises(InvalidSettingError, match="compile_cache_uri is"):
            StreamingvLLMEngineProcessorConfig(**kwargs, compile_cache_uri=bad)
