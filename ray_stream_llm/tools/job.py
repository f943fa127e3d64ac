"""A Ray Data batch job over a streamed model: what the demo, the tests and the examples run.

``run_job`` starts (or joins) Ray, builds a :class:`StreamingvLLMEngineProcessorConfig`
processor over a list of questions, and returns every row with its answer and
the figures of the run. It only uses the public API, the way a user would.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Sequence
from typing import Any

from ray_stream_llm.commands import LOCAL_ENV

# Engine settings that suit the CPU build of vLLM on a small machine.
CPU_ENGINE_KWARGS: dict[str, Any] = {
    "dtype": "bfloat16",
    "max_num_seqs": 8,
    "enforce_eager": True,
    "seed": 0,
}


def local_cluster(nodes: Sequence[dict[str, Any]], ray_temp_dir: str) -> Any:
    """Ray nodes on this machine (``ray.cluster_utils.Cluster``: a raylet and object store
    each; ``nodes``' entries are ``add_node`` arguments, the first the head's), joined by
    this process; the cluster (``shutdown()`` it, after ``ray.shutdown()``)."""
    import tempfile

    import ray
    from ray.cluster_utils import Cluster

    for key, value in LOCAL_ENV.items():  # the raylets' environment, as run_job's
        os.environ.setdefault(key, value)
    # where Cluster writes the head's address (ray.init makes it; Cluster does not)
    os.makedirs(os.path.join(tempfile.gettempdir(), "ray"), exist_ok=True)
    head, *others = nodes
    cluster = Cluster(
        initialize_head=True,
        head_node_args={**head, "include_dashboard": False, "temp_dir": ray_temp_dir},
    )
    for node in others:
        cluster.add_node(**node)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=True)
    return cluster


@dataclasses.dataclass
class JobResult:
    rows: list[dict[str, Any]]
    build_seconds: float
    first_row_seconds: float
    total_seconds: float
    metadata_files: int
    metadata_bytes: int
    streamable_bytes: int  # the safetensors the engines stream
    load_reports: list[Any] = dataclasses.field(default_factory=list)  # one LoadReport per engine


def _prompt(question: str, chat: bool) -> dict[str, Any]:
    """A row's prompt: the question as the user's chat message, or, in a job without Ray's
    chat-template stage (``chat_template_stage=False``), the question as the prompt itself."""
    return {"messages": [{"role": "user", "content": question}]} if chat else {"prompt": question}


def run_job(
    model_uri: str,
    questions: Sequence[str],
    *,
    load_format: str | None = "runai_streamer",
    max_tokens: int = 48,
    batch_size: int = 8,
    engine_kwargs: dict[str, Any] | None = None,
    num_cpus: int | None = None,
    ray_temp_dir: str | None = None,
    object_store: Any = None,
    config_kwargs: dict[str, Any] | None = None,
    metrics_export_port: int | None = None,
    sampling: dict[str, Any] | None = None,
) -> JobResult:
    """Answer ``questions`` with the model at ``model_uri``; every row comes back.

    Starts a local Ray cluster unless one is already initialised (``RAY_ADDRESS``
    or ``ray.init`` before the call); ``metrics_export_port`` is then where that
    cluster serves its Prometheus metrics.
    """
    import ray

    from ray_stream_llm import StreamingvLLMEngineProcessorConfig, build_llm_processor, load_reports
    from ray_stream_llm.fetch import fetch_metadata_report
    from ray_stream_llm.integrations.ray.compat import settle_ray_data

    start = time.perf_counter()
    for key, value in LOCAL_ENV.items():
        os.environ.setdefault(key, value)
    if not ray.is_initialized():
        ray.init(
            num_cpus=num_cpus,
            include_dashboard=False,
            _temp_dir=ray_temp_dir,
            log_to_driver=bool(int(os.environ.get("RAY_STREAM_LLM_ACTOR_LOGS", "0"))),
            _metrics_export_port=metrics_export_port,
        )
    kwargs = {**CPU_ENGINE_KWARGS, **(engine_kwargs or {})}
    if load_format:
        kwargs["load_format"] = load_format
    config = StreamingvLLMEngineProcessorConfig(
        model_source=model_uri,
        engine_kwargs=kwargs,
        batch_size=batch_size,
        object_store=object_store,
        **{"concurrency": 1, **(config_kwargs or {})},
    )
    chat = (config_kwargs or {}).get("chat_template_stage", True) is not False
    processor = build_llm_processor(
        config,
        preprocess=lambda row: dict(
            **_prompt(row["question"], chat),
            sampling_params=dict(temperature=0.0, max_tokens=max_tokens, **(sampling or {})),
        ),
        postprocess=lambda row: dict(
            question=row["question"],
            answer=row["generated_text"],
            num_generated_tokens=int(row.get("num_generated_tokens") or 0),
        ),
    )
    build_seconds = time.perf_counter() - start
    report = (
        fetch_metadata_report(model_uri, object_store=object_store)
        if config.streams_from_object_store
        else None
    )

    ds = processor(ray.data.from_items([{"question": q} for q in questions]))
    rows: list[dict[str, Any]] = []
    first_row = 0.0
    for row in ds.iter_rows():
        if not rows:
            first_row = time.perf_counter() - start
        rows.append(dict(row))
    settle_ray_data()  # the callers shut Ray down next (compat.settle_ray_data says why)
    return JobResult(
        rows=rows,
        build_seconds=build_seconds,
        first_row_seconds=first_row,
        total_seconds=time.perf_counter() - start,
        metadata_files=report.files if report else 0,
        metadata_bytes=report.bytes if report else 0,
        streamable_bytes=report.streamable_bytes if report else 0,
        load_reports=load_reports(),
    )
