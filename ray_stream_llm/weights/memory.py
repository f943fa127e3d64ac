"""Memory this process may really use, read where a container's limit lives.

A container's (a Kubernetes pod's) memory limit is its cgroup's, not the host's: the
host's ``MemAvailable`` can say 1.5 TB while the pod may use 32 GiB, and the pages of
a tmpfs (``/dev/shm``) count against the cgroup of the process that wrote them. So:

* :func:`cgroup_levels` reads this process's memory cgroup and every ancestor up to the
  hierarchy's root (a parent's limit applies too): cgroup v2 ``memory.max`` /
  ``memory.current``, cgroup v1 ``memory.limit_in_bytes`` / ``memory.usage_in_bytes``,
  found through ``/proc/self/cgroup`` and ``/proc/self/mountinfo``. In use means the
  usage less the reclaimable file cache (``inactive_file``), as the kubelet counts it;
  tmpfs pages are never reclaimable (no swap), so they stay counted.
* :func:`memory_view` is the least of the host's available memory and every level's
  headroom (limit - in use), and names which one binds.
* :func:`regions_under` counts the node's regions already under a base: bytes present
  and bytes still to come (the objects its marker plans, less what its whole and partial
  files hold).
* :func:`memory_problem` says whether one more region fits: its weights, the other
  regions' bytes still to come, the CPU KV cache an engine will reserve and a margin,
  against the tmpfs's free space and the memory view, and names every size.
* :func:`kv_cache_default_bytes` and :func:`streamer_memory_limit` size the engine's CPU
  KV cache and the Run:ai streamer's CPU buffer from the same view; :func:`kv_cache_usable_bytes`
  bounds the KV cache by what the engine can ever hold (its sequences at full length).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path
from typing import Any

from ray_stream_llm.weights.marks import objects_of, partial

logger = logging.getLogger(__name__)

GiB = 1 << 30
MiB = 1 << 20
MARGIN = 512 << 20  # memory kept free beyond what is counted
UNLIMITED = 1 << 62  # cgroup v1 writes "no limit" as a page-aligned 2**63 - 1

KV_CACHE_SHARE = 0.2  # of the memory available when the engine starts
KV_CACHE_MIN = 256 << 20
KV_CACHE_MAX = 8 << 30

STREAMER_LIMIT_ENV = "RUNAI_STREAMER_MEMORY_LIMIT"
STREAMER_SHARE = 0.25  # of an engine's share of the actor's memory
STREAMER_FLOOR = 1 << 30  # below this, the streamer's "0": one tensor at a time
STREAMER_DEFAULT = 40_000_000_000  # the streamer's own default (40 GB)


def _gib(n: int | float) -> str:
    return f"{n / GiB:.2f} GiB"


# per cgroup version: its usage file, its limit file, and the names memory.stat gives the
# inactive file cache (v1's hierarchical total first)
_FILES: dict[int, tuple[str, str, tuple[str, ...]]] = {
    2: ("memory.current", "memory.max", ("inactive_file",)),
    1: ("memory.usage_in_bytes", "memory.limit_in_bytes", ("total_inactive_file", "inactive_file")),
}


@dataclasses.dataclass(frozen=True)
class CgroupLevel:
    """One memory cgroup on the way from this process's to the hierarchy's root."""

    path: str  # the directory under /sys/fs/cgroup...
    version: int  # 1 or 2
    limit: int | None  # None: no limit at this level
    usage: int  # bytes charged, less the reclaimable file cache

    @property
    def headroom(self) -> int | None:
        return None if self.limit is None else max(0, self.limit - self.usage)

    @property
    def limit_file(self) -> str:
        return _FILES[self.version][1]


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if text == "max":
        return None
    try:
        value = int(text)
    except ValueError:
        return None
    return None if value >= UNLIMITED else value


def _stat_value(directory: Path, names: tuple[str, ...]) -> int:
    try:
        lines = (directory / "memory.stat").read_text().splitlines()
    except OSError:
        return 0
    values = dict(line.split(" ", 1) for line in lines if " " in line)
    for name in names:
        if name in values:
            try:
                return int(values[name])
            except ValueError:
                return 0
    return 0


def _mounts(mountinfo: str) -> list[tuple[str, str, int]]:
    """(root, mount point, version) of each cgroup v2 mount and cgroup v1 memory mount."""
    found = []
    for line in mountinfo.splitlines():
        head, sep, tail = line.partition(" - ")
        fields, rest = head.split(), tail.split()
        if not sep or len(fields) < 5 or len(rest) < 3:
            continue
        if rest[0] == "cgroup2" or (rest[0] == "cgroup" and "memory" in rest[2].split(",")):
            version = 2 if rest[0] == "cgroup2" else 1
            found.append((fields[3], fields[4].replace("\\040", " "), version))
    return found


def _directory(mount_point: str, mount_root: str, path: str) -> Path:
    """The directory of cgroup ``path`` under a mount of the hierarchy's ``mount_root``."""
    if mount_root != "/" and (path == mount_root or path.startswith(mount_root.rstrip("/") + "/")):
        path = path[len(mount_root.rstrip("/")) :]
    candidate = Path(mount_point) / path.lstrip("/")
    # a cgroup namespace shows "/" or a path the mount does not have: the mount is ours
    return candidate if candidate.is_dir() else Path(mount_point)


def cgroup_levels(proc: str = "/proc/self") -> list[CgroupLevel]:
    """This process's memory cgroup and its ancestors (v2 and v1 hierarchies), innermost
    first; [] where there is no cgroup file system to read."""
    try:
        cgroups = Path(proc, "cgroup").read_text().splitlines()
        mountinfo = Path(proc, "mountinfo").read_text()
    except OSError:
        return []
    mounts = _mounts(mountinfo)
    levels: list[CgroupLevel] = []
    for line in cgroups:
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        version = 2 if hierarchy == "0" and controllers == "" else 1
        if version == 1 and "memory" not in controllers.split(","):
            continue
        for root, point, mounted in mounts:
            if mounted != version:
                continue
            start = _directory(point, root, path)  # the mount point or a directory below it
            for directory in (start, *start.parents):  # up to the mount point
                if (level := _level(directory, version)) is not None:
                    levels.append(level)
                if directory == Path(point):
                    break
            break
    return levels


def _level(directory: Path, version: int) -> CgroupLevel | None:
    usage_file, limit_file, cache_names = _FILES[version]
    if not (directory / limit_file).exists():
        return None  # v2 without the memory controller here, or the v2 root
    usage = _read_int(directory / usage_file) or 0
    return CgroupLevel(
        path=str(directory),
        version=version,
        limit=_read_int(directory / limit_file),
        usage=max(0, usage - _stat_value(directory, cache_names)),
    )


@dataclasses.dataclass(frozen=True)
class MemoryView:
    """What this process may still use: the host's available memory or the tightest
    cgroup's headroom, whichever is less."""

    host_available: int
    binding: CgroupLevel | None  # the cgroup level that binds, None: the host does

    @property
    def available(self) -> int:
        if self.binding is None or self.binding.headroom is None:
            return self.host_available
        return min(self.host_available, self.binding.headroom)

    def describe(self) -> str:
        level = self.binding
        if level is None or level.headroom is None or level.headroom >= self.host_available:
            return f"the node has {_gib(self.host_available)} of memory available"
        return (
            f"the cgroup {level.path} allows {_gib(level.headroom)} more "
            f"({level.limit_file} {_gib(level.limit or 0)}, {_gib(level.usage)} in use)"
        )


def memory_view(levels: list[CgroupLevel] | None = None) -> MemoryView:
    import psutil

    levels = cgroup_levels() if levels is None else levels
    limited = [lv for lv in levels if lv.headroom is not None]
    binding = min(limited, key=lambda lv: lv.headroom or 0) if limited else None
    return MemoryView(host_available=int(psutil.virtual_memory().available), binding=binding)


@dataclasses.dataclass(frozen=True)
class Regions:
    """The node's regions already under a base (each ``<base>/<node>/<key>/``)."""

    count: int = 0
    present: int = 0  # bytes written (already in the tmpfs and the cgroups' usage)
    pending: int = 0  # bytes still to come: the objects planned less the bytes present


def _held(path: Path) -> int:
    """Bytes of ``path`` in memory (a file being written may have holes: they are not)."""
    try:
        st = path.stat()
    except OSError:
        return 0
    return min(st.st_size, st.st_blocks * 512)


def _region_bytes(region: Path) -> tuple[int, int] | None:
    """(bytes present, bytes still to come) of the region at ``region``, from its marker's
    objects: a whole file (under its name) is all present, a partial one what it holds;
    None where it has no readable marker (being made or removed)."""
    try:
        sizes = {o.path: o.size for o in objects_of(region)}
    except (OSError, ValueError, KeyError, TypeError):
        return None
    present = 0
    for name, size in sizes.items():
        whole = region / name
        present += min(size, _held(whole) if whole.is_file() else _held(partial(region, name)))
    return present, sum(sizes.values()) - present


def regions_under(base: Path, exclude: Path | None = None) -> Regions:
    """Every region under ``base`` but ``exclude``: how many, bytes present, bytes to come."""
    count = present = pending = 0
    try:
        regions = [r for node in Path(base).iterdir() if node.is_dir() for r in node.iterdir()]
    except OSError:
        return Regions()
    skip = exclude.resolve() if exclude is not None else None
    for region in regions:
        if skip is not None and region.resolve() == skip:
            continue
        counted = _region_bytes(region)
        if counted is None:
            continue  # being made (its own check runs now) or being removed
        count += 1
        present += counted[0]
        pending += counted[1]
    return Regions(count, present, pending)


@dataclasses.dataclass(frozen=True)
class Tmpfs:
    path: str
    free: int
    size: int


def tmpfs_at(base: Path) -> Tmpfs:
    """Free and total bytes of the file system ``base`` is (or will be) on."""
    probe = Path(base)
    while not probe.exists():
        probe = probe.parent
    stat = os.statvfs(probe)
    return Tmpfs(str(probe), stat.f_bavail * stat.f_frsize, stat.f_blocks * stat.f_frsize)


def kv_cache_default_bytes(available: int, usable: int | None = None) -> int:
    """The CPU KV cache this library gives an engine: a share of ``available``, clamped,
    and never more than ``usable`` (:func:`kv_cache_usable_bytes`; whole MiB, rounded up,
    at least the minimum)."""
    size = int(min(max(available * KV_CACHE_SHARE, KV_CACHE_MIN), KV_CACHE_MAX)) >> 20 << 20
    if usable is not None and usable < size:
        return -(-max(usable, KV_CACHE_MIN) // MiB) * MiB
    return size


# configs of models whose per-sequence state is not (only) attention's KV cache (state
# space and linear-attention layers): the count below does not hold for them
_NOT_ATTENTION_ONLY = ("mamba", "ssm", "state_size", "linear_attn", "conv_kernel", "lru")
KV_CACHE_HEADROOM = 1.25  # over the count: the cache's block rounding and layouts it misses


def kv_cache_usable_bytes(config: dict[str, Any], engine_kwargs: dict[str, Any]) -> int | None:
    """The most CPU KV cache one engine worker can use: ``max_num_seqs`` sequences of
    ``max_model_len`` tokens, each token's keys and values in every layer of its pipeline
    stage for its share of the KV heads (vLLM's CPU defaults: 256 sequences per worker,
    the model's ``max_position_embeddings``), with headroom. None where the model's
    config does not say enough, or its layers keep state other than a KV cache: then
    nothing bounds the default but the memory."""
    text = config.get("text_config") or config
    if any(marker in key for key in text for marker in _NOT_ATTENTION_ONLY):
        return None
    try:
        layers = int(text["num_hidden_layers"])
        heads = int(text["num_attention_heads"])
        kv_heads = int(text.get("num_key_value_heads") or heads)
        head_dim = int(text.get("head_dim") or int(text["hidden_size"]) // heads)
        length = int(engine_kwargs.get("max_model_len") or text["max_position_embeddings"])
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None
    tp = int(engine_kwargs.get("tensor_parallel_size") or 1)
    pp = int(engine_kwargs.get("pipeline_parallel_size") or 1)
    sequences = int(engine_kwargs.get("max_num_seqs") or 256 * tp * pp)
    cache_dtype = str(engine_kwargs.get("kv_cache_dtype") or "auto")
    dtype = str(engine_kwargs.get("dtype") or text.get("torch_dtype") or text.get("dtype"))
    width = 1 if cache_dtype.startswith("fp8") else 4 if "32" in dtype else 2
    per_token = 2 * -(-layers // pp) * -(-kv_heads // tp) * head_dim * width
    return int(sequences * length * per_token * KV_CACHE_HEADROOM)


def assess(
    *,
    weight_bytes: int,
    regions: Regions,
    kv_cache_bytes: int,
    tmpfs: Tmpfs,
    view: MemoryView,
    margin: int = MARGIN,
    base: str = "",
) -> str | None:
    """Why a region of ``weight_bytes`` (still to come) cannot fit, or None. Pure."""
    others = regions.pending
    need_disk = weight_bytes + others + margin
    need_memory = need_disk + kv_cache_bytes
    parts = [f"the weights need {_gib(weight_bytes)}"]
    if regions.count:
        parts.append(
            f"{regions.count} other region(s) under {base or tmpfs.path} hold "
            f"{_gib(regions.present)} and will take {_gib(others)} more"
        )
    if kv_cache_bytes:
        parts.append(f"an engine's CPU KV cache takes {_gib(kv_cache_bytes)}")
    parts.append(f"{_gib(margin)} is kept free")
    sizes = "; ".join(parts)
    if tmpfs.free < need_disk:
        return (
            f"{tmpfs.path} has {_gib(tmpfs.free)} free of {_gib(tmpfs.size)}, "
            f"{_gib(need_disk)} is needed ({sizes})"
        )
    if view.available < need_memory:
        return f"{view.describe()}, {_gib(need_memory)} is needed ({sizes})"
    return None


def memory_problem(
    base: Path,
    weight_bytes: int,
    *,
    region: Path | None = None,
    kv_cache_engines: int = 0,
) -> str | None:
    """Why a region of ``weight_bytes`` cannot fit under ``base`` now, or None.

    ``region``: the region being pulled (its bytes already written are not needed again;
    it is not counted among the others). ``kv_cache_engines``: engines of this node
    whose CPU KV cache (:func:`kv_cache_default_bytes`) is still to be reserved."""
    view = memory_view()
    regions = regions_under(base, exclude=region)
    mine = _region_bytes(region) if region is not None else None
    weights = max(0, weight_bytes - (mine[0] if mine else 0))
    remaining = view.available - weights - regions.pending - MARGIN
    kv = kv_cache_engines * kv_cache_default_bytes(max(0, remaining))
    return assess(
        weight_bytes=weights,
        regions=regions,
        kv_cache_bytes=kv,
        tmpfs=tmpfs_at(base),
        view=view,
        base=str(base),
    )


def available_for_engine(base: Path) -> tuple[int, str]:
    """Memory an engine starting here may use: the view's available memory less the bytes
    still to come into the node's regions under ``base``; and what binds, in words."""
    view = memory_view()
    pending = regions_under(base).pending
    described = view.describe()
    if pending:
        described += f", less {_gib(pending)} still to come into the node's shared weights"
    return max(0, view.available - pending), described


# The streamer's CPU buffer


def actor_memory_budget(
    levels: list[CgroupLevel] | None = None, assigned: int | None = None
) -> tuple[int, str, bool] | None:
    """The memory this actor may use: ``assigned``, Ray's ``memory`` resource of the actor
    (``integrations.ray.node.assigned_memory``), else the tightest cgroup limit (shared by
    every engine under it); None when neither bounds it. Returns (bytes, where from,
    whether shared by the node's engines)."""
    if assigned:
        return assigned, "Ray's memory resource of the actor", False
    levels = cgroup_levels() if levels is None else levels
    limited = [lv for lv in levels if lv.limit is not None]
    if not limited:
        return None
    level = min(limited, key=lambda lv: lv.limit or 0)
    return int(level.limit or 0), f"the cgroup {level.path} ({level.limit_file})", True


def streamer_ranks(
    engine_kwargs: dict[str, Any], *, cpu_build: bool, environ: Any = None
) -> tuple[int, bool]:
    """How runai-model-streamer 0.17 applies RUNAI_STREAMER_MEMORY_LIMIT to this engine:
    (the engine's processes that stream, whether the streamer divides the value among them).

    Each of the engine's ranks (``tensor_parallel_size`` x ``pipeline_parallel_size``
    processes, taken to be on this node) streams in its own process. Without distributed
    streaming every one reads the value for itself (``FileStreamer`` sizes its ring from
    the environment): the engine holds ranks x value. Distributed streaming
    (``DistributedStreamer.rank_memory_limit``) reads the value as the node's total for
    the ranks on the node and gives each rank its share (at least its largest tensor). It
    runs only for ``load_format='runai_streamer'`` with ``model_loader_extra_config
    ['distributed']`` True, and only where torch.distributed is NCCL on a GPU (the
    streamer's ``RUNAI_STREAMER_DIST`` default, ``auto``), or anywhere with
    ``RUNAI_STREAMER_DIST=1``; ``0`` turns it off. vLLM's CPU build (gloo) falls back to
    every rank on its own; the pre-sharded format never distributes."""
    env: Any = os.environ if environ is None else environ

    def count(key: str) -> int:
        try:
            return max(1, int(engine_kwargs.get(key) or 1))
        except (TypeError, ValueError):
            return 1

    ranks = count("tensor_parallel_size") * count("pipeline_parallel_size")
    extra = engine_kwargs.get("model_loader_extra_config")
    asked = (
        isinstance(extra, dict)
        and extra.get("distributed") is True
        and engine_kwargs.get("load_format") == "runai_streamer"
    )
    mode = str(env.get("RUNAI_STREAMER_DIST") or "auto")
    splits = asked and ranks > 1 and (mode == "1" or (mode == "auto" and not cpu_build))
    return ranks, splits


def derive_streamer_limit(budget: int, engines: int, ranks: int = 1, splits: bool = False) -> int:
    """RUNAI_STREAMER_MEMORY_LIMIT for one engine given the actor's ``budget`` shared by
    ``engines``: the engine's streamer buffers together take a quarter of the engine's
    share. Each of its ``ranks`` streaming processes gets an equal part (whole MiB); below
    1 GiB a part is the streamer's ``0`` (one tensor at a time: always valid, whatever the
    largest tensor). The value is that part where each process reads it for itself, the
    ranks' parts together where the streamer divides it among them (``splits``, its
    distributed mode, :func:`streamer_ranks`); never above the streamer's default."""
    ranks = max(1, ranks)
    share = budget // max(1, engines)
    part = int(share * STREAMER_SHARE) // ranks >> 20 << 20
    if part < STREAMER_FLOOR:
        return 0
    return min(part * ranks if splits else part, STREAMER_DEFAULT)


def streamer_memory_limit(
    engine_kwargs: dict[str, Any],
    engines_per_node: int = 1,
    *,
    cpu_build: bool = False,
    levels: list[CgroupLevel] | None = None,
    environ: dict[str, str] | None = None,
    assigned: int | None = None,
) -> int | None:
    """In the engine actor, before vLLM starts: when the user set no streamer
    ``memory_limit`` (``model_loader_extra_config`` or RUNAI_STREAMER_MEMORY_LIMIT), one
    derived from the actor's memory (:func:`actor_memory_budget` of ``assigned``, Ray's
    memory resource of the actor; a cgroup limit is
    divided among ``engines_per_node``) as the streamer will apply it to the engine's
    ranks (:func:`streamer_ranks`, :func:`derive_streamer_limit`), written to
    RUNAI_STREAMER_MEMORY_LIMIT of ``environ`` (the actor's environment, which the
    engine's processes inherit and the load report's streamer settings show). Returns it,
    or None when the user chose or nothing bounds the actor."""
    env: Any = os.environ if environ is None else environ
    extra = engine_kwargs.get("model_loader_extra_config")
    chosen = isinstance(extra, dict) and extra.get("memory_limit") is not None
    if chosen or STREAMER_LIMIT_ENV in os.environ or env.get(STREAMER_LIMIT_ENV):
        return None
    budget = actor_memory_budget(levels, assigned)
    if budget is None:
        return None
    amount, source, shared = budget
    engines = max(1, engines_per_node) if shared else 1
    ranks, splits = streamer_ranks(engine_kwargs, cpu_build=cpu_build, environ=env)
    limit = derive_streamer_limit(amount, engines, ranks, splits)
    env[STREAMER_LIMIT_ENV] = str(limit)
    per_process = limit // ranks if splits else limit
    logger.info(
        "Streamer CPU buffer: RUNAI_STREAMER_MEMORY_LIMIT=%d (%s per streaming process, "
        "%d process(es) of the engine%s; %s of %s for %d engine(s)); set "
        "model_loader_extra_config['memory_limit'] to choose",
        limit,
        "one tensor at a time" if limit == 0 else _gib(per_process),
        ranks,
        ", the streamer divides it" if splits else "",
        source,
        _gib(amount),
        engines,
    )
    return limit
