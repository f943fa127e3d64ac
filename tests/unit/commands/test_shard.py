"""``ray-stream-llm shard``'s checks without an engine or a store
(ray_stream_llm/commands/shard.py): the saved ranks, the resume markers, the stage directory."""

from __future__ import annotations

import pytest

from ray_stream_llm.commands import shard
from ray_stream_llm.errors import InvalidSettingError, ShardWriteError
from ray_stream_llm.stores import ObjectInfo
from ray_stream_llm.uri import parse_model_uri

SOURCE = parse_model_uri("s3://bucket/m/")


def _save(directory, sizes: dict[str, int]) -> None:
    for name, size in sizes.items():
        (directory / name).write_bytes(b"\0" * size)


def test_saved_ranks_are_returned_sorted_once_every_rank_is_there(tmp_path):
    _save(
        tmp_path,
        {
            "model-rank-1-part-0.safetensors": 50,
            "model-rank-0-part-0.safetensors": 50,
            "config.json": 5,  # not a rank file
        },
    )
    staged = shard.check_saved_ranks(tmp_path, 2, 100, SOURCE)
    assert [p.name for p in staged] == [
        "model-rank-0-part-0.safetensors",
        "model-rank-1-part-0.safetensors",
    ]


def test_a_missing_rank_is_refused_naming_the_ranks(tmp_path):
    _save(tmp_path, {"model-rank-0-part-0.safetensors": 100})
    with pytest.raises(ShardWriteError, match=r"ranks \[0\], not for the 2 ranks asked"):
        shard.check_saved_ranks(tmp_path, 2, 100, SOURCE)


def test_a_save_that_lost_weights_is_refused_naming_the_sizes(tmp_path):
    _save(tmp_path, {"model-rank-0-part-0.safetensors": 49})
    with pytest.raises(ShardWriteError, match="saved 49 bytes of rank files for 100 bytes"):
        shard.check_saved_ranks(tmp_path, 1, 100, SOURCE)
    shard.check_saved_ranks(tmp_path, 1, 98, SOURCE)  # half or more: kept


def test_a_marker_is_the_same_run_only_for_the_same_source_weights_and_ranks():
    identity = shard._identity(SOURCE, {"a.safetensors": "etag1"}, 2, None)
    marker = {**identity, "files": []}
    assert shard._same_run(marker, identity)
    assert not shard._same_run(marker, shard._identity(SOURCE, {"a.safetensors": "etag2"}, 2, None))
    assert not shard._same_run(marker, shard._identity(SOURCE, {"a.safetensors": "etag1"}, 4, None))


def test_an_output_is_complete_only_when_every_listed_file_has_its_size():
    files = [{"path": "r0.safetensors", "size": 10}, {"path": "r1.safetensors", "size": 20}]

    def listing(**sizes):
        return {
            f"{name}.safetensors": ObjectInfo(path=name, key=name, size=size, etag="e")
            for name, size in sizes.items()
        }

    assert shard._complete({"files": files}, listing(r0=10, r1=20))
    assert not shard._complete({"files": files}, listing(r0=10, r1=19))
    assert not shard._complete({"files": files}, listing(r0=10))
    assert not shard._complete({"files": []}, listing(r0=10))


def test_the_result_sums_bytes_per_rank():
    result = shard.ShardResult(
        output="s3://bucket/out/",
        tensor_parallel_size=2,
        files=[
            {"path": "a", "size": 3, "sha256": "x", "rank": 0},
            {"path": "b", "size": 4, "sha256": "y", "rank": 1},
            {"path": "c", "size": 5, "sha256": "z", "rank": 1},
        ],
        metadata=[],
        uploaded=[],
        already_complete=False,
        loaded=True,
        load_seconds=0.0,
        save_seconds=0.0,
        upload_seconds=0.0,
        total_seconds=0.0,
        stage_dir=None,
        staged_peak_bytes=0,
    )
    assert result.weight_bytes == 12
    assert result.rank_bytes() == {0: 3, 1: 9}
    assert result.to_dict()["rank_bytes"] == {0: 3, 1: 9}


def test_a_stage_directory_that_does_not_exist_is_named_with_the_fix(tmp_path):
    with pytest.raises(InvalidSettingError) as info:
        shard._check_stage(tmp_path / "none", 1)
    assert repr(str(tmp_path / "none")) in str(info.value) and "tmpfs" in str(info.value)
