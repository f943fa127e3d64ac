"""The weight checksums' formula and record (ray_stream_llm/integrations/vllm/checksums.py):
a small torch model, a report directory in tmp_path, no engine."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch

from ray_stream_llm.integrations.vllm import checksums
from ray_stream_llm.integrations.vllm.compile_cache import REPORT_DIR_ENV


@pytest.fixture
def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2, bias=False))


def test_each_parameter_digest_is_the_sha256_of_its_bytes(model):
    found = checksums.same_formula(model)
    weight = model[0].weight.detach().contiguous().numpy().tobytes()
    assert found["0.weight"] == hashlib.sha256(weight).hexdigest()
    assert sorted(found) == ["0.bias", "0.weight", "1.weight"]


def test_a_changed_byte_changes_the_digest(model):
    before = checksums.same_formula(model)
    with torch.no_grad():
        model[1].weight[0, 0] += 1.0
    after = checksums.same_formula(model)
    assert after["1.weight"] != before["1.weight"]
    assert after["0.weight"] == before["0.weight"]


def test_the_digests_are_the_same_whichever_function_made_them(model):
    found, by = checksums.digests(model)
    assert by in ("vllm", "ray_stream_llm")
    assert found == checksums.same_formula(model)


def test_the_summary_hashes_the_sorted_name_digest_lines():
    per_parameter = {"b": "22", "a": "11"}
    expected = hashlib.sha256(b"a 11\nb 22\n").hexdigest()
    assert checksums.summary(per_parameter) == expected
    assert checksums.summary(dict(reversed(list(per_parameter.items())))) == expected
    assert checksums.summary({"a": "11", "b": "23"}) != expected


def test_a_process_records_its_summary_only_when_the_actor_asked(model, tmp_path, monkeypatch):
    monkeypatch.setenv(REPORT_DIR_ENV, str(tmp_path))
    monkeypatch.delenv(checksums.ENV, raising=False)
    checksums.record(model)
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setenv(checksums.ENV, "1")
    checksums.record(model)
    (written,) = tmp_path.iterdir()
    assert written.name.startswith(checksums.PREFIX) and written.suffix == ".json"
    entry = json.loads(written.read_text())
    assert entry["parameters"] == 3
    assert entry["sha256"] == checksums.summary(checksums.same_formula(model))
    assert entry["rank"] is None  # no tensor-parallel group in this process
