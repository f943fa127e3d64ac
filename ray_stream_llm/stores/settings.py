"""``ObjectStoreConfig``: one object-store setting for every process, and the variables it derives.

Each consumer reads its own variables: boto3 (listing and metadata here, and
Ray's downloader) reads the AWS chain; Ray's pyarrow path reads
``AWS_ENDPOINT_URL_S3`` and ``AWS_S3_ADDRESSING_STYLE``; the Run:ai streamer
reads ``AWS_ENDPOINT_URL``, ``RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING`` (virtual
by default, which fails against ``localhost``), ``RUNAI_STREAMER_*`` tuning and
its GCS and Azure variables; vLLM checks ``model_loader_extra_config``.
:func:`derive_settings` computes all of them from one config, once.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
from collections.abc import Mapping
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from ray_stream_llm.redact import redact
from ray_stream_llm.stores.azure_connection import azure_connection_parts, azure_reader_env
from ray_stream_llm.stores.base import DEFAULT_TIMEOUT_S, TIMEOUT_ENV

MIN_OBJECT_STORE_CHUNK = 5 * 1024 * 1024  # the streamer's minimum chunk for object stores


class ObjectStoreConfig(BaseModel):
    """Where the model lives and how to reach it. Every field is optional; unset
    fields leave the standard environment (``AWS_*``, profiles, instance roles) in charge."""

    # hide_input_in_errors: a validation error must not echo a secret back
    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)

    endpoint_url: str | None = Field(
        default=None,
        description="S3 API endpoint, e.g. 'http://minio:9000' for MinIO, SeaweedFS or Ceph, "
        "'https://storage.googleapis.com' for GCS with HMAC keys. None: AWS S3.",
    )
    region_name: str | None = Field(default=None, description="Region, e.g. 'us-east-1'.")
    addressing_style: Literal["auto", "path", "virtual"] = Field(
        default="auto",
        description="S3 addressing. 'auto': path style when the endpoint host is an IP "
        "address or localhost, the store's default otherwise.",
    )
    anonymous: bool = Field(
        default=False,
        description="Send unsigned requests (public buckets). No credentials allowed.",
    )
    ca_bundle: str | None = Field(
        default=None, description="Path to a PEM bundle to verify the endpoint's TLS certificate."
    )
    aws_access_key_id: str | None = Field(default=None, description="S3 access key id.")
    aws_secret_access_key: SecretStr | None = Field(
        default=None, description="S3 secret access key (kept secret: never printed)."
    )
    aws_session_token: SecretStr | None = Field(
        default=None, description="Temporary session token from STS (kept secret)."
    )
    profile_name: str | None = Field(
        default=None, description="Named profile from ~/.aws/config and ~/.aws/credentials."
    )
    gcs_credentials_file: str | None = Field(
        default=None, description="GCS service-account JSON file (for gs:// URIs)."
    )
    gcs_emulator_endpoint: str | None = Field(
        default=None,
        description="GCS emulator for gs:// URIs, e.g. 'http://127.0.0.1:4443' (fake-gcs-server): "
        "sets STORAGE_EMULATOR_HOST (listing) and CLOUD_STORAGE_EMULATOR_ENDPOINT (the streamer's "
        "reader); requests to it carry no credentials.",
    )
    azure_account_name: str | None = Field(
        default=None, description="Azure storage account name (for az:// URIs)."
    )
    azure_account_key: SecretStr | None = Field(
        default=None, description="Azure storage account key (kept secret)."
    )
    azure_connection_string: SecretStr | None = Field(
        default=None,
        description="Azure storage connection string (kept secret); its AccountName, AccountKey "
        "and blob endpoint also set the streamer's reader, which ignores connection strings.",
    )
    azure_endpoint_suffix: str | None = Field(
        default=None,
        description="Where the streamer's Azure reader finds the account: it requests "
        "https://<account>.<suffix> (AZURE_STORAGE_ENDPOINT_SUFFIX). Default "
        "'blob.core.windows.net' or what the connection string says; e.g. "
        "'blob.core.chinacloudapi.cn', or 'localhost:<port>' for Azurite over HTTPS.",
    )
    timeout_s: float = Field(
        default=DEFAULT_TIMEOUT_S,
        gt=0,
        le=3600,
        description="Seconds the driver's preflight, and each node's metadata fetch, may spend "
        "on store calls in all (connect and read timeouts and retries inside it) before a "
        "StoreTimeoutError.",
    )
    streamer_concurrency: int | None = Field(
        default=None,
        description="Run:ai streamer reader threads per engine (RUNAI_STREAMER_CONCURRENCY); "
        "a positive integer. Streamer default for object stores: 8.",
    )
    streamer_memory_limit: int | None = Field(
        default=None,
        description="Streamer CPU buffer in bytes (RUNAI_STREAMER_MEMORY_LIMIT): -1 unlimited, "
        "0 the largest tensor, or a positive size.",
    )
    streamer_chunk_bytesize: int | None = Field(
        default=None,
        description="Bytes each streamer thread reads at once (RUNAI_STREAMER_CHUNK_BYTESIZE); "
        f"at least {MIN_OBJECT_STORE_CHUNK} (5 MiB) for object stores.",
    )

    @field_validator("endpoint_url", "gcs_emulator_endpoint")
    @classmethod
    def _check_endpoint(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return None
        name = str(info.field_name)
        scheme = "gs" if name.startswith("gcs") else "s3"
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(
                f"{name} must look like 'http://host:port' or 'https://host', got {redact(value)!r}"
            )
        if parts.username or parts.password or parts.query:
            raise ValueError(
                f"{name} must not carry credentials or a query; give them in their own fields"
            )
        if parts.path not in ("", "/"):
            raise ValueError(
                f"{name} must not have a path (got {parts.path!r}); put the bucket and "
                f"prefix in the model URI ({scheme}://bucket/prefix/)"
            )
        return value.rstrip("/")

    @field_validator("streamer_concurrency")
    @classmethod
    def _check_concurrency(cls, value: int | None) -> int | None:
        if value is not None and (isinstance(value, bool) or value <= 0):
            raise ValueError(f"streamer_concurrency must be a positive integer, got {value!r}")
        return value

    @field_validator("streamer_memory_limit")
    @classmethod
    def _check_memory_limit(cls, value: int | None) -> int | None:
        if value is not None and (isinstance(value, bool) or value < -1):
            raise ValueError(f"streamer_memory_limit must be an integer >= -1, got {value!r}")
        return value

    @field_validator("streamer_chunk_bytesize")
    @classmethod
    def _check_chunk(cls, value: int | None) -> int | None:
        if value is not None and (isinstance(value, bool) or value < MIN_OBJECT_STORE_CHUNK):
            raise ValueError(
                f"streamer_chunk_bytesize must be at least {MIN_OBJECT_STORE_CHUNK} (5 MiB) "
                f"for object stores, got {value!r}"
            )
        return value

    @model_validator(mode="after")
    def _check_credentials(self) -> ObjectStoreConfig:
        explicit = self.aws_access_key_id is not None or self.aws_secret_access_key is not None
        if (self.aws_access_key_id is None) != (self.aws_secret_access_key is None):
            raise ValueError("give both aws_access_key_id and aws_secret_access_key, or neither")
        if self.aws_session_token is not None and not explicit:
            raise ValueError("aws_session_token needs aws_access_key_id and aws_secret_access_key")
        if self.profile_name is not None and explicit:
            raise ValueError(
                f"give either profile_name ({self.profile_name!r}) or explicit keys, not both"
            )
        if self.anonymous and (explicit or self.profile_name):
            raise ValueError("anonymous=True sends unsigned requests: remove the credentials")
        if self.gcs_credentials_file and (self.anonymous or self.gcs_emulator_endpoint):
            raise ValueError(
                "gcs_credentials_file cannot go with anonymous=True or gcs_emulator_endpoint "
                "(requests to an emulator carry no credentials): remove one"
            )
        if self.azure_connection_string is not None and self.azure_account_key is not None:
            raise ValueError("give either azure_connection_string or azure_account_key, not both")
        if self.azure_connection_string is not None:
            parts = azure_connection_parts(self.azure_connection_string.get_secret_value())
            named = parts.get("AccountName")
            if self.azure_account_name and named and named != self.azure_account_name:
                raise ValueError(
                    f"azure_account_name is {self.azure_account_name!r} but the connection "
                    f"string names account {named!r}: give one"
                )
            reader = azure_reader_env(self.azure_connection_string.get_secret_value())
            if "AZURE_STORAGE_ENDPOINT_SUFFIX" not in reader and not self.azure_endpoint_suffix:
                raise ValueError(
                    "the connection string's BlobEndpoint "
                    f"{redact(parts['BlobEndpoint'])!r} is not "
                    "https://<AccountName>.<suffix>, the only form the streamer's Azure reader "
                    "requests (it ignores connection strings); set azure_endpoint_suffix to where "
                    "https://<AccountName>.<suffix> reaches the same service (Azurite: start it "
                    "with --cert/--key and give 'localhost:<port>')"
                )
        return self

    def resolved_addressing_style(self) -> str | None:
        """'path' or 'virtual', or None to leave the store's default."""
        return s3_addressing_style(self.endpoint_url, self.addressing_style)


def s3_addressing_style(endpoint: str | None, style: str = "auto") -> str | None:
    """The S3 addressing rule, decided here only: ``style`` unless 'auto'; for 'auto' path
    style when the endpoint host is an IP address or localhost (virtual-host names cannot
    resolve there), else None (the store's default)."""
    if style != "auto":
        return style
    host = urlsplit(endpoint).hostname if endpoint else None
    return "path" if host and is_local_or_ip(host) else None


def setting(env: Mapping[str, str], name: str) -> str | None:
    """A derived setting, else the process environment's value, else None."""
    return env.get(name) or os.environ.get(name) or None


def is_local_or_ip(host: str) -> bool:
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


@dataclasses.dataclass(frozen=True)
class StoreSettings:
    """Everything derived from one :class:`ObjectStoreConfig`."""

    env: dict[str, str]  # for every process: boto3, Ray's downloader, the streamer
    secret_env: frozenset[str]  # the names in ``env`` whose values are secrets
    model_loader_extra_config: dict[str, Any]  # vLLM's runai loader allow-list

    def __repr__(self) -> str:  # never the secret values
        shown = {k: ("**********" if k in self.secret_env else v) for k, v in self.env.items()}
        extra = self.model_loader_extra_config
        return f"StoreSettings(env={shown}, model_loader_extra_config={extra})"


def derive_settings(store: ObjectStoreConfig | None) -> StoreSettings:
    """The variables every consumer reads, derived once from ``store``.

    With ``None`` nothing is set: the standard environment applies.
    """
    store = store or ObjectStoreConfig()
    env: dict[str, str] = {}
    secret: set[str] = set()

    def put(name: str, value: Any, *, is_secret: bool = False) -> None:
        if value is None:
            return
        env[name] = value.get_secret_value() if isinstance(value, SecretStr) else str(value)
        if is_secret:
            secret.add(name)

    if store.endpoint_url:
        put("AWS_ENDPOINT_URL", store.endpoint_url)  # boto3 >= 1.28 and the streamer
        put("AWS_ENDPOINT_URL_S3", store.endpoint_url)  # Ray's pyarrow path
        put("AWS_EC2_METADATA_DISABLED", "true")  # no IMDS probe against a custom store
    style = store.resolved_addressing_style()
    if style:
        put("RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING", "1" if style == "virtual" else "0")
        put("AWS_S3_ADDRESSING_STYLE", style)
    if store.region_name:
        put("AWS_REGION", store.region_name)
        put("AWS_DEFAULT_REGION", store.region_name)
    put("AWS_CA_BUNDLE", store.ca_bundle)
    put("AWS_ACCESS_KEY_ID", store.aws_access_key_id)
    put("AWS_SECRET_ACCESS_KEY", store.aws_secret_access_key, is_secret=True)
    put("AWS_SESSION_TOKEN", store.aws_session_token, is_secret=True)
    put("AWS_PROFILE", store.profile_name)
    if store.anonymous:
        put("RUNAI_STREAMER_S3_UNSIGNED", "1")
        put("RUNAI_STREAMER_GCS_USE_ANONYMOUS_CREDENTIALS", "1")
    put("RUNAI_STREAMER_GCS_CREDENTIAL_FILE", store.gcs_credentials_file)
    put("GOOGLE_APPLICATION_CREDENTIALS", store.gcs_credentials_file)
    if store.gcs_emulator_endpoint:
        put("STORAGE_EMULATOR_HOST", store.gcs_emulator_endpoint)  # google-cloud-storage
        put("CLOUD_STORAGE_EMULATOR_ENDPOINT", store.gcs_emulator_endpoint)  # google-cloud-cpp
        put("RUNAI_STREAMER_GCS_USE_ANONYMOUS_CREDENTIALS", "1")  # the streamer's listing
    put("AZURE_STORAGE_ACCOUNT_NAME", store.azure_account_name)
    put("AZURE_STORAGE_ACCOUNT_KEY", store.azure_account_key, is_secret=True)
    put("AZURE_STORAGE_CONNECTION_STRING", store.azure_connection_string, is_secret=True)
    if store.azure_connection_string is not None:
        reader = azure_reader_env(store.azure_connection_string.get_secret_value())
        for name, value in reader.items():
            put(
                name,
                value,
                is_secret=name in ("AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_SAS_TOKEN"),
            )
    put("AZURE_STORAGE_ENDPOINT_SUFFIX", store.azure_endpoint_suffix)
    put("RUNAI_STREAMER_CONCURRENCY", store.streamer_concurrency)
    put("RUNAI_STREAMER_MEMORY_LIMIT", store.streamer_memory_limit)
    put("RUNAI_STREAMER_CHUNK_BYTESIZE", store.streamer_chunk_bytesize)
    if "timeout_s" in store.model_fields_set:  # the actors' metadata fetch gets the same bound
        put(TIMEOUT_ENV, store.timeout_s)

    extra: dict[str, Any] = {}
    if store.streamer_concurrency is not None:
        extra["concurrency"] = store.streamer_concurrency
    if store.streamer_memory_limit is not None:
        extra["memory_limit"] = store.streamer_memory_limit

    return StoreSettings(
        env=env,
        secret_env=frozenset(secret),
        model_loader_extra_config=extra,
    )
