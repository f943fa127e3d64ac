"""``StreamingvLLMEngineProcessorConfig`` and the load-format rules it checks.

The config has the fields and defaults of Ray's ``vLLMEngineProcessorConfig``.
When ``engine_kwargs["load_format"]`` is a Run:ai streaming format and the
model is an object-store URI, building the processor
(:mod:`ray_stream_llm.integrations.ray.builder`) fetches only metadata (on the
driver first, which also checks the model before any actor starts); every stage
fetches the same metadata on its own node, and each engine streams the weights
from the URI. Any other load format is built by Ray's own builder, unchanged.

A leaf: this module imports no Ray internals and no integration.
"""

from __future__ import annotations

import difflib
import logging
import os
from typing import Any, Literal

from pydantic import ConfigDict, Field
from ray.data.llm import vLLMEngineProcessorConfig

from ray_stream_llm.errors import (
    InvalidModelURIError,
    InvalidSettingError,
    UnsupportedLoadFormatError,
)
from ray_stream_llm.patterns import shard_file_regex
from ray_stream_llm.stores.registry import BACKENDS
from ray_stream_llm.stores.settings import ObjectStoreConfig
from ray_stream_llm.uri import looks_like_uri, parse_model_uri

logger = logging.getLogger(__name__)

STREAMING_LOAD_FORMATS: tuple[str, ...] = ("runai_streamer", "runai_streamer_sharded")
# vLLM 0.29's built-in load formats (model_loader._LOAD_FORMAT_TO_MODEL_LOADER); plugins
# may add more, so an unknown name is only refused when it is a near miss of a streaming format.
_KNOWN_LOAD_FORMATS = frozenset(
    {
        "auto",
        "hf",
        "dummy",
        "fastsafetensors",
        "instanttensor",
        "mistral",
        "modelexpress",
        "npcache",
        "pt",
        "safetensors",
        "sharded_state",
        "tensorizer",
        *STREAMING_LOAD_FORMATS,
    }
)


def streaming_load_format(engine_kwargs: dict[str, Any]) -> str | None:
    """The streaming load format named in ``engine_kwargs``, if any.

    Raises :class:`UnsupportedLoadFormatError` for a near miss such as
    ``runai-streamer`` or ``runai_stream``, which vLLM would refuse only later,
    inside an engine actor.
    """
    value = engine_kwargs.get("load_format")
    if value is None:
        return None
    if not isinstance(value, str):
        raise UnsupportedLoadFormatError(
            f"engine_kwargs['load_format'] must be a string, got {value!r}"
        )
    name = value.lower()  # vLLM lower-cases it too
    if name in STREAMING_LOAD_FORMATS:
        return name
    if name in _KNOWN_LOAD_FORMATS:
        return None
    canonical = name.replace("-", "_").replace(" ", "_")
    close = difflib.get_close_matches(canonical, STREAMING_LOAD_FORMATS, n=1, cutoff=0.75)
    if close or "runai" in canonical or "stream" in canonical:
        suggestion = close[0] if close else STREAMING_LOAD_FORMATS[0]
        raise UnsupportedLoadFormatError(
            f"engine_kwargs['load_format'] is {value!r}, which is not a vLLM load format; "
            f"did you mean {suggestion!r}? Streaming formats: {', '.join(STREAMING_LOAD_FORMATS)}"
        )
    return None


_LOADER_KEYS = {  # what vLLM 0.29's loader of each format accepts
    "runai_streamer": ("distributed", "concurrency", "memory_limit"),
    "runai_streamer_sharded": ("pattern",),  # ShardedStateLoader refuses anything else
}


def check_loader_extra_config(extra: Any, load_format: str = "runai_streamer") -> None:
    """Check ``model_loader_extra_config`` the way vLLM's loader of ``load_format`` does, on
    the driver."""
    if extra is None:
        return
    where = "engine_kwargs['model_loader_extra_config']"
    if not isinstance(extra, dict):
        raise InvalidSettingError(f"{where} must be a dict, got {extra!r}")
    keys = _LOADER_KEYS[load_format]
    unknown = sorted(set(extra) - set(keys))
    if unknown:
        hint = (
            "; streamer tuning reaches it through ObjectStoreConfig (RUNAI_STREAMER_* variables)"
            if load_format == "runai_streamer_sharded"
            else ""
        )
        raise InvalidSettingError(
            f"{where} has unknown key(s) {unknown}; load_format {load_format!r} accepts "
            f"{list(keys)}{hint}"
        )
    value = extra.get("concurrency")
    if "concurrency" in extra and (
        isinstance(value, bool) or not isinstance(value, int) or value <= 0
    ):
        raise InvalidSettingError(
            f"{where}['concurrency'] must be a positive integer, got {value!r}"
        )
    value = extra.get("memory_limit")
    if "memory_limit" in extra and (
        isinstance(value, bool) or not isinstance(value, int) or value < -1
    ):
        raise InvalidSettingError(
            f"{where}['memory_limit'] must be an integer >= -1, got {value!r}"
        )
    if "pattern" in extra:
        shard_file_regex(extra["pattern"])  # InvalidSettingError naming it
    if "distributed" in extra and not isinstance(extra["distributed"], bool):
        raise InvalidSettingError(
            f"{where}['distributed'] must be a bool, got {extra['distributed']!r}"
        )


def resolve_sharing_dir(value: Any) -> str:
    """``weight_sharing_dir`` as every process of the job will use it: ``~`` expanded (on
    the driver), ``..`` and ``.`` removed; an InvalidSettingError naming the value when it
    is not a string, is relative (each actor would resolve it against its own working
    directory) or names an existing file.

    >>> resolve_sharing_dir("/dev/shm/x/../regions/")
    '/dev/shm/regions'
    """
    where = "weight_sharing_dir"
    if not isinstance(value, str) or not value.strip():
        raise InvalidSettingError(f"{where} must be a directory path, got {value!r}")
    path = os.path.normpath(os.path.expanduser(value))
    if not os.path.isabs(path):
        raise InvalidSettingError(
            f"{where} is {value!r}, a relative path: each actor would resolve it against its "
            "own working directory; give an absolute path, e.g. '/dev/shm/ray_stream_llm'"
        )
    if os.path.exists(path) and not os.path.isdir(path):
        raise InvalidSettingError(
            f"{where} is {value!r}, which is a file, not a directory; give a directory path"
        )
    return path


def check_compile_cache_uri(value: str) -> str:
    """``compile_cache_uri``, checked on the driver: a prefix in a store this library reads
    and writes (``s3://``, ``gs://``, ``az://``)."""
    schemes = tuple(f"{scheme}://" for scheme in BACKENDS)
    if not (looks_like_uri(value) and value.startswith(schemes)):
        raise InvalidSettingError(
            f"compile_cache_uri is {value!r}: give a prefix in an object store, one of "
            f"{', '.join(schemes)} (for example 's3://bucket/vllm-compile-cache/'), reached "
            "with the job's store settings"
        )
    try:
        parse_model_uri(value)
    except InvalidModelURIError as exc:
        raise InvalidSettingError(f"compile_cache_uri is {value!r}: {exc}") from None
    return value


class StreamingvLLMEngineProcessorConfig(vLLMEngineProcessorConfig):
    """``vLLMEngineProcessorConfig`` that streams weights from object storage.

    Use it exactly like Ray's config, with ``model_source`` an object-store URI
    and ``engine_kwargs={"load_format": "runai_streamer"}``; build it with
    ``ray.data.llm.build_processor`` or :func:`ray_stream_llm.build_llm_processor`.
    Only config, tokenizer and other metadata files reach local disk; no weight
    file of any format is written by the driver, the CPU stages or the engines.

    The stage graph is Ray's. Only where the cluster cannot hold it
    (``small_cluster_defaults``, detected when the processor is built) do the
    chat-template, tokenize and detokenize stages reserve 0.25 CPU and the
    preprocess/postprocess maps 0.1 CPU where you set no ``num_cpus``, and, with
    the CPU build of vLLM on a cluster without GPUs, each engine asks for CPUs
    only; an engine placement you set (``placement_group_config``,
    ``resources_per_bundle``, ``accelerator_type``) is never replaced. With the
    CPU build and tensor or pipeline parallelism, the engine's workers run as its
    processes (``distributed_executor_backend='mp'``; the CPU build has no Ray
    executor), unless you name a backend; on the CPU build every engine runs with
    ``VLLM_CPU_OMP_THREADS_BIND=nobind`` unless its environment names a binding
    (several engines share a node: vLLM's ``auto`` pins each to the same cores). The
    rows wait for the engines a job starts with (Ray Data's ``wait_for_min_actors_s``,
    up to an hour) unless you set that wait.

    ``object_store`` sets the store once: the driver uses it directly, and the
    settings derived from it (endpoint, addressing, credentials, streamer tuning)
    reach every stage actor and engine through each stage's ``runtime_env`` (secrets
    through the stage UDFs' arguments), merged with yours (a conflicting value is an
    error, never an override).
    """

    # A validation error must not echo a secret of object_store back.
    model_config = ConfigDict(hide_input_in_errors=True)

    load_retries: int = Field(
        default=2,
        ge=0,
        description="Streamed load formats: how many times an engine that failed to start "
        "(typically the store dropped while streaming weights) is started again before the "
        "actor fails with a WeightLoadError naming the cause.",
    )
    load_retry_backoff_s: float = Field(
        default=5.0,
        ge=0,
        description="Seconds before the first retry of a failed engine start; doubled on each "
        "further retry.",
    )
    weight_sharing: Literal["auto", "node", "off"] = Field(
        default="auto",
        description="Streamed load formats: 'node' pulls each weight object from the store "
        "once per node into a memory-backed directory that every engine on the node streams "
        "from (started by the node's first stage actor, overlapping engine start-up); 'off' "
        "streams each engine from the store; 'auto' is 'node' when the node's memory allows "
        "it, else 'off' (one engine too: its node's pull overlaps vLLM's start). A tensor or "
        "pipeline parallel engine shares when its workers are processes of the engine "
        "actor (distributed_executor_backend='mp', the default on vLLM's CPU build), each "
        "rank reading the region; with Ray's executor its workers stream from the store.",
    )
    weight_sharing_dir: str | None = Field(
        default=None,
        description="Where the node's shared weights live (default /dev/shm/ray_stream_llm, "
        "memory-backed): an absolute path (~ is expanded on the driver; a relative path is "
        "refused). A disk path named here is used as given: the weights then reach that disk. "
        "The library removes what it made under it (each region, and a node's directory once "
        "empty), never the directory itself.",
    )
    keep_warm_s: float = Field(
        default=0.0,
        ge=0,
        description="Shared weights (weight_sharing 'node' or 'auto'): seconds a node keeps "
        "its complete copy of the weights in memory after the job's last engine on it "
        "ends, so that the next job of the same model on that node streams from memory and "
        "reads no weight byte from the store. 0: removed with the last engine. Kept copies "
        "count against the node's memory check and are dropped first when a new model "
        "needs the room.",
    )
    weight_peers: int = Field(
        default=2,
        ge=0,
        description="Shared weights on a Ray cluster of several nodes: a node fills its "
        "copy from another node's copy over Ray, so that the store serves the weights once "
        "for the cluster. The nodes form a tree in which each serves at most this many "
        "others at once, while it still fills; a peer that fails or stalls is replaced by "
        "another, or by the store. 0: each node reads the store.",
    )
    compile_cache_uri: str | None = Field(
        default=None,
        description="Streamed load formats: an s3://, gs:// or az:// prefix (reached with the "
        "job's store settings) through which engines share vLLM's compiled code across "
        "nodes: before vLLM starts, an engine fetches the artifacts other nodes compiled "
        "for this model, vLLM and torch version and device; an engine that compiled "
        "uploads its artifact (written whole, marker last; an artifact already there is "
        "never replaced). A damaged or incompatible artifact gets a warning and vLLM "
        "compiles. None: each node's own cache only.",
    )
    weight_checksums: bool = Field(
        default=False,
        description="Streamed load formats: once its weights are loaded, each engine "
        "process hashes every parameter it holds (sha256; vLLM's own compute_tensor_digests "
        "where vLLM has it, 0.32 on, the same formula before) and the engine's load report "
        "gives, per rank, one digest over them (weight_checksums): engines that hold the "
        "same bytes report the same digest, whatever they read from (the store, the node's "
        "copy, a peer's). Costs one pass over the weights per process.",
    )
    small_cluster_defaults: Literal["auto", "on", "off"] = Field(
        default="auto",
        description="Any load format: 'auto' keeps Ray's stage resources unless the cluster "
        "cannot hold them when the processor is built (fewer CPUs than Ray's graph reserves "
        "before its first row, one file read or write task around the processor counted, "
        "and, where the DataContext has a checkpoint_config when the processor is built, Ray "
        "2.60's CheckpointFilter actor of a resumed job (1 CPU): a deadlock; or, with vLLM's "
        "CPU build, fewer GPUs than the engines ask for); then CPU stages reserve 0.25 CPU, "
        "the maps 0.1 CPU and engines CPUs only, each engine worker less than one where a "
        "whole CPU would leave no CPU for the file read or write (2 CPUs: 0.25), and the CPU "
        "stages and engines none where the file task and the checkpoint filter take every "
        "CPU (2 CPUs, checkpointing). 'on' applies them always, 'off' never. A placement or "
        "accelerator you set is never replaced.",
    )
    object_store: ObjectStoreConfig | None = Field(
        default=None,
        description="Endpoint, credentials, addressing and streamer tuning of the object "
        "store, delivered to the driver and every actor. None: the standard environment "
        "(AWS_* variables, profiles, instance roles) applies.",
    )

    def __init__(self, **data: Any) -> None:
        super().__init__(**data)
        # Here rather than in a validator, so the typed error reaches the caller
        # as itself, not wrapped in pydantic's ValidationError. The builder checks again
        # (model_validate and model_copy do not run __init__).
        self.check_streaming_source()
        if self.weight_sharing_dir is not None:
            self.weight_sharing_dir = resolve_sharing_dir(self.weight_sharing_dir)

    def check_streaming_source(self) -> None:
        """Raise a typed error for a misspelled streaming format, a malformed URI, streamer
        settings vLLM's runai loader would refuse inside the engine, or a
        ``weight_sharing_dir`` the engines could not agree on."""
        if self.weight_sharing_dir is not None:
            resolve_sharing_dir(self.weight_sharing_dir)
        if self.compile_cache_uri is not None:
            check_compile_cache_uri(self.compile_cache_uri)
        load_format = streaming_load_format(self.engine_kwargs)
        if load_format:
            if looks_like_uri(self.model_source):
                uri = parse_model_uri(self.model_source)
                if load_format == "runai_streamer_sharded" and uri.scheme != "s3":
                    raise UnsupportedLoadFormatError(
                        f"load_format 'runai_streamer_sharded' finds rank files only under "
                        f"s3:// (vLLM 0.29's ShardedStateLoader), not {uri.scheme}://; use "
                        "'runai_streamer' for this model, or put the sharded checkpoint in S3"
                    )
            check_loader_extra_config(
                self.engine_kwargs.get("model_loader_extra_config"), load_format
            )

    @property
    def streams_from_object_store(self) -> bool:
        """Whether the weights are streamed from an object-store URI."""
        return bool(streaming_load_format(self.engine_kwargs) and looks_like_uri(self.model_source))
