"""ObjectStoreConfig validation and the settings derived from it (pure logic)."""

from __future__ import annotations

import os

import pytest
from pydantic import ValidationError

from ray_stream_llm.stores import s3
from ray_stream_llm.stores.settings import ObjectStoreConfig, derive_settings

SECRET = "s3cr3t-VALUE-9f8e7d"


def test_no_settings_derive_nothing():
    settings = derive_settings(None)
    assert settings.env == {} and settings.model_loader_extra_config == {}
    assert s3._session_kwargs(ObjectStoreConfig()) == {}


def test_s3_compatible_endpoint_derives_every_consumer():
    store = ObjectStoreConfig(
        endpoint_url="http://localhost:9000/",
        region_name="eu-west-1",
        aws_access_key_id="AKIDEXAMPLE",
        aws_secret_access_key=SECRET,
        streamer_concurrency=4,
        streamer_memory_limit=0,
        streamer_chunk_bytesize=8 * 1024 * 1024,
    )
    s = derive_settings(store)
    assert s.env == {
        # boto3 and the streamer
        "AWS_ENDPOINT_URL": "http://localhost:9000",
        # Ray's pyarrow path
        "AWS_ENDPOINT_URL_S3": "http://localhost:9000",
        "AWS_S3_ADDRESSING_STYLE": "path",
        # the streamer: path style, or 'File access error' against localhost
        "RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING": "0",
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_REGION": "eu-west-1",
        "AWS_DEFAULT_REGION": "eu-west-1",
        "AWS_ACCESS_KEY_ID": "AKIDEXAMPLE",
        "AWS_SECRET_ACCESS_KEY": SECRET,
        "RUNAI_STREAMER_CONCURRENCY": "4",
        "RUNAI_STREAMER_MEMORY_LIMIT": "0",
        "RUNAI_STREAMER_CHUNK_BYTESIZE": str(8 * 1024 * 1024),
    }
    assert s.secret_env == {"AWS_SECRET_ACCESS_KEY"}
    assert s.model_loader_extra_config == {"concurrency": 4, "memory_limit": 0}
    assert s3._session_kwargs(store) == {
        "aws_access_key_id": "AKIDEXAMPLE",
        "aws_secret_access_key": SECRET,
        "region_name": "eu-west-1",
    }
    client = s3.make_client(store)
    assert client.meta.endpoint_url == "http://localhost:9000"
    assert client.meta.config.s3 == {"addressing_style": "path"}
    assert SECRET not in repr(s) and SECRET not in repr(store) and SECRET not in str(store)
    assert SECRET not in store.model_dump_json()


@pytest.mark.parametrize(
    "endpoint, style",
    [
        ("http://127.0.0.1:8333", "path"),
        ("http://[::1]:8333", "path"),
        ("http://minio.local:9000", None),
        ("https://s3.example.com", None),
    ],
)
def test_auto_addressing(endpoint, style):
    assert ObjectStoreConfig(endpoint_url=endpoint).resolved_addressing_style() == style


def test_explicit_virtual_addressing():
    env = derive_settings(
        ObjectStoreConfig(endpoint_url="http://127.0.0.1:1", addressing_style="virtual")
    ).env
    assert env["RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING"] == "1"
    assert env["AWS_S3_ADDRESSING_STYLE"] == "virtual"


def test_anonymous_profile_gcs_azure():
    anon = derive_settings(ObjectStoreConfig(anonymous=True))
    assert anon.env == {
        "RUNAI_STREAMER_S3_UNSIGNED": "1",
        "RUNAI_STREAMER_GCS_USE_ANONYMOUS_CREDENTIALS": "1",
    }
    from botocore import UNSIGNED

    assert (
        s3.make_client(ObjectStoreConfig(anonymous=True)).meta.config.signature_version is UNSIGNED
    )
    prof = derive_settings(ObjectStoreConfig(profile_name="team"))
    assert prof.env == {"AWS_PROFILE": "team"}
    assert s3._session_kwargs(ObjectStoreConfig(profile_name="team")) == {"profile_name": "team"}
    gcs = derive_settings(ObjectStoreConfig(gcs_credentials_file="/etc/gcs.json"))
    assert gcs.env == {
        "RUNAI_STREAMER_GCS_CREDENTIAL_FILE": "/etc/gcs.json",
        "GOOGLE_APPLICATION_CREDENTIALS": "/etc/gcs.json",
    }
    az = derive_settings(ObjectStoreConfig(azure_account_name="acct", azure_account_key=SECRET))
    assert az.env == {"AZURE_STORAGE_ACCOUNT_NAME": "acct", "AZURE_STORAGE_ACCOUNT_KEY": SECRET}
    assert az.secret_env == {"AZURE_STORAGE_ACCOUNT_KEY"}
    conn = derive_settings(ObjectStoreConfig(azure_connection_string=SECRET))
    assert conn.secret_env == {"AZURE_STORAGE_CONNECTION_STRING"}


@pytest.mark.parametrize(
    "connection, suffix",
    [
        (
            "AccountName=acct;AccountKey={key};EndpointSuffix=core.chinacloudapi.cn",
            "blob.core.chinacloudapi.cn",
        ),
        (
            "AccountName=acct;AccountKey={key};BlobEndpoint=https://acct.blob.core.windows.net/",
            "blob.core.windows.net",
        ),
        (
            "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey={key}",
            "blob.core.windows.net",
        ),
    ],
)
def test_azure_connection_string_sets_the_streamer_reader(connection, suffix):
    """The streamer's Azure reader ignores AZURE_STORAGE_CONNECTION_STRING: account, key and
    endpoint suffix are derived from it, the key kept secret."""
    settings = derive_settings(
        ObjectStoreConfig(azure_connection_string=connection.format(key=SECRET))
    )
    assert settings.env["AZURE_STORAGE_ACCOUNT_NAME"] == "acct"
    assert settings.env["AZURE_STORAGE_ACCOUNT_KEY"] == SECRET
    assert settings.env["AZURE_STORAGE_ENDPOINT_SUFFIX"] == suffix
    assert settings.secret_env == {"AZURE_STORAGE_CONNECTION_STRING", "AZURE_STORAGE_ACCOUNT_KEY"}
    assert SECRET not in repr(settings)


def test_gcs_emulator_endpoint():
    """Both GCS clients of the streamer find the emulator (google-cloud-storage reads
    STORAGE_EMULATOR_HOST, google-cloud-cpp CLOUD_STORAGE_EMULATOR_ENDPOINT), and its listing
    sends no credentials (else it asks for Application Default Credentials)."""
    env = derive_settings(ObjectStoreConfig(gcs_emulator_endpoint="http://127.0.0.1:4443/")).env
    assert env == {
        "STORAGE_EMULATOR_HOST": "http://127.0.0.1:4443",
        "CLOUD_STORAGE_EMULATOR_ENDPOINT": "http://127.0.0.1:4443",
        "RUNAI_STREAMER_GCS_USE_ANONYMOUS_CREDENTIALS": "1",
    }


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"endpoint_url": "minio:9000"}, "http://host:port"),
        ({"endpoint_url": "http://minio:9000/bucket"}, "must not have a path"),
        ({"endpoint_url": "http://user:pw@minio:9000"}, "must not carry credentials"),
        ({"streamer_concurrency": 0}, "positive integer, got 0"),
        ({"streamer_memory_limit": -2}, ">= -1, got -2"),
        ({"streamer_chunk_bytesize": 1024}, "at least 5242880"),
        ({"aws_access_key_id": "AKID"}, "give both"),
        ({"aws_secret_access_key": SECRET}, "give both"),
        (
            {"profile_name": "p", "aws_access_key_id": "A", "aws_secret_access_key": SECRET},
            "either",
        ),
        (
            {"anonymous": True, "aws_access_key_id": "A", "aws_secret_access_key": SECRET},
            "unsigned",
        ),
        ({"azure_account_key": SECRET, "azure_connection_string": SECRET}, "either"),
        ({"gcs_emulator_endpoint": "127.0.0.1:4443"}, "gcs_emulator_endpoint must look like"),
        ({"gcs_emulator_endpoint": "http://h:1/b"}, "prefix in the model URI (gs://bucket"),
        (
            {"gcs_emulator_endpoint": "http://h:1", "gcs_credentials_file": "/k.json"},
            "carry no credentials",
        ),
        ({"anonymous": True, "gcs_credentials_file": "/k.json"}, "anonymous=True"),
        (
            {
                "azure_connection_string": f"AccountName=a;AccountKey={SECRET};"
                "BlobEndpoint=http://127.0.0.1:10000/a;"
            },
            "set azure_endpoint_suffix",
        ),
        (
            {
                "azure_connection_string": f"AccountName=a;AccountKey={SECRET}",
                "azure_account_name": "b",
            },
            "names account 'a'",
        ),
        ({"endpoint": "http://x"}, "Extra inputs are not permitted"),
    ],
)
def test_bad_settings_refused(kwargs, fragment):
    with pytest.raises(ValidationError) as err:
        ObjectStoreConfig(**kwargs)
    assert fragment in str(err.value)
    assert SECRET not in str(err.value)


def test_every_field_described():
    for name, field in ObjectStoreConfig.model_fields.items():
        assert field.description, name


def _config(**kwargs):
    from ray_stream_llm import StreamingvLLMEngineProcessorConfig

    kwargs.setdefault("engine_kwargs", {"load_format": "runai_streamer"})
    return StreamingvLLMEngineProcessorConfig(model_source="s3://models/m/", **kwargs)


def test_conflicting_runtime_env_refused_before_ray_starts():
    import ray

    from ray_stream_llm import build_llm_processor
    from ray_stream_llm.errors import SettingsConflictError

    config = _config(
        object_store=ObjectStoreConfig(
            endpoint_url="http://127.0.0.1:9000",
            aws_access_key_id="AKID",
            aws_secret_access_key=SECRET,
        ),
        runtime_env={
            "env_vars": {
                "AWS_ENDPOINT_URL": "http://other:9000",
                "AWS_SECRET_ACCESS_KEY": "another-secret",
            }
        },
    )
    with pytest.raises(SettingsConflictError) as err:
        build_llm_processor(config)
    message = str(err.value)
    assert "'AWS_ENDPOINT_URL'" in message and "http://other:9000" in message
    assert "http://127.0.0.1:9000" in message and "runtime_env" in message
    assert not ray.is_initialized()
    secret_conflict = _config(
        object_store=ObjectStoreConfig(aws_access_key_id="AKID", aws_secret_access_key=SECRET),
        runtime_env={"env_vars": {"AWS_SECRET_ACCESS_KEY": "another-secret"}},
    )
    with pytest.raises(SettingsConflictError) as err:
        build_llm_processor(secret_conflict)
    assert SECRET not in str(err.value) and "another-secret" not in str(err.value)


def test_settings_merged_into_stage_runtime_envs_and_engine():
    from ray_stream_llm.integrations.ray.builder import resource_defaults
    from ray_stream_llm.integrations.ray.runtime_env import deliver_env, store_updates

    config = _config(
        object_store=ObjectStoreConfig(
            endpoint_url="http://127.0.0.1:9000",
            streamer_concurrency=2,
            aws_access_key_id="AKID",
            aws_secret_access_key=SECRET,
        ),
        runtime_env={"env_vars": {"MY_VAR": "1", "AWS_ENDPOINT_URL": "http://127.0.0.1:9000"}},
        engine_kwargs={
            "load_format": "runai_streamer",
            "model_loader_extra_config": {"memory_limit": 0},
        },
    )
    settings = derive_settings(config.object_store)
    updates = store_updates(config, settings, resource_defaults(config))
    assert updates["engine_kwargs"]["model_loader_extra_config"] == {
        "memory_limit": 0,
        "concurrency": 2,
    }
    assert "runtime_env" not in updates  # the processor's goes to ray.init: left as the user set it
    kwargs = deliver_env(
        {"runtime_env": {"env_vars": {"TOK": "1"}}, "num_cpus": 0.25}, settings, "TokenizeStage"
    )
    env = kwargs["runtime_env"]["env_vars"]
    assert env["TOK"] == "1" and env["AWS_ENDPOINT_URL"] == "http://127.0.0.1:9000"
    assert (
        env["RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING"] == "0"
        and env["AWS_ACCESS_KEY_ID"] == "AKID"
    )
    assert "AWS_SECRET_ACCESS_KEY" not in env and SECRET not in repr(kwargs)
    assert kwargs["num_cpus"] == 0.25


def test_conflict_with_the_ray_jobs_runtime_env(monkeypatch):
    import json

    import ray

    from ray_stream_llm import build_llm_processor
    from ray_stream_llm.errors import SettingsConflictError

    monkeypatch.setenv(
        "RAY_JOB_CONFIG_JSON_ENV_VAR",
        json.dumps({"runtime_env": {"env_vars": {"AWS_REGION": "eu-west-1"}}}),
    )
    config = _config(object_store=ObjectStoreConfig(region_name="us-east-1"))
    with pytest.raises(SettingsConflictError) as err:
        build_llm_processor(config)
    assert "the Ray job's runtime_env" in str(err.value) and "eu-west-1" in str(err.value)
    assert not ray.is_initialized()


def test_applied_store_settings_are_the_given_ones_only_and_restored(monkeypatch):
    """What the node agent makes a client under: the asking actor's store variables and no
    other store variable of the agent's own (an earlier job's endpoint), then its own
    again; a variable of no store is left alone."""
    from ray_stream_llm.stores.settings import applied, store_env

    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://earlier-job:9000")
    monkeypatch.setenv("AWS_PROFILE", "earlier")
    monkeypatch.setenv("HOME_OF_SOMETHING_ELSE", "kept")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY", raising=False)
    asked = {"AWS_ENDPOINT_URL": "http://store:8333", "AWS_SECRET_ACCESS_KEY": "s3cr3t"}
    before = store_env()
    with applied({**asked, "PATH": "/not/a/store/variable"}):
        assert store_env() == asked
        assert os.environ["HOME_OF_SOMETHING_ELSE"] == "kept"
        assert os.environ["PATH"] != "/not/a/store/variable"
    assert store_env() == before and "AWS_SECRET_ACCESS_KEY" not in os.environ
