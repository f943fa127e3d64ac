"""Two engines on one node share one pull of the weights (issue 12), end to end through
Ray Data, vLLM's CPU build and the real S3 server: every row answered, each weight byte
served once (the server's access log, and a counting proxy standing for the node's
link), no weight file on a disk-backed path, and no region, lock or process left."""

from __future__ import annotations

import math
import time
from pathlib import Path

import psutil
import pytest
from helpers.faultproxy import FaultProxy
from helpers.jobs import run_isolated, store_through
from helpers.s3log import AccessLog, prefix_of

from ray_stream_llm.integrations.node_weights import CHUNK, DEFAULT_BASE

pytestmark = [pytest.mark.s3, pytest.mark.e2e]
QUESTIONS = [
    "What is 2+2?",
    "Name three primary colors.",
    "Say hello in French.",
    "What is the capital of France?",
]


def _reapers() -> list[psutil.Process]:
    return [
        p
        for p in psutil.process_iter(["cmdline"])
        if "ray_stream_llm.integrations.node_weights" in (p.info["cmdline"] or [])
    ]


def test_two_engines_share_one_pull(s3_server, smollm2, work):
    size = (smollm2.local / "model.safetensors").stat().st_size
    log = AccessLog(s3_server)
    with FaultProxy(s3_server.port) as link:
        store = store_through(s3_server, link.endpoint_url)
        out, written, seconds = run_isolated(
            s3_server,
            work,
            smollm2.uri,
            "runai_streamer",
            QUESTIONS,
            max_tokens=8,
            object_store=store,
            config={"concurrency": [2, 2], "weight_sharing": "node"},
            num_cpus=4,
            # both engines start before the first batch goes out (Ray Data otherwise sends
            # the work to the first one ready, and the other may never be needed)
            env={"RAY_DATA_DEFAULT_WAIT_FOR_MIN_ACTORS_S": "900"},
        )
        link_bytes = link.bytes_down
    assert sorted(r["question"] for r in out["rows"]) == sorted(QUESTIONS)
    assert all(r["answer"] for r in out["rows"])
    reports = out["load_reports"]
    assert len(reports) == 2 and len({r["pid"] for r in reports}) == 2
    assert all(r["weight_sharing"] == "node" and r["weight_bytes"] == size for r in reports)
    # the store served model.safetensors once: each 8 MiB range in one GET, no more, plus
    # the two ranged GETs of the driver's preflight (the header's length, then the header)
    gets = log.gets(prefix_of(smollm2.uri))
    assert gets[prefix_of(smollm2.uri) + "model.safetensors"] == math.ceil(size / CHUNK) + 2
    # the node's link carried the weights once (plus metadata, listings, HTTP framing)
    assert size <= link_bytes < 1.2 * size, (link_bytes, size)
    # no weight file of any format on a disk-backed path: the only copy is the node's region
    # in memory (/dev/shm), which is removed next
    assert {p: n for p, n in written.items() if not p.startswith(DEFAULT_BASE + "/")} == {}
    # nothing left: the region, its locks, the reaper
    deadline = time.monotonic() + 20
    while (Path(DEFAULT_BASE).exists() and any(Path(DEFAULT_BASE).rglob("*"))) or _reapers():
        assert time.monotonic() < deadline, (list(Path(DEFAULT_BASE).rglob("*")), _reapers())
        time.sleep(0.5)
    print(
        f"\n2 engines, shared: {link_bytes} bytes over the link for {size} weight bytes; "
        f"waits {[round(r['weight_wait_seconds'], 2) for r in reports]} s; pull hidden "
        f"{[round(r['pull_hidden_seconds'] or 0, 2) for r in reports]} s; {seconds:.1f}s"
    )
