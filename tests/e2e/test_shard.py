"""``ray-stream-llm shard`` and ``runai_streamer_sharded`` end to end (issue 15), against the
real SeaweedFS server, vLLM's CPU build and the Run:ai streamer.

The writer runs as a user would run the command: in a subprocess with its own HOME and
TMPDIR (:mod:`ray_stream_llm.tools.isolated`), so that every file it put on a disk-backed
path can be found. The store's side comes from its access log (which objects, in which
order) and, for bytes, from :class:`~ray_stream_llm.tools.shard_proxy.ByteProxy` (the
response bytes of each GET).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest
from helpers.jobs import share_model_records, weight_files_written
from helpers.models import tensor_bytes

from ray_stream_llm.commands.shard import mount_type, shard_model
from ray_stream_llm.errors import (
    IncompleteShardedCheckpointError,
    InvalidModelURIError,
    InvalidSettingError,
    ShardOutputConflictError,
    TensorParallelMismatchError,
)
from ray_stream_llm.manifest import SHARD_DONE_MARKER, SHARD_PARTIAL_MARKER, inspect_model
from ray_stream_llm.tools.isolated import run_isolated
from ray_stream_llm.tools.localstore import LocalS3Server

pytestmark = [pytest.mark.s3]

BUCKET = "models"
RANK_FILES = ("model-rank-0-part-0.safetensors", "model-rank-1-part-0.safetensors")


def _shm_entries() -> set[str]:
    return set(os.listdir("/dev/shm"))


def _run_shard(
    server: LocalS3Server, work: Path, records: Path, *args: str
) -> tuple[dict, str, float]:
    """``ray-stream-llm shard ARGS --json`` in an isolated environment under ``work``, its
    HOME with the session's vLLM model-class records (``records``)."""
    share_model_records(work, records)
    since = time.time()
    argv = [sys.executable, "-m", "ray_stream_llm.cli", "shard", *args, "--json"]
    proc = run_isolated(argv, work, server.env(), timeout=900)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return json.loads(proc.stdout), proc.stderr, since


def _requests(server: LocalS3Server, start: int, prefix: str) -> list:
    from helpers.s3log import log_barrier

    log_barrier(server)
    return [r for r in server.served()[start:] if r.bucket == BUCKET and r.key.startswith(prefix)]


def _side_by_side_dir(work: Path, records: Path) -> Path:
    """The directory for shard_bench.side_by_side's two jobs, each job's HOME (its
    ``<format>/home``) with the session's vLLM model-class records (``records``)."""
    from ray_stream_llm.tools.shard_bench import FORMATS

    jobs = work / "jobs"
    for load_format in FORMATS:
        share_model_records(jobs / load_format, records)
    return jobs


def _keys(server: LocalS3Server, prefix: str) -> dict[str, int]:
    client = server.client()
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
    return {
        o["Key"][len(prefix) :]: int(o["Size"]) for page in pages for o in page.get("Contents", ())
    }


@pytest.fixture(scope="module")
def written(s3_server, tiny_models, vllm_modelinfos):
    """The single-file tiny model, sharded for TP=2 by the command, with what was measured
    around the run."""
    from helpers.s3log import log_barrier

    model = tiny_models["single"]
    name = f"tiny/shard-test-{uuid.uuid4().hex[:8]}-tp2/"
    output = f"s3://{BUCKET}/{name}"
    # short: vLLM's IPC socket paths (under the run's rpc/) must stay under 107 bytes
    work = Path(tempfile.mkdtemp(prefix="rsl-shard-", dir="/tmp"))
    log_barrier(s3_server)
    start = len(s3_server.served())
    shm_before = _shm_entries()
    result, log, since = _run_shard(
        s3_server,
        work,
        vllm_modelinfos,
        model.uri,
        "--tensor-parallel-size",
        "2",
        "--output",
        output,
    )
    yield {
        "model": model,
        "output": output,
        "prefix": name,
        "result": result,
        "log": log,
        "since": since,
        "work": work,
        "start": start,
        "shm_new": {
            n for n in _shm_entries() - shm_before if n.startswith(("rsl-", "vllm_", "psm_"))
        },
        "rpc_left": sorted(str(p) for p in Path("/tmp").glob("rsl-shard-rpc-*"))
        + sorted(str(p) for p in (work / "rpc").glob("*")),
    }
    shutil.rmtree(work, ignore_errors=True)


@pytest.mark.e2e
@pytest.mark.engine
def test_shard_writes_each_rank_and_the_completion_marker_last(s3_server, written):
    result, prefix = written["result"], written["prefix"]
    assert result["tensor_parallel_size"] == 2 and result["loaded"] is True
    assert sorted(f["path"] for f in result["files"]) == list(RANK_FILES)
    assert {f["rank"] for f in result["files"]} == {0, 1}
    stored = _keys(s3_server, prefix)
    assert {f["path"]: f["size"] for f in result["files"]} == {
        k: v for k, v in stored.items() if k.endswith(".safetensors")
    }
    # the model's metadata came along, not the index of the original files, not the partial marker
    assert set(result["metadata"]) <= set(stored) and "config.json" in result["metadata"]
    assert "model.safetensors.index.json" not in stored
    assert SHARD_DONE_MARKER in stored and SHARD_PARTIAL_MARKER not in stored

    writes = [
        (r.method, r.key[len(prefix) :])
        for r in _requests(s3_server, written["start"], prefix)
        if r.method in ("PUT", "DELETE") and r.status in (200, 204)
    ]
    assert writes[0] == ("PUT", SHARD_PARTIAL_MARKER)  # first: the run is marked partial
    done_at = writes.index(("PUT", SHARD_DONE_MARKER))
    for name in RANK_FILES:  # each rank file sent once, before the completion marker
        assert [i for i, w in enumerate(writes) if w == ("PUT", name)] < [done_at]
        assert writes.count(("PUT", name)) == 1
    assert writes[done_at:] == [("PUT", SHARD_DONE_MARKER), ("DELETE", SHARD_PARTIAL_MARKER)]

    # the source's weights were streamed (every rank read them from the store)...
    source_prefix = written["model"].uri[len(f"s3://{BUCKET}/") :]
    reads = [
        r.key
        for r in _requests(s3_server, written["start"], source_prefix)
        if r.method == "GET" and r.key.endswith(".safetensors")
    ]
    assert reads, "the writer did not read the source's weights from the store"
    # ...and no weight file reached a disk-backed path: not in the run's HOME, TMPDIR,
    # working directory and caches (all under its work directory), not in the user's cache
    roots = [written["work"], Path.home() / ".cache"]
    assert weight_files_written(roots, written["since"]) == {}
    # the ranks saved into a private directory on tmpfs, removed after the upload
    stage = Path(result["stage_dir"])
    assert mount_type(stage.parent) == "tmpfs" and stage.parent == Path("/dev/shm")
    assert not stage.exists()
    assert result["staged_peak_bytes"] == sum(f["size"] for f in result["files"])
    assert written["shm_new"] == set(), f"left in /dev/shm: {written['shm_new']}"
    # the writer's engine kept its IPC sockets in a private directory, removed with it
    assert written["rpc_left"] == [], written["rpc_left"]


@pytest.mark.e2e
@pytest.mark.engine
def test_sharded_output_streams_at_tp2_and_not_at_tp4(s3_server, written, s3_env):
    manifest = inspect_model(written["output"], tensor_parallel_size=2)
    assert manifest.streamable, manifest.problems
    assert manifest.ranks == (0, 1)
    assert manifest.weight_bytes == sum(f["size"] for f in written["result"]["files"])
    wrong = inspect_model(written["output"], tensor_parallel_size=4)
    assert not wrong.streamable and wrong.ranks == (0, 1)
    with pytest.raises(TensorParallelMismatchError) as info:
        wrong.raise_if_not_streamable()
    assert "ranks [0, 1]" in str(info.value) and "tensor_parallel_size is 4" in str(info.value)
    # the two ranks hold the whole model, split: no weight lost in the save (vLLM's CPU
    # build empties its linear layers' weights after packing them, which the writer's
    # engine turns off), only the replicated norms counted twice
    rank_tensors = sum(tensor_bytes_of(s3_server, written["output"], f) for f in RANK_FILES)
    source = tensor_bytes(written["model"].local / "model.safetensors")
    assert source <= rank_tensors <= source * 1.01, (rank_tensors, source)


def tensor_bytes_of(server: LocalS3Server, uri: str, name: str) -> int:
    """Tensor bytes of a safetensors object in the store, from its header."""
    import struct

    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    client = server.client()
    head = client.get_object(Bucket=bucket, Key=prefix + name, Range="bytes=0-7")["Body"].read()
    (length,) = struct.unpack("<Q", head)
    raw = client.get_object(Bucket=bucket, Key=prefix + name, Range=f"bytes=8-{7 + length}")
    header = json.loads(raw["Body"].read())
    spans = [v["data_offsets"] for k, v in header.items() if k != "__metadata__"]
    return sum(end - start for start, end in spans)


@pytest.mark.e2e
@pytest.mark.engine
def test_a_custom_file_pattern_is_followed_as_vllms_loader_follows_it(s3_server, written, s3_env):
    """A sharded state saved by vLLM itself with ``pattern`` (no marker of the shard
    command): the preflight follows the engines' ``model_loader_extra_config["pattern"]``
    and finds each rank's files where vLLM's own S3 glob finds them."""
    from vllm.transformers_utils.s3_utils import glob as vllm_s3_glob

    from ray_stream_llm import StreamingvLLMEngineProcessorConfig
    from ray_stream_llm.errors import NotStreamableError
    from ray_stream_llm.patterns import shard_file_regex
    from ray_stream_llm.preflight import preflight

    pattern = "tp2-p{part}-r{rank}.safetensors"
    prefix = f"tiny/shard-test-{uuid.uuid4().hex[:8]}-pattern/"
    client = s3_server.client()
    for key in _keys(s3_server, written["prefix"]):
        if key.startswith("ray-stream-llm-shard."):
            continue
        named = shard_file_regex().fullmatch(key)  # vLLM's default names
        target = pattern.format(rank=named["rank"], part=named["part"]) if named else key
        source = {"Bucket": BUCKET, "Key": written["prefix"] + key}
        client.copy_object(Bucket=BUCKET, Key=prefix + target, CopySource=source)
    output = f"s3://{BUCKET}/{prefix}"

    manifest = inspect_model(output, tensor_parallel_size=2, shard_pattern=pattern)
    assert manifest.streamable, manifest.problems
    assert manifest.ranks == (0, 1)
    for rank in manifest.ranks:  # vLLM's discovery of rank R's files (sharded_state_loader)
        found = vllm_s3_glob(path=output, allow_pattern=[f"*{pattern.format(rank=rank, part='*')}"])
        assert found == [output + pattern.format(rank=rank, part=0)], found
    wrong = inspect_model(output, tensor_parallel_size=4, shard_pattern=pattern)
    with pytest.raises(TensorParallelMismatchError, match=r"ranks \[0, 1\]"):
        wrong.raise_if_not_streamable()

    sharded = {"load_format": "runai_streamer_sharded", "tensor_parallel_size": 2}
    custom = {**sharded, "model_loader_extra_config": {"pattern": pattern}}
    assert preflight(StreamingvLLMEngineProcessorConfig(model_source=output, engine_kwargs=custom))
    # without the pattern the default names are looked for, and the message says how to
    # name others
    with pytest.raises(NotStreamableError) as info:
        preflight(StreamingvLLMEngineProcessorConfig(model_source=output, engine_kwargs=sharded))
    assert "model-rank-<rank>-part-<part>.safetensors" in str(info.value)
    assert "model_loader_extra_config={'pattern': ...}" in str(info.value)

    from click.testing import CliRunner

    from ray_stream_llm.cli import main

    args = ["inspect", output, "--tensor-parallel-size", "2"]
    named = CliRunner().invoke(main, [*args, "--shard-pattern", pattern])
    assert named.exit_code == 0 and "streamable: yes" in named.output, named.output
    unnamed = CliRunner().invoke(main, args)
    assert unnamed.exit_code == 1 and "streamable: no" in unnamed.output, unnamed.output


@pytest.mark.e2e
@pytest.mark.engine
def test_shard_again_is_a_no_op(s3_server, written, work, vllm_modelinfos):
    from helpers.s3log import log_barrier

    log_barrier(s3_server)
    start = len(s3_server.served())
    again, _, _ = _run_shard(
        s3_server,
        work,
        vllm_modelinfos,
        written["model"].uri,
        "--tensor-parallel-size",
        "2",
        "--output",
        written["output"],
    )
    assert again["already_complete"] is True and again["loaded"] is False
    assert again["uploaded"] == []
    writes = [
        r for r in _requests(s3_server, start, written["prefix"]) if r.method in ("PUT", "DELETE")
    ]
    assert writes == []


def _marker(server: LocalS3Server, prefix: str) -> dict:
    """The completion marker without its time of writing."""
    body = server.client().get_object(Bucket=BUCKET, Key=prefix + SHARD_DONE_MARKER)["Body"]
    marker = json.loads(body.read())
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", marker.pop("written_at"))
    return marker


def _copy_prefix(server: LocalS3Server, src: str, dst: str) -> None:
    """Server-side copies (the objects' user metadata, their SHA-256, comes along)."""
    client = server.client()
    for key in _keys(server, src):
        client.copy_object(
            Bucket=BUCKET, Key=dst + key, CopySource={"Bucket": BUCKET, "Key": src + key}
        )


def _as_partial(server: LocalS3Server, prefix: str, drop: tuple[str, ...] = ()) -> None:
    """Turn a complete output into what a writer killed after its save leaves: the partial
    marker (with every file's size and digest), no completion marker, ``drop`` not sent."""
    client = server.client()
    done = json.loads(
        client.get_object(Bucket=BUCKET, Key=prefix + SHARD_DONE_MARKER)["Body"].read()
    )
    partial = {k: v for k, v in done.items() if k not in ("metadata", "written_at")}
    client.put_object(
        Bucket=BUCKET, Key=prefix + SHARD_PARTIAL_MARKER, Body=json.dumps(partial).encode()
    )
    for name in (SHARD_DONE_MARKER, *drop):
        client.delete_object(Bucket=BUCKET, Key=prefix + name)


@pytest.mark.e2e
@pytest.mark.engine
def test_partial_output_is_refused_by_name_and_resumed(
    s3_server, written, s3_env, work, vllm_modelinfos
):
    from helpers.s3log import log_barrier

    prefix = f"tiny/shard-test-{uuid.uuid4().hex[:8]}-resume/"
    output = f"s3://{BUCKET}/{prefix}"
    _copy_prefix(s3_server, written["prefix"], prefix)
    args = (written["model"].uri, "--tensor-parallel-size", "2", "--output", output)

    # killed after every upload, before the completion marker: refused, then finished
    # without loading the model or sending anything again
    _as_partial(s3_server, prefix)
    with pytest.raises(IncompleteShardedCheckpointError) as info:
        inspect_model(output, tensor_parallel_size=2)
    assert SHARD_PARTIAL_MARKER in str(info.value) and "resume" in str(info.value)
    resumed, _, _ = _run_shard(s3_server, work / "r1", vllm_modelinfos, *args)
    assert resumed["loaded"] is False and resumed["uploaded"] == []
    assert inspect_model(output, tensor_parallel_size=2).streamable

    # killed before rank 1's file was sent: refused; the resumed run loads the model again
    # and sends that one file only
    _as_partial(s3_server, prefix, drop=(RANK_FILES[1],))
    with pytest.raises(IncompleteShardedCheckpointError):
        inspect_model(output, tensor_parallel_size=2)
    log_barrier(s3_server)
    start = len(s3_server.served())
    resumed, _, _ = _run_shard(s3_server, work / "r2", vllm_modelinfos, *args)
    assert resumed["loaded"] is True and resumed["uploaded"] == [RANK_FILES[1]]
    puts = [
        r.key[len(prefix) :]
        for r in _requests(s3_server, start, prefix)
        if r.method == "PUT" and r.status == 200
    ]
    assert [p for p in puts if p.endswith(".safetensors")] == [RANK_FILES[1]]
    assert puts[-1] == SHARD_DONE_MARKER
    manifest = inspect_model(output, tensor_parallel_size=2)
    assert manifest.streamable and manifest.ranks == (0, 1)
    # the files are those of the first run (vLLM's save is deterministic); the completion
    # markers differ only in when they were written
    assert _keys(s3_server, prefix) == _keys(s3_server, written["prefix"])
    assert _marker(s3_server, prefix) == _marker(s3_server, written["prefix"])

    # a rank file removed behind the completion marker's back: refused, naming the file
    s3_server.client().delete_object(Bucket=BUCKET, Key=prefix + RANK_FILES[0])
    with pytest.raises(IncompleteShardedCheckpointError) as info:
        inspect_model(output, tensor_parallel_size=2)
    assert f"{RANK_FILES[0]} (missing)" in str(info.value)


@pytest.mark.e2e
@pytest.mark.engine
def test_shard_refuses_bad_outputs_before_writing(s3_server, tiny_models, written, s3_env):
    from helpers.s3log import log_barrier

    source = tiny_models["single"].uri
    with pytest.raises(InvalidModelURIError, match="only under s3://"):
        shard_model(source, 2, "gs://bucket/out/")
    with pytest.raises(InvalidModelURIError, match="overlap"):
        shard_model(source, 2, source + "tp2/")
    with pytest.raises(InvalidSettingError, match="positive integer"):
        shard_model(source, 0, f"s3://{BUCKET}/tiny/nowhere/")
    log_barrier(s3_server)
    start = len(s3_server.served())
    # another model's objects at the output
    with pytest.raises(ShardOutputConflictError, match="did not write"):
        shard_model(source, 2, tiny_models["sharded"].uri)
    # the same output, written for another TP size
    with pytest.raises(ShardOutputConflictError, match="tensor_parallel_size=2"):
        shard_model(source, 1, written["output"])
    # a stage directory on a disk-backed filesystem
    disk = Path("/tmp")
    assert mount_type(disk) not in ("tmpfs", "ramfs")
    empty = f"s3://{BUCKET}/tiny/shard-test-{uuid.uuid4().hex[:8]}-disk/"
    with pytest.raises(InvalidSettingError, match="not a memory-backed"):
        shard_model(source, 2, empty, stage_dir=disk)
    writes = [r for r in s3_server.served()[start:] if r.method in ("PUT", "DELETE", "POST")]
    assert [w for w in writes if w.bucket == BUCKET] == []  # nothing was written


@pytest.mark.e2e
@pytest.mark.engine
def test_tp2_jobs_side_by_side_each_rank_reads_its_own_files(
    s3_server, written, work, vllm_modelinfos
):
    """The same TP=2 job through Ray Data twice: runai_streamer over the plain checkpoint
    (each rank reads every object: 2.0x the model) and runai_streamer_sharded over the
    written one (each rank reads its own file, once: 1.0x). Bytes from the byte proxy,
    objects from the server's access log, ranks from the load reports."""
    from helpers.s3log import log_barrier

    from ray_stream_llm.tools.shard_bench import side_by_side, summary

    model = written["model"]
    source_prefix = model.uri[len(f"s3://{BUCKET}/") :]
    sizes = _keys(s3_server, source_prefix)
    source_weights = {k: v for k, v in sizes.items() if k.endswith(".safetensors")}
    rank_sizes = {f["path"]: f["size"] for f in written["result"]["files"]}
    log_barrier(s3_server)
    start = len(s3_server.served())
    result = side_by_side(
        model.uri,
        written["output"],
        2,
        _side_by_side_dir(work, vllm_modelinfos),
        env=s3_server.env(),
        engine_kwargs={"kv_cache_memory_bytes": 512 << 20},
        num_cpus=4,
    )
    rows = summary(result, sum(source_weights.values()))
    print(json.dumps(rows, indent=1))
    plain, sharded = result["jobs"]["runai_streamer"], result["jobs"]["runai_streamer_sharded"]
    prompts = len(plain["answers"])
    assert plain["rows"] == sharded["rows"] == prompts > 0  # every row answered
    assert sharded["answers"] == plain["answers"]  # the same model, greedy
    # the store served every source object twice (once per rank) to the plain job...
    assert plain["store_weight_get_bytes"] == {
        source_prefix + k: 2 * v for k, v in source_weights.items()
    }
    # ...and each rank file exactly once to the sharded job, nothing else
    assert sharded["store_weight_get_bytes"] == {
        written["prefix"] + k: v for k, v in rank_sizes.items()
    }
    # the driver's check read the headers of the rank files only (two small ranged GETs)
    assert set(sharded["store_header_check_bytes"]) == {written["prefix"] + k for k in rank_sizes}
    assert rows["runai_streamer"]["x_model"] == pytest.approx(2.0)
    assert rows["runai_streamer_sharded"]["x_model"] == pytest.approx(1.0, abs=0.01)
    # the load report, per rank: rank r streamed model-rank-r-* only
    for job, expect in ((plain, None), (sharded, rank_sizes)):
        [report] = job["load_reports"]
        ranks = report["ranks"]
        assert [r["rank"] for r in ranks] == [0, 1] and len({r["pid"] for r in ranks}) == 2
        for r in ranks:
            assert r["seconds"] > 0
            if expect is None:
                assert r["weight_bytes"] == sum(source_weights.values())
            else:
                name = f"model-rank-{r['rank']}-part-0.safetensors"
                assert r["objects"] == [written["output"] + name]
                assert r["weight_bytes"] == expect[name]
        assert report["weight_bytes"] == sum(r["weight_bytes"] for r in ranks)
        assert job["disk_weight_files"] == []  # no weight file in the jobs' HOME or TMPDIR
    # the server's own log: during the sharded job, no source weight object was read
    served = _requests(s3_server, start, "")
    sharded_reads = {r.key for r in served if r.method == "GET" and r.key.endswith(".safetensors")}
    assert sharded_reads == {source_prefix + k for k in source_weights} | {
        written["prefix"] + k for k in rank_sizes
    }
    (work / "side_by_side.json").write_text(json.dumps(rows))


@pytest.mark.e2e
@pytest.mark.engine
def test_a_tp_size_the_model_cannot_take_is_a_typed_error(s3_server, tiny_models, s3_env):
    """The tiny model has 4 attention heads: vLLM refuses TP=3 when the engine is built; the
    writer raises EngineStartError quoting it, and the output stays partial (refused)."""
    from ray_stream_llm.errors import EngineStartError

    output = f"s3://{BUCKET}/tiny/shard-test-{uuid.uuid4().hex[:8]}-tp3/"
    shm_before = _shm_entries()
    with pytest.raises(EngineStartError) as info:
        shard_model(tiny_models["single"].uri, 3, output)
    message = str(info.value)
    assert "tensor_parallel_size=3" in message and "divisible" in message, message
    assert s3_server.secret_access_key not in message
    with pytest.raises(IncompleteShardedCheckpointError):
        inspect_model(output, tensor_parallel_size=3)
    assert {
        n for n in _shm_entries() - shm_before if n.startswith(("rsl-", "vllm_", "psm_"))
    } == set()


@pytest.mark.e2e
@pytest.mark.engine
@pytest.mark.slow  # about 8 minutes: make test-slow
def test_smollm2_at_tp3_side_by_side(s3_server, smollm2, work, s3_env, vllm_modelinfos):
    """The real demo model (SmolLM2-135M: 9 attention heads, 3 KV heads, so TP=2 is not
    possible on any device; TP=3 is the closest): sharded by the command, then the same
    TP=3 job with both formats. The store serves 3.0x the model to runai_streamer and
    1.0x to runai_streamer_sharded, each rank its own file once; the answers agree."""
    from ray_stream_llm.tools.shard_bench import side_by_side, summary

    output = f"s3://{BUCKET}/smollm2-tp3-{uuid.uuid4().hex[:8]}/"
    result, _, _ = _run_shard(
        s3_server,
        work / "shard",
        vllm_modelinfos,
        smollm2.uri,
        "--tensor-parallel-size",
        "3",
        "--output",
        output,
    )
    assert sorted(f["rank"] for f in result["files"]) == [0, 1, 2]
    assert inspect_model(output, tensor_parallel_size=3).streamable
    source = {k: v for k, v in _keys(s3_server, "smollm2/").items() if k.endswith(".safetensors")}
    jobs = side_by_side(
        smollm2.uri,
        output,
        3,
        _side_by_side_dir(work, vllm_modelinfos),
        env=s3_server.env(),
        engine_kwargs={"kv_cache_memory_bytes": 256 << 20},
        num_cpus=5,
        prompts=["What is 2+2?", "Name three primary colors."],
    )
    rows = summary(jobs, sum(source.values()))
    print(json.dumps(rows, indent=1))
    plain, sharded = jobs["jobs"]["runai_streamer"], jobs["jobs"]["runai_streamer_sharded"]
    assert plain["rows"] == sharded["rows"] == 2
    assert sharded["answers"] == plain["answers"]
    assert plain["store_weight_get_bytes"] == {f"smollm2/{k}": 3 * v for k, v in source.items()}
    prefix = output[len(f"s3://{BUCKET}/") :]
    assert sharded["store_weight_get_bytes"] == {
        prefix + f["path"]: f["size"] for f in result["files"]
    }
    [report] = sharded["load_reports"]
    assert [(r["rank"], r["objects"]) for r in report["ranks"]] == [
        (rank, [f"{output}model-rank-{rank}-part-0.safetensors"]) for rank in range(3)
    ]
