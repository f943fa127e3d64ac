"""Pure logic: URIs, file roles, load formats, import hygiene. No processes but one interpreter."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ray_stream_llm.config import StreamingvLLMEngineProcessorConfig, streaming_load_format
from ray_stream_llm.errors import InvalidModelURIError, UnsupportedLoadFormatError
from ray_stream_llm.fetch import default_metadata_dir
from ray_stream_llm.patterns import FileRole, classify
from ray_stream_llm.uri import looks_like_uri, parse_model_uri


@pytest.mark.parametrize(
    "uri, expected",
    [
        ("s3://models/llama", "s3://models/llama/"),
        ("s3://models/llama/", "s3://models/llama/"),
        ("s3://models/a/b//", "s3://models/a/b/"),
        ("S3://models/a", "s3://models/a/"),
        ("s3://models", "s3://models/"),
        ("gs://bkt/m", "gs://bkt/m/"),
        ("az://container/m/", "az://container/m/"),
    ],
)
def test_uri_normalised(uri, expected):
    assert str(parse_model_uri(uri)) == expected


@pytest.mark.parametrize(
    "uri, fragment",
    [
        ("", "non-empty"),
        ("s3:/models/x", "malformed"),
        ("models/x", "malformed"),
        ("s3a://models/x", "use s3://models/x"),
        ("abfss://c@acct.dfs.core.windows.net/m", "use az://"),
        ("azure://c/m", "use az://c/m"),
        ("https://host/bkt/m?X-Amz-Signature=SECRETSIG", "endpoint separately"),
        ("ftp://models/x", "unsupported scheme"),
        ("s3://B/x", "not a valid bucket name"),
        ("s3://models/../x", "'..'"),
        ("s3://models/a//b/", "empty path segment"),
    ],
)
def test_uri_refused_with_fix(uri, fragment):
    with pytest.raises(InvalidModelURIError) as err:
        parse_model_uri(uri)
    assert fragment in str(err.value)
    assert isinstance(err.value, ValueError)
    assert "SECRETSIG" not in str(err.value)


def test_looks_like_uri():
    assert looks_like_uri("s3://b/x") and looks_like_uri("s3:/b/x") and looks_like_uri("s3:b")
    assert not looks_like_uri("meta-llama/Llama-3.1-8B") and not looks_like_uri("/models/x")
    assert not looks_like_uri(None)


def test_metadata_dir_same_for_trailing_slash(monkeypatch, tmp_path):
    monkeypatch.setenv("RAY_STREAM_LLM_CACHE", str(tmp_path))
    a, b = default_metadata_dir("s3://models/m"), default_metadata_dir("s3://models/m/")
    assert a == b and a.parent.parent == tmp_path
    assert default_metadata_dir("s3://models/m2") != a


def _check(paths, expected_roles):
    assert {p: classify(p) for p in paths} == dict(zip(paths, expected_roles))


def test_classify_table():
    W, O, M, X = (
        FileRole.STREAMABLE_WEIGHTS,
        FileRole.OTHER_WEIGHTS,
        FileRole.METADATA,
        FileRole.OTHER,
    )
    _check(
        [
            "model.safetensors",
            "model-00001-of-00003.safetensors",
            "sub/x.safetensors",
            "pytorch_model.bin",
            "training_args.bin",
            "original/consolidated.00.pth",
            "x.pt",
            "model.gguf",
            "tf_model.h5",
            "flax_model.msgpack",
            "model.onnx",
            "m.ckpt",
            "consolidated.safetensors.json.bak",
            "config.json",
            "generation_config.json",
            "tokenizer.json",
            "tokenizer_config.json",
            "special_tokens_map.json",
            "added_tokens.json",
            "vocab.json",
            "merges.txt",
            "vocab.txt",
            "tokenizer.model",
            "spiece.model",
            "cl100k.tiktoken",
            "chat_template.jinja",
            "chat_template.json",
            "preprocessor_config.json",
            "model.safetensors.index.json",
            "modeling_custom.py",
            "additional_chat_templates/tool_use.jinja",
            "original/params.json",
            "original/tokenizer.model",
            "README.md",
            ".gitattributes",
            "LICENSE",
            "images/x.png",
            "requirements.txt",
        ],
        # sub/x.safetensors: vLLM lists the top level only, so a nested one is not streamed
        [W, W, O, O, O, O, O, O, O, O, O, O, O] + [M] * 18 + [X] * 7,
    )


@pytest.mark.parametrize(
    "value, expected",
    [
        (None, None),
        ("auto", None),
        ("safetensors", None),
        ("runai_streamer", "runai_streamer"),
        ("RUNAI_STREAMER", "runai_streamer"),
        ("runai_streamer_sharded", "runai_streamer_sharded"),
        ("my_plugin_format", None),
    ],
)
def test_streaming_load_format(value, expected):
    kwargs = {} if value is None else {"load_format": value}
    assert streaming_load_format(kwargs) == expected


@pytest.mark.parametrize(
    "typo", ["runai-streamer", "runai_stream", "runaistreamer", "runai_streamer_shard"]
)
def test_load_format_typo_refused_at_config(typo):
    with pytest.raises(UnsupportedLoadFormatError) as err:
        StreamingvLLMEngineProcessorConfig(
            model_source="s3://models/m/", engine_kwargs={"load_format": typo}
        )
    assert repr(typo) in str(err.value) and "did you mean" in str(err.value)


def test_malformed_uri_refused_at_config():
    with pytest.raises(InvalidModelURIError):
        StreamingvLLMEngineProcessorConfig(
            model_source="s3:/models/m", engine_kwargs={"load_format": "runai_streamer"}
        )


OURS = (
    "object_store",
    "load_retries",
    "load_retry_backoff_s",
    "weight_sharing",
    "weight_sharing_dir",
    "keep_warm_s",
    "weight_peers",
    "compile_cache_uri",
    "weight_checksums",
    "small_cluster_defaults",
)


def test_config_same_fields_and_defaults_as_parent():
    from ray.data.llm import vLLMEngineProcessorConfig

    ours = StreamingvLLMEngineProcessorConfig(model_source="s3://models/m/")
    theirs = vLLMEngineProcessorConfig(model_source="s3://models/m/")
    assert isinstance(ours, vLLMEngineProcessorConfig)
    # the parent's fields and defaults, plus object_store (None: the standard environment)
    assert set(StreamingvLLMEngineProcessorConfig.model_fields) == set(
        vLLMEngineProcessorConfig.model_fields
    ) | set(OURS)
    assert ours.object_store is None
    assert ours.model_dump(exclude=set(OURS)) == (theirs.model_dump())
    assert not ours.streams_from_object_store
    streamed = StreamingvLLMEngineProcessorConfig(
        model_source="s3://models/m", engine_kwargs={"load_format": "runai_streamer"}
    )
    assert streamed.streams_from_object_store
    local = StreamingvLLMEngineProcessorConfig(
        model_source="/models/m", engine_kwargs={"load_format": "runai_streamer"}
    )
    assert not local.streams_from_object_store  # a local directory streams as vLLM does


def _heavy_after(imports: str) -> set[str]:
    code = (
        f"import sys\n{imports}\n"
        "heavy = [m for m in ('torch', 'vllm', 'runai_model_streamer', 'transformers', "
        "'ray.data.llm') "
        "if m in sys.modules]\n"
        "print('heavy:' + ','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    [line] = [x for x in out.stdout.splitlines() if x.startswith("heavy:")]  # vLLM logs too
    return set(filter(None, line.removeprefix("heavy:").split(",")))


def test_import_pulls_no_heavy_modules():
    ours = _heavy_after(
        "import ray_stream_llm\n"
        "from ray_stream_llm import StreamingvLLMEngineProcessorConfig, build_llm_processor, "
        "fetch_model_metadata"
    )
    # Nothing beyond what Ray's own config module imports: on Ray 2.60 none of them; Ray
    # 2.48's imports torch and transformers, Ray 2.54's vLLM (and with it the streamer) too.
    assert ours == _heavy_after("from ray.data.llm import vLLMEngineProcessorConfig")


def test_the_package_and_its_console_script_import_no_ray_data_llm():
    """``import ray_stream_llm`` takes nothing from Ray Data LLM until a name is taken (the
    console script neither, until a command needs it): on Ray 2.54 ``ray.data.llm`` imports
    vLLM, which logs to stdout, where ``inspect --json`` prints its result."""
    assert _heavy_after("import ray_stream_llm, ray_stream_llm.cli") == set()
    proc = subprocess.run(
        [str(Path(sys.executable).with_name("ray-stream-llm")), "inspect", "/no/model", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 1 and proc.stdout == "", (proc.stdout, proc.stderr)
    assert "InvalidModelURIError" in proc.stderr, proc.stderr


def test_every_public_name_is_found_where_the_package_says():
    import ray_stream_llm

    assert sorted(ray_stream_llm.__all__) == sorted(ray_stream_llm._HOMES)
    for name in ray_stream_llm.__all__:
        assert getattr(ray_stream_llm, name).__name__ == name
    with pytest.raises(AttributeError, match="no attribute 'StreamingConfig'"):
        ray_stream_llm.StreamingConfig  # noqa: B018


def test_builder_registered_for_ray_build_processor():
    """Taking the config from the package registers it with Ray's processor builder."""
    code = (
        "from ray.llm._internal.batch.processor.base import ProcessorBuilder as B\n"
        "import ray_stream_llm\n"
        "before = 'StreamingvLLMEngineProcessorConfig' in B._registry\n"
        "ray_stream_llm.StreamingvLLMEngineProcessorConfig\n"
        "print('registered:', before, 'StreamingvLLMEngineProcessorConfig' in B._registry)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "registered: False True" in out.stdout.splitlines(), out.stdout


def test_doctests():
    import doctest

    import ray_stream_llm.patterns
    import ray_stream_llm.uri

    for module in (ray_stream_llm.patterns, ray_stream_llm.uri):
        result = doctest.testmod(module)
        assert result.attempted > 0 and result.failed == 0, module.__name__


def test_sharded_format_only_from_s3_and_only_its_pattern_key():
    from ray_stream_llm.errors import InvalidSettingError, UnsupportedLoadFormatError

    sharded = {"load_format": "runai_streamer_sharded"}
    for uri in ("gs://models/m/", "az://models/m/"):
        with pytest.raises(UnsupportedLoadFormatError) as err:
            StreamingvLLMEngineProcessorConfig(model_source=uri, engine_kwargs=sharded)
        assert "only under s3://" in str(err.value) and uri.split(":")[0] in str(err.value)
    StreamingvLLMEngineProcessorConfig(
        model_source="s3://models/m/",
        engine_kwargs={
            **sharded,
            "model_loader_extra_config": {"pattern": "rank-{rank}.safetensors"},
        },
    )
    with pytest.raises(InvalidSettingError, match=r"accepts \['pattern'\]"):
        StreamingvLLMEngineProcessorConfig(
            model_source="s3://models/m/",
            engine_kwargs={**sharded, "model_loader_extra_config": {"memory_limit": 0}},
        )


@pytest.mark.parametrize(
    ("pattern", "problem"),
    [
        ("model-rank-{rank}.bin", "must end with .safetensors"),
        ("model-part-{part}.safetensors", "must hold {rank} once"),
        ("model-{rank}-{part}-{layer}.safetensors", "no other {field}"),
        ("model-{rank}{part}.safetensors", "must separate {rank} from {part}"),
        ("tp/model-{rank}-{part}.safetensors", "without '/'"),
        (7, "must be a string, got 7"),
    ],
)
def test_a_sharded_file_pattern_vllm_or_the_streamer_cannot_use_is_refused(pattern, problem):
    from ray_stream_llm.errors import InvalidSettingError

    with pytest.raises(InvalidSettingError) as err:
        StreamingvLLMEngineProcessorConfig(
            model_source="s3://models/m/",
            engine_kwargs={
                "load_format": "runai_streamer_sharded",
                "model_loader_extra_config": {"pattern": pattern},
            },
        )
    assert problem in str(err.value) and repr(pattern) in str(err.value)
    assert "model-rank-{rank}-part-{part}.safetensors" in str(err.value) or pattern == 7


def test_the_sharded_file_pattern_names_the_rank_files_as_vllm_formats_them():
    from ray_stream_llm.patterns import SHARD_PATTERN, shard_file_regex

    for pattern in (SHARD_PATTERN, "p{part}_of_r{rank}.safetensors", "tp-{rank}.safetensors"):
        named = shard_file_regex(pattern)
        for rank, part in ((0, 0), (1, 12), (11, 2)):
            name = pattern.format(rank=rank, part=part)  # what vLLM's save writes
            found = named.fullmatch(name)
            assert found and int(found["rank"]) == rank, (pattern, name)
            assert int(found.groupdict().get("part") or 0) == (part if "{part}" in pattern else 0)
        assert not named.fullmatch("x" + pattern.format(rank=0, part=0))
        assert not named.fullmatch(pattern.format(rank=0, part=0) + ".tmp")


def test_streamer_tuning_stays_out_of_the_sharded_loaders_config():
    from ray_stream_llm.integrations.ray.runtime_env import merge_engine_kwargs
    from ray_stream_llm.stores.settings import ObjectStoreConfig, derive_settings

    settings = derive_settings(ObjectStoreConfig(streamer_concurrency=4))
    plain = merge_engine_kwargs({"load_format": "runai_streamer"}, settings)
    assert plain["model_loader_extra_config"] == {"concurrency": 4}
    sharded = merge_engine_kwargs({"load_format": "runai_streamer_sharded"}, settings)
    assert "model_loader_extra_config" not in sharded
    assert settings.env["RUNAI_STREAMER_CONCURRENCY"] == "4"  # the variable carries it
