"""``ray-stream-llm doctor`` (issue 31, item 4): one row per Ray node, the problems with their
fix, exit status 1 when there is one. Two Ray nodes on this machine
(``ray.cluster_utils.Cluster``); a third made wrong by its own environment (the raylet's
``env_vars``, which its workers inherit) leaving the vLLM plugin out. The command runs as a
user types it, in a process of its own, against the real S3 server."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from ray_stream_llm.commands.doctor import DoctorReport

CLI = [sys.executable, "-m", "ray_stream_llm.cli", "doctor"]


BAD_PLUGINS = "something_else"


def _keys(server) -> dict[str, str]:
    """A node's own credentials (its environment, as on a real node): the keys, no endpoint."""
    return {
        "AWS_ACCESS_KEY_ID": server.access_key_id,
        "AWS_SECRET_ACCESS_KEY": server.secret_access_key,
        "AWS_REGION": server.region,
        "AWS_EC2_METADATA_DISABLED": "true",
    }


@pytest.fixture(scope="module")
def cluster(s3_server):
    """A head and a second node, both healthy, the store's keys in their environment."""
    from ray.cluster_utils import Cluster

    work = tempfile.mkdtemp(prefix="rsl-doc-", dir="/tmp")  # short: Ray's socket paths
    nowhere = {"AWS_CONFIG_FILE": f"{work}/none", "AWS_SHARED_CREDENTIALS_FILE": f"{work}/none"}
    env = {**_keys(s3_server), **nowhere}
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RAY_TMPDIR", work)
        patch.delenv("VLLM_PLUGINS", raising=False)
        made = Cluster(
            initialize_head=True,
            head_node_args={
                "num_cpus": 1,
                "include_dashboard": False,
                "env_vars": env,
                # a frozen node stays alive in the GCS's eyes for the test's length (by
                # default missed health checks would mark it dead after about 15 s)
                "_system_config": {"health_check_failure_threshold": 1000},
            },
        )
        try:
            made.add_node(num_cpus=1, env_vars=env)
            made.wait_for_nodes()
            yield made, env
        finally:
            made.shutdown()
            shutil.rmtree(work, ignore_errors=True)


def _doctor(args, cluster, timeout=300):
    """The command in a process of its own: the driver's environment holds the store's keys
    (for its listing) and RAY_ADDRESS; returns (exit status, stdout, stderr, seconds)."""
    made, node_env = cluster
    env = {
        "PATH": os.environ["PATH"],
        # the user's HOME and Ray's auth mode, as the shell that made the cluster has them:
        # once this process has run ray.init (an earlier test), Ray 2.60 has set
        # RAY_AUTH_MODE=token here and written ~/.ray/auth_token, and its clusters since
        # accept only clients that present that token
        "HOME": os.environ["HOME"],
        **{k: v for k, v in os.environ.items() if k == "RAY_AUTH_MODE"},
        "RAY_ADDRESS": made.address,
        **node_env,
    }
    begin = time.monotonic()
    # the nodes answer in seconds; a generous bound keeps a machine loaded by other test
    # streams from failing the run (a frozen node's test gives its own, which comes last)
    command = [*CLI, "--timeout", "120", *args]
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    return proc.returncode, proc.stdout, proc.stderr, time.monotonic() - begin


def _row(stdout: str, node_id: str) -> str:
    [line] = [ln for ln in stdout.splitlines() if ln.startswith(node_id[:8])]
    return line


@pytest.mark.e2e
@pytest.mark.s3
def test_the_node_whose_environment_leaves_the_plugin_out_is_flagged_with_its_fix(
    cluster, s3_server
):
    made, env = cluster
    head = made.head_node.node_id
    bad = made.add_node(num_cpus=1, env_vars={**env, "VLLM_PLUGINS": BAD_PLUGINS})
    raylet = bad.all_processes["raylet"][0].process.pid
    try:
        made.wait_for_nodes()
        status, out, err, seconds = _doctor([], cluster)
        # the same node frozen (its raylet stopped): a flagged row within the timeout
        os.kill(raylet, signal.SIGSTOP)
        try:
            frozen = _doctor(["--timeout", "10", "--json"], cluster)
        finally:
            os.kill(raylet, signal.SIGCONT)
    finally:
        made.remove_node(bad)
        made.wait_for_nodes()
    print(out, err[-2000:], f"doctor on 3 nodes: {seconds:.1f}s", sep="\n")
    print(f"doctor with a frozen node, --timeout 10: {frozen[3]:.1f}s")
    assert status == 1, (out, err[-2000:])
    assert "inactive" in _row(out, bad.node_id).split()
    assert "active" in _row(out, head).split()
    lines = out.splitlines()
    [problem] = [ln for ln in lines if ln.startswith("PROBLEM")]
    # the reason is plugin_inactive_reason's, read in the node's own environment
    assert problem.startswith(f"PROBLEM {bad.node_id[:8]}: the vLLM plugin is not active: ")
    assert f"VLLM_PLUGINS='{BAD_PLUGINS}'" in problem and "ray_stream_llm_load_report" in problem
    fix = lines[lines.index(problem) + 1]
    assert fix.startswith("  fix: on that node: ") and "VLLM_PLUGINS" in fix, fix
    assert out.splitlines()[-1].startswith("3 node(s), 1 problem(s)")
    assert frozen[0] == 1, frozen[1:3]
    rows = {r["node"]: r for r in json.loads(frozen[1])["nodes"]}
    assert rows[bad.node_id[:8]]["error"] == "did not answer within 10s (raise --timeout)"

    # the wrong node gone, the same cluster is healthy: exit 0, every row clean
    status, out, err, seconds = _doctor(["--json"], cluster)
    print(f"doctor on 2 healthy nodes: {seconds:.1f}s")
    assert status == 0, (out, err[-2000:])
    report = json.loads(out)
    assert report["problems"] == []
    assert sorted(r["node"] for r in report["nodes"]) == sorted(
        n.node_id[:8] for n in [made.head_node, *made.worker_nodes]
    )
    assert [r["head"] for r in report["nodes"]] == [True, False]
    for row in report["nodes"]:
        assert row["plugin"] is None and row["store"] is None and row["region"] is None
        assert row["versions"]["library"] and row["vllm_build"] in ("cpu", "cuda")
        assert row["shm"]["free"] > 0 and row["memory"]["available"] > 0
    assert s3_server.secret_access_key not in out + err


@pytest.mark.e2e
@pytest.mark.s3
def test_with_a_model_every_node_reads_a_mib_of_its_first_weight_from_the_store(
    cluster, s3_server, tiny_models
):
    """The endpoint travels to the nodes in the ObjectStoreConfig the command builds from
    --endpoint-url (their environment holds only the keys); each node lists the model and
    reads one range of its first weight file: the server's log shows one GET of that file
    per node, and none from the driver."""
    from helpers.s3log import AccessLog, prefix_of

    model = tiny_models["sharded"]
    first = min(p for p in model.weights if p.endswith(".safetensors"))
    size = (model.local / first).stat().st_size
    log = AccessLog(s3_server)
    args = [model.uri, "--endpoint-url", s3_server.endpoint_url, "--json"]
    status, out, err, seconds = _doctor(args, cluster)
    print(out[-3000:], err[-2000:], f"doctor with a model on 2 nodes: {seconds:.1f}s", sep="\n")
    assert status == 0, (out, err[-2000:])
    assert s3_server.secret_access_key not in out + err
    report = json.loads(out)
    assert report["weight_bytes"] == sum((model.local / p).stat().st_size for p in model.weights)
    for row in report["nodes"]:
        store = row["store"]
        assert store["reached"] and store["read"] == first, store
        assert store["read_bytes"] == min(size, 1 << 20) and store["mb_s"] > 0
        assert store["endpoint"] == s3_server.endpoint_url
    assert log.gets(prefix_of(model.uri) + first) == {prefix_of(model.uri) + first: 2}
    # the table the command prints of these rows: each row ends with the read rate
    table = DoctorReport(report["nodes"], [], seconds).table()
    for row, line in zip(report["nodes"], table[1:], strict=True):
        rate = [f"{row['store']['mb_s']:g}", "MB/s", f"{row['answered_s']:.1f}s"]
        assert line.split()[-3:] == rate, table


@pytest.mark.e2e
def test_with_no_cluster_a_local_one_is_started_and_stopped(tmp_path):
    before = set(Path("/tmp").glob("rsl-doctor-*"))
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path)}
    proc = subprocess.run(
        [*CLI, "--address", "local", "--json"], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    [row] = json.loads(proc.stdout)["nodes"]
    assert row["head"] and row["versions"]["ray"]
    assert set(Path("/tmp").glob("rsl-doctor-*")) == before  # its temporary Ray directory
