"""``ray-stream-llm shard`` and ``runai_streamer_sharded`` without an engine (issue 15): rank
files past vLLM's one listing refused on the driver, the report directory Ray's executor
workers get, the per-rank figures, the command's help and bad input, and saved rank files
that cannot be the model (ShardWriteError). The engine jobs: tests/e2e/test_shard.py."""

from __future__ import annotations

import os
import shutil
import sys
import uuid
from pathlib import Path

import pytest

from ray_stream_llm.commands.shard import shard_model
from ray_stream_llm.manifest import SHARD_DONE_MARKER, SHARD_PARTIAL_MARKER, inspect_model

pytestmark = [pytest.mark.s3]

BUCKET = "models"
RANK_FILES = ("model-rank-0-part-0.safetensors", "model-rank-1-part-0.safetensors")


@pytest.mark.s3
def test_rank_files_past_vllms_one_listing_are_refused_on_the_driver(
    s3_server, tiny_models, s3_env
):
    """vLLM lists a sharded checkpoint's prefix with one call (1,000 keys): 1,000 other
    objects sorting before the rank files hide them from it, and the preflight says so;
    sorting after them they are found and the checkpoint streams."""
    from concurrent.futures import ThreadPoolExecutor

    from vllm.transformers_utils.s3_utils import list_files

    from ray_stream_llm.errors import NotStreamableError

    client = s3_server.client()

    def put(key: str, body: bytes) -> None:
        client.put_object(Bucket=BUCKET, Key=key, Body=body)

    weights = (tiny_models["single"].local / "model.safetensors").read_bytes()
    for where, folder in (("after", "zz-notes"), ("before", "aa-notes")):
        prefix = f"tiny/shard-test-{uuid.uuid4().hex[:8]}-listing-{where}/"
        objects = {
            name: (tiny_models["single"].local / name).read_bytes()
            for name in tiny_models["single"].metadata
        }
        objects.update(dict.fromkeys(RANK_FILES, weights))
        objects.update(dict.fromkeys((f"{folder}/{i:04d}.txt" for i in range(1000)), b"note"))
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(put, [prefix + name for name in objects], objects.values()))
        _, _, seen = list_files(client, f"s3://{BUCKET}/{prefix}")  # what vLLM's loader sees
        found = {key[len(prefix) :] for key in seen} & set(RANK_FILES)
        manifest = inspect_model(
            f"s3://{BUCKET}/{prefix}", tensor_parallel_size=2, check_headers=False
        )
        if where == "after":
            assert found == set(RANK_FILES)
            assert manifest.streamable, manifest.problems
        else:
            assert found == set()  # the store gave vLLM none of them
            with pytest.raises(NotStreamableError) as info:
                manifest.raise_if_not_streamable()
            message = str(info.value)
            assert "would not find 2 rank file(s)" in message and RANK_FILES[0] in message
            assert f"first 1000 of its {len(objects)} objects" in message


def test_ray_executor_workers_get_the_report_directory(monkeypatch, tmp_path):
    """vLLM's Ray executor copies only the variables it is told about to its worker actors:
    the plugin names the report directory there, so Ray-actor ranks report too."""
    from vllm.ray.ray_env import get_env_vars_to_copy

    from ray_stream_llm.integrations.vllm.plugin import RAY_COPY_ENV, REPORT_DIR_ENV, register

    monkeypatch.setenv(REPORT_DIR_ENV, str(tmp_path))
    monkeypatch.setenv(RAY_COPY_ENV, "SOME_USER_VAR")
    assert REPORT_DIR_ENV not in get_env_vars_to_copy(exclude_vars=set())
    register()
    register()  # once in the list, however often vLLM calls the plugin
    assert os.environ[RAY_COPY_ENV] == f"SOME_USER_VAR,{REPORT_DIR_ENV}"
    copied = get_env_vars_to_copy(exclude_vars=set())
    assert REPORT_DIR_ENV in copied and "SOME_USER_VAR" in copied


def test_load_report_per_rank_figures():
    """Two ranks of one engine: each process's objects counted once for it, summed over the
    ranks (what the store served), one entry per rank in the report and its log line."""
    from ray_stream_llm.reports import build_report

    def session(pid, rank, files, start, seconds):
        return {
            "done": True,
            "pid": pid,
            "rank": rank,
            "files": files,
            "delivered_bytes": 90 * len(files),
            "started": start,
            "seconds": seconds,
        }

    a, b = "s3://b/m/model-rank-0-part-0.safetensors", "s3://b/m/model-rank-1-part-0.safetensors"
    sizes = {a: 100, b: 100, "s3://b/p/model.safetensors": 300}
    sharded = [session(11, 1, [b], 10.0, 2.0), session(10, 0, [a], 10.5, 1.0)]
    report = build_report(
        model="s3://b/m/",
        streamed=True,
        attempt=1,
        ready_seconds=5.0,
        fetched=None,
        sessions=sharded,
        sizes=sizes,
        job_id="01",
        node_ip="127.0.0.1",
        actor_settings={},
    )
    assert report.weight_bytes == 200 and report.weight_files == 2
    assert [(r["rank"], r["pid"], r["weight_bytes"], r["objects"]) for r in report.ranks] == [
        (0, 10, 100, [a]),
        (1, 11, 100, [b]),
    ]
    assert report.ranks[1]["seconds"] == 2.0
    assert "rank 0: 1 files, 100 bytes in 1.00s, rank 1: 1 files, 100 bytes in 2.00s" in (
        report.log_line()
    )
    plain = [session(10, 0, ["s3://b/p/model.safetensors"], 0.0, 1.0)]
    plain.append(session(11, 1, ["s3://b/p/model.safetensors"], 0.0, 1.5))
    twice = build_report(
        model="s3://b/p/",
        streamed=True,
        attempt=1,
        ready_seconds=5.0,
        fetched=None,
        sessions=plain,
        sizes=sizes,
        job_id="01",
        node_ip="127.0.0.1",
        actor_settings={},
    )
    assert twice.weight_files == 1 and twice.weight_bytes == 600  # every rank read it all


def test_shard_command_help_and_bad_input(tmp_path):
    """`--help` has an example; bad input exits non-zero with the reason on its last line,
    no traceback."""
    import subprocess

    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path)}

    def cli(*args):
        argv = [sys.executable, "-m", "ray_stream_llm.cli", "shard", *args]
        return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)

    helped = cli("--help")
    assert helped.returncode == 0 and "Example: ray-stream-llm shard " in helped.stdout
    for args, fragment in [
        (("s3://m/x/", "--tensor-parallel-size", "0", "--output", "s3://m/y/"), "0"),
        (("s3://m/x/", "--tensor-parallel-size", "2", "--output", "gs://m/y/"), "s3://"),
        (
            (
                *("s3://m/x/", "--tensor-parallel-size", "2", "--output", "s3://m/y/"),
                "--engine-kwargs",
                "[1]",
            ),
            "must be a JSON object",
        ),
    ]:
        proc = cli(*args)
        assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
        assert fragment in proc.stderr.strip().splitlines()[-1], proc.stderr  # the reason


# --- what an engine saved, checked before anything is uploaded or marked complete ----------
def _save_rank_files(private: Path, ranks: list[int], floats: int) -> int:
    """Real safetensors rank files (one part each, ``floats`` float32 values) as vLLM names
    them; the bytes written."""
    import torch
    from safetensors.torch import save_file

    for rank in ranks:
        tensors = {"model.embed_tokens.weight": torch.full((floats,), float(rank + 1))}
        save_file(tensors, str(private / f"model-rank-{rank}-part-0.safetensors"))
    return sum(p.stat().st_size for p in private.glob("*.safetensors"))


@pytest.mark.parametrize(
    "ranks, floats, fragment",
    [
        ([0, 2], 1 << 18, "ranks [0, 2], not for the 2 ranks asked"),
        ([0], 1 << 18, "ranks [0], not for the 2 ranks asked"),
        ([0, 1], 16, None),  # every rank, far fewer bytes than the source: the sizes named
    ],
    ids=["other-ranks", "too-few-ranks", "too-few-bytes"],
)
def test_saved_rank_files_that_cannot_be_the_model_are_a_shard_write_error(
    tmp_path, ranks, floats, fragment
):
    from ray_stream_llm.commands.shard import MIN_SAVED_SHARE, check_saved_ranks
    from ray_stream_llm.errors import ShardWriteError
    from ray_stream_llm.uri import parse_model_uri

    source = parse_model_uri(f"s3://{BUCKET}/tiny/single/")
    source_bytes = 1 << 20
    saved = _save_rank_files(tmp_path, ranks, floats)
    with pytest.raises(ShardWriteError) as err:
        check_saved_ranks(tmp_path, 2, source_bytes, source)
    message = str(err.value)
    if fragment is None:
        assert saved < MIN_SAVED_SHARE * source_bytes
        assert f"saved {saved} bytes of rank files for {source_bytes} bytes" in message, message
        assert repr(str(source)) in message, message
    else:
        assert saved >= MIN_SAVED_SHARE * source_bytes  # the ranks alone are wrong
        assert fragment in message and "tensor_parallel_size=2" in message, message
    assert "nothing was marked complete" in message
    # the files that pass: every rank, most of the bytes
    for path in tmp_path.iterdir():
        path.unlink()
    _save_rank_files(tmp_path, [0, 1], 1 << 17)
    assert [p.name for p in check_saved_ranks(tmp_path, 2, source_bytes, source)] == [
        "model-rank-0-part-0.safetensors",
        "model-rank-1-part-0.safetensors",
    ]


def test_a_save_of_too_few_bytes_uploads_no_rank_file_and_marks_nothing_complete(
    s3_server, tiny_models, s3_env, monkeypatch
):
    """The whole command with the engine's save standing in (it writes real safetensors rank
    files, of every rank, far fewer bytes than the model's): ShardWriteError naming the
    sizes; the output holds the partial marker, no rank file and no completion marker, and
    the stage directory is removed."""
    from ray_stream_llm.errors import ShardWriteError
    from ray_stream_llm.integrations.vllm import plugin

    source = tiny_models["single"]
    source_bytes = sum(p.stat().st_size for p in source.local.glob("*.safetensors"))
    output = f"s3://{BUCKET}/tiny/shard-test-{uuid.uuid4().hex[:8]}-short/"
    stage = Path("/dev/shm") / f"rsl-shard-test-{uuid.uuid4().hex[:8]}"
    stage.mkdir()
    saved: list[int] = []

    def short_save(kwargs: dict, private: str, max_part_bytes: int | None) -> tuple[float, float]:
        assert kwargs["tensor_parallel_size"] == 2
        saved.append(_save_rank_files(Path(private), [0, 1], 16))
        return 0.0, 0.0

    monkeypatch.setattr(plugin, "save_sharded_checkpoint", short_save)
    try:
        with pytest.raises(ShardWriteError) as err:
            shard_model(source.uri, 2, output, stage_dir=stage)
        assert list(stage.iterdir()) == []
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    assert f"saved {saved[0]} bytes of rank files for {source_bytes} bytes" in str(err.value)
    bucket, _, prefix = output.removeprefix("s3://").partition("/")
    listed = s3_server.client().list_objects_v2(Bucket=bucket, Prefix=prefix)
    names = sorted(o["Key"].removeprefix(prefix) for o in listed.get("Contents", ()))
    assert SHARD_PARTIAL_MARKER in names and SHARD_DONE_MARKER not in names, names
    assert [n for n in names if n.endswith(".safetensors")] == [], names
