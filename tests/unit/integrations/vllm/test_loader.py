"""The streaming loader (integrations/vllm/loader.py) outside an engine actor: it writes no
report, and a newer vLLM's unused-weight predicate is honoured (None changes nothing)."""

from __future__ import annotations

import json

import torch

from ray_stream_llm.integrations.vllm.plugin import REPORT_DIR_ENV, register


def test_the_loader_writes_no_report_without_an_engine_actor(monkeypatch, tmp_path):
    """Outside this library's engine actors the loader writes no report, and streams a
    local file that is no region's as the streamer does."""
    from safetensors.torch import save_file

    from ray_stream_llm.integrations.vllm.loader import stream_weights

    monkeypatch.delenv(REPORT_DIR_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    tensors = {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3)}
    save_file(tensors, str(tmp_path / "model.safetensors"))
    got = dict(stream_weights([str(tmp_path / "model.safetensors")], distributed=False))
    assert torch.equal(got["w"], tensors["w"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.safetensors"]  # no report


def test_a_newer_vllms_unused_weight_predicate_is_honoured_and_none_changes_nothing(
    monkeypatch, tmp_path
):
    """vLLM 0.33 passes ``is_unused_weight`` (most often None) as a third positional argument
    to the loader's iterator: None streams as before through the library's own path (its
    report lists the files), a predicate leaves out the tensors it names."""
    from safetensors.torch import save_file
    from vllm.config.load import LoadConfig
    from vllm.model_executor.model_loader import get_model_loader

    from ray_stream_llm.integrations.vllm.loader import stream_weights

    monkeypatch.setenv(REPORT_DIR_ENV, str(tmp_path / "reports"))
    (tmp_path / "reports").mkdir()
    model = tmp_path / "model"
    model.mkdir()
    tensors = {"w": torch.ones(2, 3), "v": torch.zeros(4)}
    save_file(tensors, str(model / "model.safetensors"))
    register()
    loader = get_model_loader(LoadConfig(load_format="runai_streamer"))
    assert set(dict(loader._get_weights_iterator(str(model), None, None))) == {"w", "v"}
    [report] = [json.loads(p.read_text()) for p in (tmp_path / "reports").glob("*.json")]
    assert report["done"] and report["files"] == [str(model / "model.safetensors")]
    # a predicate (on a region: a store URI goes to the newer vLLM's own selection)
    got = dict(stream_weights([str(model / "model.safetensors")], distributed=False,
                              unused=lambda name: name == "w"))  # fmt: skip
    assert set(got) == {"v"} and torch.equal(got["v"], tensors["v"])


def test_a_sharded_checkpoint_outside_s3_is_refused_before_vllm_reads_it(tmp_path):
    """Issue 55: vLLM's sharded loader lists rank files only under s3://; from 0.34 its
    load_weights hands any other URI to a Hugging Face Hub download (``_prepare_weights``),
    before that it globbed it as a local path. The registered loader refuses gs:// and az://
    by name in both places, on every vLLM; s3:// and a local directory pass as vLLM's own."""
    from types import SimpleNamespace

    import pytest
    from vllm.config.load import LoadConfig
    from vllm.model_executor.model_loader import get_model_loader

    from ray_stream_llm.errors import UnsupportedLoadFormatError

    register()
    loader = get_model_loader(LoadConfig(load_format="runai_streamer_sharded"))
    for uri in ("gs://bucket/llama-tp2/", "az://container/llama-tp2/"):
        scheme = uri.split("://")[0]
        with pytest.raises(UnsupportedLoadFormatError, match=f"not {scheme}://"):
            loader._prepare_weights(uri, None)
        with pytest.raises(UnsupportedLoadFormatError, match=f"not {scheme}://"):
            loader.download_model(SimpleNamespace(model=uri, revision=None))
        config = SimpleNamespace(model=str(tmp_path), model_weights=uri, revision=None)
        with pytest.raises(UnsupportedLoadFormatError, match=f"not {scheme}://"):
            loader.load_weights(torch.nn.Linear(2, 2), config)
    assert loader._prepare_weights("s3://models/llama-tp2/", None) == "s3://models/llama-tp2/"
    assert loader._prepare_weights(str(tmp_path), None) == str(tmp_path)


def test_vllms_reload_reaches_the_librarys_iterator_where_vllm_offers_it(monkeypatch, tmp_path):
    """Issue 55: vLLM's ``reload_weights`` with no iterator asks the registered loader's
    ``get_all_weights`` (vLLM 0.32 on; touchpoints.py checks both names in every vLLM), which
    reaches the library's ``_get_weights_iterator``: its load report lists the files (vLLM's
    own iterator writes none). vLLM 0.29's Run:ai loader has no ``get_all_weights``: its
    reload refuses the format, and the library adds none."""
    from types import SimpleNamespace

    from safetensors.torch import save_file
    from vllm.config.load import LoadConfig
    from vllm.model_executor.model_loader import RunaiModelStreamerLoader, get_model_loader

    register()
    loader = get_model_loader(LoadConfig(load_format="runai_streamer"))
    if not hasattr(RunaiModelStreamerLoader, "get_all_weights"):
        assert not hasattr(loader, "get_all_weights")
        return
    monkeypatch.setenv(REPORT_DIR_ENV, str(tmp_path / "reports"))
    (tmp_path / "reports").mkdir()
    model = tmp_path / "model"
    model.mkdir()
    tensors = {"w": torch.ones(2, 3), "v": torch.zeros(4)}
    save_file(tensors, str(model / "model.safetensors"))
    config = SimpleNamespace(model=str(model), model_weights="", revision=None)
    got = dict(loader.get_all_weights(config, torch.nn.Linear(2, 2)))
    assert set(got) == {"w", "v"} and torch.equal(got["w"], tensors["w"])
    [report] = [json.loads(p.read_text()) for p in (tmp_path / "reports").glob("*.json")]
    assert report["done"] and report["files"] == [str(model / "model.safetensors")]
