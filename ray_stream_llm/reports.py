"""Load reports: where each engine's start-up seconds and bytes went.

Each engine actor builds one :class:`LoadReport` when its engine is ready and
publishes it (:mod:`ray_stream_llm.integrations.ray.telemetry`): one INFO log line,
Ray metrics, and a JSON entry in the Ray cluster's internal key-value store, from
which ``ray_stream_llm.load_reports()`` (in telemetry: it reads Ray's cluster) returns a
finished job's reports as data.

The streaming figures come from the engine's own processes
(:mod:`ray_stream_llm.integrations.vllm.plugin`), collected in the actor by
:class:`~ray_stream_llm.integrations.ray.stream_watch.StreamWatcher`.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ray_stream_llm.fetch import FetchReport
    from ray_stream_llm.weights.marks import PullRecord

GIB = 1 << 30


@dataclasses.dataclass(frozen=True)
class LoadReport:
    """The start of one vLLM engine in one Ray actor.

    ``weight_bytes`` is the size of the safetensors objects the engine's streamers
    read from the store (what the store served), summed over the engine's processes:
    a tensor-parallel engine with ``runai_streamer`` reads every object once per rank
    (TP=2: twice the model), with ``runai_streamer_sharded`` each rank reads its own
    files (once the model); ``streamed_tensor_bytes`` the tensor bytes the streamers
    delivered to vLLM (the objects less their JSON headers). ``ranks`` has one entry per
    streaming process: its tensor-parallel ``rank``, ``pid``, ``files``, ``weight_bytes``,
    ``tensor_bytes`` and ``seconds``. The stream figures are ``None`` when they could not
    be measured: the engine did not stream, its workers are Ray actors on another node
    than the engine actor, or ``VLLM_PLUGINS`` excludes this library's plugin.
    """

    model: str
    streamed: bool
    job_id: str
    node_ip: str
    pid: int
    attempt: int
    ready_seconds: float
    metadata_files: int
    metadata_bytes: int
    metadata_seconds: float
    metadata_downloaded: bool
    weight_files: int | None
    weight_bytes: int | None
    streamed_tensor_bytes: int | None
    stream_seconds: float | None
    streamer_settings: dict[str, str]
    finished_at: float
    weight_sharing: str = "off"  # "node": streamed from the node's one pull; "off[: why]"
    weight_wait_seconds: float | None = None  # waiting for the node's pull, while streaming
    pull_hidden_seconds: float | None = None  # of the node's pull, before this engine streamed
    pull_bytes: int | None = None  # what the node's one pull read (from the store or a peer)
    pull_source: str | None = None  # "store", "peer <node id>" or "kept warm"
    ranks: list[dict[str, Any]] | None = None  # per streaming process (rank): bytes, seconds
    # vLLM's compile phase (integrations/vllm/compile_cache.py): seconds in vLLM's torch.compile
    # blocks (the slowest rank), and "hit" / "miss" / "load failed: <vLLM's reason>"
    compile_seconds: float | None = None
    compile_cache: str | None = None
    # weight_checksums=True: per rank, what the engine holds once loaded (its "rank",
    # "parameters" and one "sha256" over the per-parameter digests: integrations/vllm/checksums)
    weight_checksums: list[dict[str, Any]] | None = None

    @property
    def gib_per_s(self) -> float | None:
        if not self.weight_bytes or not self.stream_seconds:
            return None
        return self.weight_bytes / GIB / self.stream_seconds

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "gib_per_s": self.gib_per_s}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LoadReport:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    def log_line(self) -> str:
        settings = " ".join(f"{k}={v}" for k, v in self.streamer_settings.items())
        if not self.streamed:
            ready = f"Engine ready for {self.model} in {self.ready_seconds:.1f}s"
            return f"{ready} (not streamed){self._compile()}"
        stream = (
            f"{self.weight_files} safetensors files, {self.weight_bytes} bytes streamed in "
            f"{self.stream_seconds:.2f}s ({self.gib_per_s:.3f} GiB/s)"
            if self.stream_seconds is not None
            else "stream figures not measured"
        )
        if self.weight_sharing == "node":
            stream += (
                f" from the node's shared pull (waited {self.weight_wait_seconds or 0:.2f}s; "
                f"{self.pull_hidden_seconds or 0:.2f}s of the pull before this engine streamed)"
            )
        where = "downloaded" if self.metadata_downloaded else "already on this node"
        return (
            f"Engine ready for {self.model} in {self.ready_seconds:.1f}s (attempt {self.attempt}): "
            f"metadata {self.metadata_files} files, {self.metadata_bytes} bytes in "
            f"{self.metadata_seconds:.2f}s ({where}); "
            f"weights {stream}{self._per_rank()}; streamer {settings}{self._compile()}"
        )

    def _compile(self) -> str:
        if self.compile_seconds is None:
            return ""
        return f"; compile {self.compile_seconds:.1f}s (cache: {self.compile_cache})"

    def _per_rank(self) -> str:
        if not self.ranks or len(self.ranks) < 2:
            return ""
        each = ", ".join(
            f"rank {r.get('rank')}: {r.get('files')} files, {r.get('weight_bytes')} bytes in "
            f"{float(r.get('seconds') or 0):.2f}s"
            for r in self.ranks
        )
        return f" ({each})"


def stream_figures(sessions: list[dict[str, Any]], sizes: dict[str, int]) -> dict[str, Any]:
    """Files, object bytes, tensor bytes and seconds of the finished streaming sessions;
    ``sizes`` maps each object's URI to its size in the store. Object bytes count each
    object once per process that read it (per tensor-parallel rank): what the store served."""
    done = [s for s in sessions if s.get("done")]
    if not done:
        return {
            "weight_files": None,
            "weight_bytes": None,
            "streamed_tensor_bytes": None,
            "stream_seconds": None,
        }
    files = sorted({f for s in done for f in s["files"]})
    start = min(s["started"] for s in done)
    end = max(s["started"] + s["seconds"] for s in done)
    ranks = rank_figures(done, sizes)
    return {
        "weight_files": len(files),
        "weight_bytes": sum(r["weight_bytes"] for r in ranks),
        "streamed_tensor_bytes": sum(s["delivered_bytes"] for s in done),
        "stream_seconds": end - start,
    }


def rank_figures(done: list[dict[str, Any]], sizes: dict[str, int]) -> list[dict[str, Any]]:
    """One entry per process that streamed (a tensor-parallel rank), by rank then pid:
    the objects it read (each counted once per process), their bytes, its seconds."""
    by_process: dict[Any, list[dict[str, Any]]] = {}
    for s in done:
        by_process.setdefault(s.get("pid"), []).append(s)
    out = []
    for pid, group in by_process.items():
        files = sorted({f for s in group for f in s["files"]})
        begin = min(float(s["started"]) for s in group)
        finish = max(float(s["started"]) + float(s["seconds"]) for s in group)
        rank = next((s.get("rank") for s in group if s.get("rank") is not None), None)
        out.append(
            {
                "rank": rank,
                "pid": pid,
                "files": len(files),
                "weight_bytes": sum(sizes.get(f, 0) for f in files),
                "tensor_bytes": sum(int(s["delivered_bytes"]) for s in group),
                "seconds": finish - begin,
                "objects": files,
            }
        )
    return sorted(out, key=lambda r: (r["rank"] is None, r["rank"] or 0, str(r["pid"])))


def build_report(
    *,
    model: str,
    streamed: bool,
    attempt: int,
    ready_seconds: float,
    fetched: FetchReport | None,
    sessions: list[dict[str, Any]],
    sizes: dict[str, int],
    job_id: str,
    node_ip: str,
    actor_settings: dict[str, str],
    weight_sharing: str = "off",
    pull: PullRecord | None = None,
    compile_seconds: float | None = None,
    compile_cache: str | None = None,
    weight_checksums: list[dict[str, Any]] | None = None,
) -> LoadReport:
    """The report of an engine that is ready; ``fetched`` is the actor's metadata fetch,
    ``actor_settings`` the streamer settings in the actor's environment, ``pull`` the
    node's shared pull (started, finished) when the weights were shared."""
    done = [s for s in sessions if s.get("done")]
    waited = sum(float(s.get("waited", 0.0)) for s in done) if weight_sharing == "node" else None
    hidden = None
    if pull is not None and done:
        stream_start = min(float(s["started"]) for s in done)
        hidden = max(0.0, min(pull.finished, stream_start) - pull.started)
    return LoadReport(
        model=model,
        streamed=streamed,
        job_id=job_id,
        node_ip=node_ip,
        pid=os.getpid(),
        attempt=attempt,
        ready_seconds=ready_seconds,
        metadata_files=fetched.files if fetched else 0,
        metadata_bytes=fetched.bytes if fetched else 0,
        metadata_seconds=fetched.seconds if fetched else 0.0,
        metadata_downloaded=bool(fetched and fetched.downloaded),
        # as the streaming process saw them; this actor's environment when nothing streamed
        streamer_settings=next(
            (x["settings"] for x in sessions if x.get("done") and "settings" in x), actor_settings
        )
        if streamed
        else {},
        finished_at=time.time(),
        weight_sharing=weight_sharing,
        weight_wait_seconds=waited,
        pull_hidden_seconds=hidden,
        pull_bytes=pull.bytes if pull is not None else None,
        pull_source=pull.read.source if pull is not None else None,
        ranks=rank_figures(done, sizes) if done else None,
        compile_seconds=compile_seconds,
        compile_cache=compile_cache,
        weight_checksums=weight_checksums or None,
        **stream_figures(sessions, sizes),
    )
