"""vLLM's compile cache on a node (issue 20; integrations/vllm/compile_cache.py), its pure
parts without an engine: the outcome rules from vLLM's records, the feature detection of
vLLM's own key and the cache root per target, and the bounded wait for another
engine's compile (real processes holding the lock). The engines that compile and load:
tests/e2e/test_compile_cache.py; the artifacts on a real store:
tests/integration/test_compile_store.py."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from ray_stream_llm.files import try_locked
from ray_stream_llm.integrations.vllm import compile_cache, compile_target


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


def test_vllms_own_key_stays_and_is_the_same_on_every_node(tiny_layout, tmp_path):
    """Issue 55: the plugin leaves vLLM's ``aot_compile_hash_factors`` as vLLM has it. Its
    key hashes ``model_weights``: a region's path (``<base>/<ray node id>/<digest>``) would
    give every node its own key, so an engine is given the model's URI there, the same on
    every node, and the region apart (tests/integration/test_region_trust.py)."""
    from vllm.compilation import caching
    from vllm.engine.arg_utils import EngineArgs

    original = caching.aot_compile_hash_factors
    compile_cache.install(None)
    assert caching.aot_compile_hash_factors is original
    assert original.__module__ == "vllm.compilation.caching"
    config = EngineArgs(
        model=str(tiny_layout("single")), load_format="runai_streamer"
    ).create_engine_config()

    def key(weights: str) -> list[str]:
        config.model_config.model_weights = weights
        return list(caching.aot_compile_hash_factors(config))

    regions = [str(tmp_path / node / "0123") for node in ("node-a", "node-b")]
    assert key(regions[0]) != key(regions[1])  # why a region's path is not given to vLLM
    assert key("s3://models/tiny/single/") == key("s3://models/tiny/single/")


def test_each_compile_target_has_its_own_vllm_cache_root():
    """vLLM's key leaves out what the code is compiled for: the engine actor sets
    ``VLLM_CACHE_ROOT`` to a directory of the target's own under the user's root, so an
    AVX2 node never looks up an AVX-512 node's artifact; the same target, the same root."""
    amx = {
        "arch": "x86_64",
        "cpu_capability": "AVX512",
        "vec_isa": "avx512 avx512_vnni amx_tile",
        "vec_isa_flags": "-mavx512f -mamx-tile",
        "device": "cpu",
        "device_capability": None,
        "torch": "2.13.0+cpu",
        "vllm": "0.29.0",
    }
    avx2 = {**amx, "cpu_capability": "AVX2", "vec_isa": "avx2", "vec_isa_flags": "-mavx2"}
    base = "/home/u/.cache/vllm"
    roots = {name: compile_target.cache_root(base, t) for name, t in (("amx", amx), ("avx2", avx2))}
    assert roots["amx"] != roots["avx2"]
    for root in roots.values():
        assert os.path.dirname(root) == base
    assert os.path.basename(roots["amx"]).startswith("cpu-avx512-")
    assert compile_target.cache_root(base, dict(amx)) == roots["amx"]
    assert compile_target.cache_root(roots["amx"], amx) == roots["amx"]  # a second start
    gpu = {**amx, "device": "cuda", "device_capability": "9.0"}
    assert os.path.basename(compile_target.cache_root(base, gpu)).startswith("cuda-9.0-")


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
