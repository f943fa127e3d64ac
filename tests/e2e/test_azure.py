"""A Ray Data job streaming from az:// (Azurite, the Azure emulator, over HTTPS on
127.0.0.1: tests/conftest.py's azurite), the store set once in the config: the job's
environment holds no Azure or AWS variable. The store calls without an engine:
tests/integration/test_azure.py."""

from __future__ import annotations

from pathlib import Path

# Installed by `make setup` (requirements/azure.txt): missing, these tests fail, never skip.
import azure.storage.blob  # noqa: F401
import pytest
import runai_model_streamer_azure  # noqa: F401
from helpers.emulators import AZURITE_KEY
from helpers.models import is_weight

pytestmark = [pytest.mark.azure]


@pytest.mark.e2e
@pytest.mark.engine
@pytest.mark.s3
def test_ray_data_job_streams_from_az_with_settings_only_in_config(
    azurite, az_models, no_store_env, s3_server, work
):
    """A Ray Data job (driver, CPU stages, engine actor) on az://, the store set once in the
    config (the connection string with the account key, Azurite's certificate as ca_bundle):
    every row out, no weight file on disk, each shard read from Azurite and no other weight
    object, and the account key in no output or file of the job."""
    from helpers.jobs import run_isolated

    model = az_models["sharded"]
    shards = sorted(model.local.glob("*.safetensors"))
    before = len(azurite.reads())
    out, written, seconds = run_isolated(
        s3_server,  # unused: with object_store the job gets no S3 variable
        work,
        model.uri,
        "runai_streamer",
        ["hello world", "object store"],
        max_tokens=4,
        object_store={
            "azure_connection_string": azurite.connection_string,
            "azure_endpoint_suffix": azurite.reader_suffix,
            "ca_bundle": str(azurite.cert),
        },
    )
    assert len(out["rows"]) == 2 and all(r["num_generated_tokens"] == 4 for r in out["rows"])
    assert written == {}  # no weight file of any format on local disk
    assert out["shm_left"] == [], out["agent_logs"]
    reads = azurite.reads()[before:]
    weight_reads = [r for r in reads if is_weight(r.uri.rsplit("/", 1)[1])]
    # every weight object read is one of the model's shards (not the hub-mirror's weights
    # beside it in the container), each was read, and all by a Python client (path style):
    # the default path (weight_sharing="auto", one engine too), the node's pull with the
    # library's client, the engine streaming from the node's memory; the streamer's own
    # reader (https://<account>.<suffix>) read no weight
    assert {r.uri for r in weight_reads} == {model.uri + p.name for p in shards}
    assert {r.reader for r in weight_reads} == {"python"}, weight_reads
    # what Azurite served of each shard: the driver's preflight reading its header (8 bytes,
    # then the JSON header: two ranged GETs) and the pull reading every byte once
    for p in shards:
        header = 8 + int.from_bytes(p.read_bytes()[:8], "little")
        mine = [r for r in weight_reads if r.uri == model.uri + p.name]
        assert sum(r.bytes or 0 for r in mine) == header + p.stat().st_size, (p.name, mine)
    [report] = out["load_reports"]
    assert report["streamed"] is True and report["weight_sharing"] == "node", report
    assert report["pull_source"] == "store", report
    assert report["weight_bytes"] == report["pull_bytes"] == sum(p.stat().st_size for p in shards)
    assert report["weight_files"] == len(shards)
    # the account key: in the test's own input to the script (so the search below finds it
    # where it is), in no output of the job and no file it wrote (its log, out.json, Ray's
    # session logs)
    assert AZURITE_KEY.encode() in (work / "spec.json").read_bytes()
    leaks = [
        str(path)
        for path in sorted(work.rglob("*"))
        if path.is_file() and path.name != "spec.json" and AZURITE_KEY.encode() in _bytes(path)
    ]
    assert (work / "job.log").is_file() and (work / "out.json").is_file()
    assert leaks == [], leaks
    print(
        f"\naz:// job: {len(out['rows'])} rows in {seconds:.1f}s; Azurite served "
        f"{len(weight_reads)} weight reads, {sum(r.bytes or 0 for r in weight_reads)} bytes, "
        f"of {len(shards)} shards ({report['weight_bytes']} bytes)"
    )


def _bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:  # a socket, a file gone meanwhile
        return b""
