"""The library's commands, product like the rest of it: ``run`` (:mod:`.batch`: every row of
a file answered by a streamed model), ``shard`` (:mod:`.shard`: a pre-sharded checkpoint
written to the store) and ``doctor`` (:mod:`.doctor`: what each Ray node has, and its
problems with their fix). They sit above the integrations, like the CLI that calls them, and
use no development tool (``ray_stream_llm.tools``)."""

# Settings for a single-machine Ray cluster that stays on loopback and phones no one (the
# shard writer's own engine; the tools' jobs).
LOCAL_ENV: dict[str, str] = {
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",  # keeps Ray on 127.0.0.1
    "VLLM_HOST_IP": "127.0.0.1",
    "RAY_USAGE_STATS_ENABLED": "0",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "HF_HUB_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
}
