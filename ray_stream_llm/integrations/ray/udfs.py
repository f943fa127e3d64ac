"""The tokenizer-side stage UDFs of a streamed processor: Ray's own (chat template,
tokenize, detokenize, multimodal preparation), each first fetching the model's metadata
on its node, starting the node's shared pull where the weights are shared, and handing
Ray the local directory; and what the engine UDF
(:mod:`ray_stream_llm.integrations.ray.engine_udf`) shares with them. Nothing here imports
vLLM: these actors never load it.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any

from ray_stream_llm.actors import actor_logging
from ray_stream_llm.errors import RayStreamLLMError
from ray_stream_llm.fetch import fetch_metadata_report
from ray_stream_llm.integrations.ray import node
from ray_stream_llm.integrations.ray.compat import (
    ChatTemplateUDF,
    DetokenizeUDF,
    PrepareMultimodalUDF,
    TokenizeUDF,
    ray_stage_shims,
)
from ray_stream_llm.integrations.ray.telemetry import store_failure
from ray_stream_llm.integrations.vllm.plugin import plugin_inactive_reason
from ray_stream_llm.plan import Plan
from ray_stream_llm.uri import looks_like_uri
from ray_stream_llm.weights.region import NodeWeights

logger = logging.getLogger(__name__)


def local_metadata(model: Any) -> Any:
    """The local metadata directory for an object-store URI (fetched in the actor, with the
    settings its environment holds); anything else unchanged."""
    if not looks_like_uri(model):
        return model
    return str(fetch_metadata_report(model, require=()).path)


class SecretEnv:
    """Secret environment values on their way to an actor, in the UDF's constructor
    arguments rather than the runtime_env (Ray's runtime-env agent logs runtime_envs).
    Never shows its values."""

    def __init__(self, values: dict[str, str]):
        self._values = dict(values)

    def apply(self) -> None:
        os.environ.update(self._values)

    def __repr__(self) -> str:
        return f"SecretEnv({sorted(self._values)})"


_prefetched: list[NodeWeights] = []  # this stage actor's references, held for its lifetime


def _prepare(secret_env: SecretEnv | None, plan: Plan | None, model: Any) -> Any:
    """In the actor, first thing: the secrets into its environment (the engine's child
    processes inherit it); with a ``plan`` (streamed) the model's metadata, and the start of
    the node's shared pull when the plan shares the weights: the local directory for Ray's
    UDF. Without a plan, ``model`` as it is."""
    actor_logging()
    if secret_env is not None:
        secret_env.apply()
    if plan is None:
        return model
    # a store restarting while the job starts is waited out within its budget: an error
    # here kills the actor in its creation, and with it the job
    try:
        report = fetch_metadata_report(plan.uri, wait_out_outages=True)
    except RayStreamLLMError as exc:
        store_failure(exc)  # for ray_stream_llm.typed_errors() on the driver
        raise
    if (
        plan.shares
        and node.can_host_an_engine(plan.sharing.engine_resources)
        and plugin_inactive_reason() is None  # else the engine refuses the region
    ):
        # The earliest point of the job on this node: the pull overlaps actor start-up and
        # engine initialisation. Best effort: the engine acquires (and reports) itself.
        sharing = dataclasses.replace(plan.sharing, required=False)
        weights = NodeWeights(plan.uri, report.weight_objects, sharing, node.holder())
        if weights.acquire() is not None:
            _prefetched.append(weights)
    return str(report.path)


def _metadata_stage(base: type[Any]) -> type[Any]:
    """``base`` (a tokenizer-side stage UDF of Ray's) that first fetches the model's metadata
    on its node and starts the node's shared pull; Ray's UDF gets the local directory."""

    def __init__(
        self: Any,
        data_column: str,
        expected_input_keys: list[str],
        model: str,
        *,
        secret_env: SecretEnv | None = None,
        plan: Plan | None = None,
        **kwargs: Any,
    ) -> None:
        model = _prepare(secret_env, plan, model)
        with ray_stage_shims():
            base.__init__(self, data_column, expected_input_keys, model=model, **kwargs)

    name = f"Streaming{base.__name__}"
    # a module attribute of this name, so that Ray pickles the class by reference
    return type(name, (base,), {"__init__": __init__, "__module__": __name__, "__qualname__": name})


StreamingChatTemplateUDF = _metadata_stage(ChatTemplateUDF)
StreamingTokenizeUDF = _metadata_stage(TokenizeUDF)
StreamingDetokenizeUDF = _metadata_stage(DetokenizeUDF)


class StreamingPrepareMultimodalUDF(PrepareMultimodalUDF or object):  # type: ignore[misc]
    def __init__(
        self,
        data_column: str,
        expected_input_keys: list[str],
        model_config_kwargs: dict[str, Any],
        *,
        secret_env: SecretEnv | None = None,
        plan: Plan | None = None,
        **kwargs: Any,
    ):
        model_config_kwargs = dict(model_config_kwargs)
        model_config_kwargs["model"] = _prepare(secret_env, plan, model_config_kwargs.get("model"))
        super().__init__(data_column, expected_input_keys, model_config_kwargs, **kwargs)
