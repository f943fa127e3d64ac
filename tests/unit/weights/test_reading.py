"""How the engine's loader finds its weights (weights/reading.py): the URI the engine actor
names for the model directory it gave vLLM (issue 55: vLLM is given no model_weights, so its
compile key holds neither the URI nor the node)."""

from __future__ import annotations

from ray_stream_llm.weights.reading import WEIGHTS_ENV, weights_env, weights_of


def test_the_named_model_directory_streams_the_named_uri(monkeypatch, tmp_path):
    model = tmp_path / "content" / "abc"
    monkeypatch.setenv(WEIGHTS_ENV, weights_env(str(model), "s3://bucket/model/"))
    assert weights_of(model) == "s3://bucket/model/"
    assert weights_of(f"{model}/") == "s3://bucket/model/"  # however the path is spelled
    assert weights_of(f"{model}/../abc") == "s3://bucket/model/"


def test_any_other_path_or_no_name_is_read_as_given(monkeypatch, tmp_path):
    monkeypatch.delenv(WEIGHTS_ENV, raising=False)
    assert weights_of(tmp_path) == str(tmp_path)
    monkeypatch.setenv(WEIGHTS_ENV, weights_env(str(tmp_path / "a"), "s3://bucket/a/"))
    assert weights_of(tmp_path / "draft") == str(tmp_path / "draft")  # another model's
    assert weights_of("s3://bucket/b/") == "s3://bucket/b/"
    monkeypatch.setenv(WEIGHTS_ENV, "not json")
    assert weights_of(tmp_path / "a") == str(tmp_path / "a")
