"""The driver's checks of a streamed model before any actor starts, and the local
metadata directory they leave for Ray's builder.

Runs before Ray's stage modules (and with them vLLM and torch) are imported, so a
wrong URI, an unreachable store or a broken model answers in seconds.
"""

from __future__ import annotations

from ray_stream_llm.config import StreamingvLLMEngineProcessorConfig, streaming_load_format
from ray_stream_llm.fetch import fetch_metadata_report
from ray_stream_llm.lora import check_adapters
from ray_stream_llm.manifest import inspect_model
from ray_stream_llm.uri import looks_like_uri, parse_model_uri


def preflight(config: StreamingvLLMEngineProcessorConfig) -> str:
    """Fetch the model's metadata on the driver and check the model; return the local
    directory. Typed errors: the store's (missing, denied, unreachable, slow), a missing
    ``config.json``, :class:`~ray_stream_llm.errors.NotStreamableError` for what the
    engines and tokenizers would fail on, and, with ``dynamic_lora_loading_path``, the
    adapters' errors (:func:`ray_stream_llm.lora.check_adapters`: a prefix with no adapter,
    an adapter without ``adapter_config.json`` or made for another base model), read from
    the same store with the same settings."""
    uri = parse_model_uri(config.model_source)
    store = config.object_store
    # The metadata fetch first (Ray's builder gets the local directory, where it would
    # otherwise download every non-safetensors file); then the preflight parses the
    # fetched JSON as the engines will and reads each shard's header.
    driver_dir = fetch_metadata_report(uri, object_store=store).path
    sharded = streaming_load_format(config.engine_kwargs) == "runai_streamer_sharded"
    tp = int(config.engine_kwargs.get("tensor_parallel_size", 1)) if sharded else None
    pattern = (config.engine_kwargs.get("model_loader_extra_config") or {}).get("pattern")
    inspect_model(
        str(uri),
        object_store=store,
        tensor_parallel_size=tp,
        shard_pattern=pattern if sharded else None,
        metadata_dir=driver_dir,
    ).raise_if_not_streamable()
    tokenizer = config.engine_kwargs.get("tokenizer")
    if looks_like_uri(tokenizer):
        fetch_metadata_report(tokenizer, object_store=store)
    lora_path = getattr(config, "dynamic_lora_loading_path", None)
    if lora_path is not None:
        check_adapters(
            lora_path,
            uri,
            engine_kwargs=config.engine_kwargs,
            object_store=store,
            metadata_dir=driver_dir,
        )
    return str(driver_dir)
