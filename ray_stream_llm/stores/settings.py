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

import contextlib
import dataclasses
import ipaddress
import os
import threading
from collections.abc import Iterator, Mapping
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

from ray_stream_llm.env import scoped
from ray_stream_llm.redact import redact
from ray_stream_llm.stores.registry import DEFAULT_TIMEOUT_S, TIMEOUT_ENV

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
        description="Seconds the driver's preflight, and each node's metadata fetch and shared "
        "pull, may spend on store calls in all (connect and read timeouts and retries inside "
        "it) before a StoreTimeoutError. The driver fails at the first unreachable call; the "
        "job's actors wait out a store that drops (retrying until the budget is spent), then "
        "raise StoreUnreachableError or StoreTimeoutError naming the endpoint. Unset: 30 s on "
        "the driver and 300 s in the job's actors (their calls run beside engines compiling "
        "on the node).",
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
    def _check_backends(self) -> ObjectStoreConfig:
        """Each store backend checks its own fields (``check_settings`` in its module)."""
        for backend in _backends():
            backend.check_settings(self)
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


# The variables a store client reads (the backends' derive_env, the streamer's, the budget)
STORE_VARIABLES = (
    "AWS_",
    "AZURE_",
    "GOOGLE_",
    "RUNAI_STREAMER_",
    "STORAGE_EMULATOR_HOST",
    "CLOUD_STORAGE_EMULATOR_ENDPOINT",
    "REQUESTS_CA_BUNDLE",
    TIMEOUT_ENV,
)
_APPLIED = threading.Lock()


def store_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The store's variables of ``environ`` (this process's environment by default): what
    a process that reads the store for another passes it, by value (secrets included:
    never logged, never written)."""
    environ = os.environ if environ is None else environ
    return {k: v for k, v in environ.items() if k.startswith(STORE_VARIABLES)}


@contextlib.contextmanager
def applied(env: Mapping[str, str]) -> Iterator[None]:
    """Within the block, this process's store variables are ``env``'s and no others (one
    block at a time in the process): for making a client on another process's behalf (the
    node agent's pull), the clients read them as they are made. Restored after."""
    with _APPLIED, scoped({**dict.fromkeys(store_env()), **store_env(env)}):
        yield


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


def _backends() -> list[Any]:
    """Every registered backend module (``stores.registry.BACKENDS``), imported: they import
    no client library at module level."""
    import importlib

    from ray_stream_llm.stores.registry import BACKENDS

    return [importlib.import_module(spec.module) for spec in BACKENDS.values()]


def derive_settings(store: ObjectStoreConfig | None) -> StoreSettings:
    """The variables every consumer reads, derived once from ``store``: each backend's
    (``derive_env`` in its module), then the streamer's tuning and the store budget.

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

    for backend in _backends():  # each backend's own variables
        backend.derive_env(store, put)
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
