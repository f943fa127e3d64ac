"""The load report's metrics and the typed-failure channel
(ray_stream_llm/integrations/ray/telemetry.py). Ray's metric classes and its internal KV are
the edges replaced here (recorders, a dict); the names, values and tags are the module's."""

from __future__ import annotations

from typing import ClassVar

import pytest
import ray
import ray.util.metrics
from helpers.reports import a_load_report
from ray.experimental import internal_kv

from ray_stream_llm import errors
from ray_stream_llm.integrations.ray import telemetry


class _Metric:
    """A recorder in place of Ray's Counter and Gauge: every value, with its tags."""

    made: ClassVar[dict[str, _Metric]] = {}

    def __init__(self, name, description="", tag_keys=()):
        self.name, self.tag_keys, self.values = name, tuple(tag_keys), []
        _Metric.made[name] = self

    def inc(self, value, tags):
        assert set(tags) == set(self.tag_keys)
        self.values.append(("inc", value, dict(tags)))

    def set(self, value, tags):
        assert set(tags) == set(self.tag_keys)
        self.values.append(("set", value, dict(tags)))


@pytest.fixture
def metrics(monkeypatch):
    _Metric.made = {}
    monkeypatch.setattr(ray.util.metrics, "Counter", _Metric)
    monkeypatch.setattr(ray.util.metrics, "Gauge", _Metric)
    monkeypatch.setattr(telemetry, "_metrics", {})
    return _Metric.made


def test_a_streamed_report_sets_each_metric_from_its_field(metrics):
    report = a_load_report(ranks=[{"rank": 0, "weight_bytes": 100, "seconds": 2.5}])
    telemetry._record_metrics(report)
    tags = {"model": "s3://bucket/m/", "streamed": "true"}
    assert metrics["stream_llm_engines_ready"].values == [("inc", 1, tags)]
    assert metrics["stream_llm_engine_ready_seconds"].values == [("set", 30.0, tags)]
    assert metrics["stream_llm_metadata_bytes"].values == [("inc", 3_524_725, tags)]
    assert metrics["stream_llm_metadata_files"].values == [("inc", 6, tags)]
    assert metrics["stream_llm_weight_bytes_streamed"].values == [("inc", 2 * 1024**3, tags)]
    assert metrics["stream_llm_weight_stream_seconds"].values == [("set", 4.0, tags)]
    gib = metrics["stream_llm_weight_stream_gib_per_s"].values
    assert gib == [("set", report.gib_per_s, tags)] and report.gib_per_s is not None
    ranked = {**tags, "rank": "0"}
    assert metrics["stream_llm_weight_bytes_streamed_by_rank"].values == [("inc", 100, ranked)]
    assert metrics["stream_llm_weight_stream_seconds_by_rank"].values == [("set", 2.5, ranked)]


def test_an_engine_that_did_not_stream_counts_only_its_start(metrics):
    telemetry._record_metrics(
        a_load_report(streamed=False, weight_bytes=0, stream_seconds=None, streamed_tensor_bytes=0)
    )
    tags = {"model": "s3://bucket/m/", "streamed": "false"}
    assert metrics["stream_llm_engines_ready"].values == [("inc", 1, tags)]
    assert metrics["stream_llm_engine_ready_seconds"].values == [("set", 30.0, tags)]
    for name in ("metadata_bytes", "metadata_seconds", "weight_bytes_streamed"):
        assert metrics[f"stream_llm_{name}"].values == []


@pytest.fixture
def kv(monkeypatch):
    """Ray's internal KV as a dict, and a driver of job 'job1' on node 'node1'."""
    store: dict[tuple[str, str], bytes] = {}

    def put(key, value, namespace=None):
        store[(namespace, key)] = value.encode() if isinstance(value, str) else value

    def get(key, namespace=None):
        return store.get((namespace, key.decode() if isinstance(key, bytes) else key))

    def keys(prefix, namespace=None):
        return [k for ns, k in store if ns == namespace and k.startswith(prefix)]

    monkeypatch.setattr(internal_kv, "_internal_kv_initialized", lambda: True)
    monkeypatch.setattr(internal_kv, "_internal_kv_put", put)
    monkeypatch.setattr(internal_kv, "_internal_kv_get", get)
    monkeypatch.setattr(internal_kv, "_internal_kv_list", keys)
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(telemetry, "job_id", lambda: "job1")
    monkeypatch.setattr(telemetry, "node_ip", lambda: "node1")
    return store


def test_an_engines_typed_failure_is_raised_again_on_the_driver(kv):
    telemetry.store_failure(errors.StoreTimeoutError("older"))
    telemetry.store_failure(errors.WeightLoadError("the store failed 3 time(s)"))
    wrapper = RuntimeError("ActorDiedError: the actor died")
    with pytest.raises(errors.WeightLoadError) as info, telemetry.typed_errors("job1"):
        raise wrapper
    assert str(info.value) == "the store failed 3 time(s)"  # the newest failure
    assert info.value.__cause__ is wrapper


def test_another_jobs_failure_leaves_the_error_as_it_was(kv):
    telemetry.store_failure(errors.WeightLoadError("job1's"))
    with pytest.raises(RuntimeError, match="not mine"), telemetry.typed_errors("job2"):
        raise RuntimeError("not mine")


def test_an_unknown_class_name_is_raised_as_the_library_base_error(kv):
    kv[(telemetry.KV_NAMESPACE, "load_failure:job1:node1:1:1.000000")] = (
        b'{"class": "SystemExit", "message": "m", "time": 1.0}'
    )
    with pytest.raises(errors.RayStreamLLMError) as info, telemetry.typed_errors("job1"):
        raise RuntimeError("wrapped")
    assert type(info.value) is errors.RayStreamLLMError and str(info.value) == "m"


def test_without_ray_a_failure_passes_through_unchanged():
    assert not ray.is_initialized()
    with pytest.raises(KeyError), telemetry.typed_errors():
        raise KeyError("x")
