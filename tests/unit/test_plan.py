"""The driver's :class:`Plan` (ray_stream_llm/plan.py): what the stages derive from it."""

from __future__ import annotations

import dataclasses

import pytest

from ray_stream_llm.plan import Plan
from ray_stream_llm.uri import parse_model_uri
from ray_stream_llm.weights.region import Sharing


def test_the_plan_names_the_model_as_its_uri_text():
    plan = Plan(parse_model_uri("s3://bucket/models/llama/"))
    assert plan.model == str(parse_model_uri("s3://bucket/models/llama/"))
    assert plan.model.startswith("s3://bucket/models/llama")


@pytest.mark.parametrize(("mode", "shares"), [("node", True), ("off", False)])
def test_only_node_sharing_shares_one_pull(mode, shares):
    plan = Plan(parse_model_uri("s3://bucket/m/"), sharing=Sharing(mode))
    assert plan.shares is shares


def test_a_plan_defaults_to_no_sharing_no_retry_and_is_frozen():
    plan = Plan(parse_model_uri("gs://bucket/m/"))
    assert (plan.sharing.mode, plan.load_retries, plan.load_retry_backoff_s) == ("off", 0, 0.0)
    assert not plan.shares and not plan.weight_checksums and plan.compile_cache_uri is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.load_retries = 3
