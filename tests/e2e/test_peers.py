"""A job on three Ray nodes whose regions fill from each other over Ray (issue 22,
integrations/ray/peers.py), the store behind a slow link: the store read once for the cluster, and
a peer killed mid-copy replaced. The peers without an engine:
tests/integration/test_peers.py."""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

import pytest
from helpers.s3log import copy_model, prefix_of

from ray_stream_llm.fetch import fetch_metadata_report
from ray_stream_llm.integrations.ray import peers
from ray_stream_llm.tools.link import Link
from ray_stream_llm.weights import marks, pull

pytestmark = [pytest.mark.s3, pytest.mark.e2e]


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
    tail), SIGKILL the middle node's server (its node agent: Ray restarts it) while the tail
    has part of the weights, then, once every region is complete (the engines still hold
    them), compare each with the model's bytes."""
    import signal

    def complete(region: Path) -> bool:
        return all(marks.done(region, o.path) for o in objects)

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
    stages), the store behind a 48 KiB/s link, weight_peers=1 so that the nodes form a chain
    (root -> middle -> tail). The middle node's server, its node agent, is killed (SIGKILL)
    while the tail copies from it: the tail reports it lost and copies the rest from the
    root. Every row is answered; the store's access log shows each weight object read once
    for the whole cluster; every region equals the store's bytes; no region, peer actor or
    segment is left."""
    import threading

    from helpers.jobs import fixed_pool, run_isolated, store_through
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
                    "concurrency": fixed_pool(3),
                    # GPU 0 said: Ray 2.54's bundle schema counts one in a bundle naming none
                    "placement_group_config": {"bundles": [{"CPU": 1, "GPU": 0, "slot": 1}]},
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
        prefix_of(model.uri) + o.path: math.ceil(o.size / pull.CHUNK) + 2 for o in objects
    }, gets
    assert seen["equal"] and all(seen["equal"].values()), seen
    reports = out["load_reports"]
    assert len(reports) == 3 and all(r["weight_sharing"] == "node" for r in reports), reports
    assert sorted(r["pull_source"].split()[0] for r in reports) == ["peer", "peer", "store"]
    # nothing left: regions (run_isolated waited for their removal), peer actors, segments
    assert written == {} and out["peer_actors_left"] == [] and out["shm_left"] == [], out[
        "agent_logs"
    ]
    print(f"three nodes, a dead peer: {seconds:.1f}s, {link.bytes_down} bytes through the link")
