"""vLLM's compile cache on a node: the same job run twice in one HOME with default engine
arguments (vLLM's CPU build compiles the model with torch.compile); the second engine
loads the AOT artifact the first saved (issue 20), and another node loads it from the
store. Real parts throughout: vLLM's CPU build, the Run:ai streamer, SeaweedFS, Ray Data;
nothing mocked. The pure parts: tests/unit/integrations/vllm/test_compile_cache.py."""

from __future__ import annotations

import re
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from helpers.jobs import ENGINE_ONLY, fixed_pool, run_isolated

QUESTIONS = ["hello world", "ray data"]


@pytest.mark.s3
@pytest.mark.e2e
@pytest.mark.engine
def test_engines_compile_once_per_node_and_another_node_loads_it_from_the_store(
    s3_server, tiny_models, work
):
    """Three Ray nodes (``ray.cluster_utils.Cluster``). Nodes A and B have each their own
    vLLM cache, library cache, Inductor cache and TMPDIR, as two machines' disks would be
    (vLLM's own key, which the library leaves as it is, hashes the model directory's path:
    the library gives it one path on every node, issue 55):
    two engines start together on node A, one compiles, the other waits for its artifact
    and loads it, and the compiled engine ships the artifact to ``compile_cache_uri``; then
    the same job's engine on node B, whose cache is empty, fetches it before vLLM starts
    and loads it. Node C is on node A's host (its disk, vLLM's cache directory included)
    but its raylet has ``ATEN_CPU_CAPABILITY=avx2``, as an older CPU would (issue 32): its
    engine's ``VLLM_CACHE_ROOT`` is its target's own directory, so it loads neither node A's
    artifact (the same vLLM key, in node A's target directory) nor the store's, says why,
    compiles AVX2 code and ships it under its own target. Each run is the engine's
    alone (``helpers.jobs.ENGINE_ONLY``). (The same node's second start loading vLLM's
    local cache is tests/e2e/test_readme.py's own-model job.)"""
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
            "concurrency": fixed_pool(engines),  # all start together
            # GPU 0 said: Ray 2.54's bundle schema counts one in a bundle naming none
            "placement_group_config": {"bundles": [{"CPU": 1, "GPU": 0, f"node_{name}": 1}]},
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
        config={"weight_sharing": "off", "compile_cache_uri": cache_uri, **ENGINE_ONLY},
        # every engine is ready before the rows flow, so that each reports: the product's
        # default (the rows wait for the engines a job starts with)
        nodes=[
            node("a", 4, 2, "a"),
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
    # what each node's vLLM cache holds, by target directory: node B only the artifact it
    # fetched, unpacked whole; node A's disk node A's and node C's, each in its target's
    aot = Path("torch_compile_cache/torch_aot_compile")
    compiled, fetched = (_artifacts(disks[d] / "vllm", aot) for d in ("a", "b"))
    # vLLM's own record, by where each process's cache is: one engine of node A compiled
    # and saved the artifact, the other loaded it, and so did node B's engine; node C's
    # engine compiled its own (vLLM's key the same: its target's own directory) on the same
    # disk and loaded nothing; nobody compiled over a failed load
    saved = re.findall(r"saved AOT compiled function to (\S+)", log)
    loaded = re.findall(r"Directly load AOT compilation from path (\S+)", log)
    assert len(saved) == 2 and all(p.startswith(str(disks["a"])) for p in saved), log[-3000:]
    first, own = (Path(p).parts[-3] for p in saved)  # .../<hash>/rank_0_0/model
    # <disk>/vllm/<target>/...: vLLM's own key, the same on every node; the target apart
    first_t, own_t = (Path(p).relative_to(disks["a"] / "vllm").parts[0] for p in saved)
    assert first == own and first_t != own_t, saved
    assert sorted(Path(p).relative_to(work).parts[0] for p in loaded) == ["node-a", "node-b"]
    assert {Path(p).parts[-3] for p in loaded} == {first}
    assert {Path(p).relative_to(work).parts[2] for p in loaded} == {first_t}
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
    assert compiled == {first_t: [first], own_t: [own]} and fetched == {first_t: [first]}
    assert any(r.method == "GET" and r.uri.endswith(puts[0]) for r in cache)
    # node C's compiled kernels hold no instruction of node A's wider ISA: the capability
    # reached the engine's processes, and so would they run on an older CPU
    wide = {
        t: _kernels_with(disks["a"] / "vllm" / t / aot / first, widest) for t in (first_t, own_t)
    }
    assert wide[first_t][0] > 0 and wide[own_t][0] == 0 < wide[own_t][1], wide
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


def _artifacts(root: Path, aot: Path) -> dict[str, list[str]]:
    """The AOT artifacts under a vLLM cache ``root``, by target directory."""
    return {
        t.name: sorted(p.name for p in (t / aot).iterdir())
        for t in sorted(root.iterdir())
        if (t / aot).is_dir()
    }


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
