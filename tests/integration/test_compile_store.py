"""The compile artifacts on the real S3 server (issue 20;
integrations/vllm/compile_store.py): one shipped is fetched whole and never replaced, a
damaged one is named and not used, one made for another CPU is never unpacked."""

from __future__ import annotations

import pytest
from helpers import compile_store


# --- the store's half, against the real S3 server (no engine; GCS and Azure: test_gcs.py,
# test_azure.py) ----------------------------------------------------------------------------
@pytest.mark.s3
def test_an_artifact_shipped_is_fetched_whole_and_never_replaced(s3_env, s3_server, tmp_path):
    s3_server.create_bucket("compile-cache")
    compile_store.shipped_is_fetched_whole_and_never_replaced(
        compile_store.unique("s3://compile-cache/"), None, tmp_path
    )


@pytest.mark.s3
def test_a_damaged_artifact_is_named_and_not_used(s3_env, s3_server, tmp_path, caplog):
    s3_server.create_bucket("compile-cache")
    compile_store.damaged_is_named_and_not_used(
        compile_store.unique("s3://compile-cache/"), None, tmp_path, caplog
    )


@pytest.mark.s3
def test_an_artifact_for_another_cpu_is_never_unpacked_and_the_fetch_says_why(
    s3_env, s3_server, tmp_path, caplog
):
    s3_server.create_bucket("compile-cache")
    compile_store.other_target_is_never_unpacked(
        compile_store.unique("s3://compile-cache/"), None, tmp_path, caplog
    )
