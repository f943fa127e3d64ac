"""Listing and metadata reads for ``az://container/path/`` URIs (azure-storage-blob), errors
translated.

Credentials are taken in the order of the streamer's own Azure listing, from the
derived settings over the process environment: ``AZURE_STORAGE_CONNECTION_STRING``,
else ``AZURE_STORAGE_ACCOUNT_NAME`` with ``AZURE_STORAGE_SAS_TOKEN`` or
``AZURE_STORAGE_ACCOUNT_KEY``, else the account with ``DefaultAzureCredential``
(managed identity, workload identity, Azure CLI). The account URL is
``https://<account>.<AZURE_STORAGE_ENDPOINT_SUFFIX or blob.core.windows.net>``, the one
the streamer's C++ reader requests.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ray_stream_llm.errors import (
    AccessDeniedError,
    ModelNotFoundError,
    RayStreamLLMError,
    StoreUnreachableError,
)
from ray_stream_llm.redact import redact
from ray_stream_llm.stores.azure_connection import (
    AZURE_BLOB_SUFFIX,
    azure_connection_parts,
    azure_reader_env,
)
from ray_stream_llm.stores.base import (
    Client,
    ObjectInfo,
    Put,
    StoreDeadline,
    changed,
    timed_out,
    unreachable,
)
from ray_stream_llm.stores.settings import ObjectStoreConfig, derive_settings, setting
from ray_stream_llm.uri import ModelURI

# the CA bundle requests (under azure-storage-blob: the streamer's listing, this module's
# client) reads; derive_env delivers ObjectStoreConfig.ca_bundle in it to the actors
CA_ENV = "REQUESTS_CA_BUNDLE"

_CREDENTIALS_FIX = (
    "check azure_account_name with azure_account_key, or azure_connection_string, in "
    "ObjectStoreConfig (or AZURE_STORAGE_* in the environment), or the identity "
    "DefaultAzureCredential finds; it needs the Storage Blob Data Reader role"
)


def make_client(
    store: ObjectStoreConfig | None = None,
    deadline: StoreDeadline | None = None,
    *,
    max_pool_connections: int = 10,
) -> Client:
    """An ``azure.storage.blob.BlobServiceClient``: from ``store`` where it sets something,
    from the environment for the rest; timeouts from ``deadline``, which every request then
    checks first (without one: the timeouts of ``store.timeout_s``, and no budget)."""
    from azure.storage.blob import BlobServiceClient, ExponentialRetry

    env = derive_settings(store).env
    budget = deadline or StoreDeadline(store.timeout_s if store is not None else None)
    options: dict[str, Any] = {
        "connection_timeout": budget.connect_timeout,
        "read_timeout": budget.read_timeout,
        # the default waits 15 s or more before each retry of a refused connection; ~5 s in all
        "retry_policy": ExponentialRetry(
            initial_backoff=0.5, increment_base=1.5, retry_total=2, random_jitter_range=0
        ),
    }
    if deadline is not None:  # run before each request sent (each attempt, page, chunk)
        options["raw_request_hook"] = lambda request: deadline.check_request(
            request.http_request.method, request.http_request.url
        )
    # the config's CA, or in an actor (no config: its derived variables in the environment)
    # the one derive_env delivered: the stages' metadata fetch and the node's pull need it
    if ca := (store.ca_bundle if store is not None else None) or setting(env, CA_ENV):
        options["connection_verify"] = ca
    if max_pool_connections > 10:  # requests keeps 10 connections per host by default
        import requests
        from azure.core.pipeline.transport import RequestsTransport
        from requests.adapters import HTTPAdapter

        session = requests.Session()
        pool = HTTPAdapter(pool_connections=max_pool_connections, pool_maxsize=max_pool_connections)
        for prefix in ("https://", "http://"):
            session.mount(prefix, pool)
        transport = {k: options[k] for k in ("connection_timeout", "read_timeout")}
        if "connection_verify" in options:
            transport["connection_verify"] = options["connection_verify"]
        options["transport"] = RequestsTransport(session=session, session_owner=True, **transport)
    if connection := setting(env, "AZURE_STORAGE_CONNECTION_STRING"):
        try:
            return BlobServiceClient.from_connection_string(connection, **options)
        except ValueError:
            raise AccessDeniedError(
                "the Azure connection string is malformed (no AccountName or endpoint); "
                "copy it again from the storage account's access keys"
            ) from None
    account = setting(env, "AZURE_STORAGE_ACCOUNT_NAME")
    if not account:
        raise AccessDeniedError(f"no Azure storage account given; {_CREDENTIALS_FIX}")
    url = f"https://{account}.{setting(env, 'AZURE_STORAGE_ENDPOINT_SUFFIX') or AZURE_BLOB_SUFFIX}"
    if sas := setting(env, "AZURE_STORAGE_SAS_TOKEN"):
        credential: Any = sas.lstrip("?")
    elif key := setting(env, "AZURE_STORAGE_ACCOUNT_KEY"):
        credential = {"account_name": account, "account_key": key}
    else:
        from azure.identity import DefaultAzureCredential

        credential = DefaultAzureCredential()
    return BlobServiceClient(account_url=url, credential=credential, **options)


def endpoint_of(client: Client) -> str:
    return redact(str(client.url).rstrip("/"))


def translate(exc: BaseException, uri: ModelURI, client: Client, what: str) -> RayStreamLLMError:
    """Turn an azure-core / azure-identity exception into this library's typed error."""
    from azure.core import exceptions as aexc

    where = f"{what} {str(uri)!r} at endpoint {endpoint_of(client)!r}"
    code = str(getattr(exc, "error_code", "") or "")
    status = getattr(getattr(exc, "response", None), "status_code", None)
    if isinstance(exc, aexc.ResourceNotFoundError) or status == 404:
        if code == "ContainerNotFound":
            return ModelNotFoundError(
                f"container {uri.bucket!r} does not exist ({where}); check the container name "
                "and the storage account"
            )
        return ModelNotFoundError(f"not found ({code or 'HTTP 404'}): {where}; check the path")
    if isinstance(exc, aexc.ClientAuthenticationError) or status in (401, 403):
        return AccessDeniedError(
            f"access denied ({code or type(exc).__name__}, {where}); {_CREDENTIALS_FIX}"
        )
    if isinstance(exc, (aexc.ServiceRequestTimeoutError, aexc.ServiceResponseTimeoutError)):
        return timed_out(where)
    if isinstance(exc, (aexc.ServiceRequestError, aexc.ServiceResponseError)):
        return unreachable(where, "the account and the endpoint (connection string BlobEndpoint)")
    if isinstance(exc, aexc.HttpResponseError):
        return StoreUnreachableError(
            f"the store answered HTTP {status} {code} ({where}); check that the endpoint is "
            "an Azure Blob Storage endpoint"
        )
    return RayStreamLLMError(f"{type(exc).__name__} for {where}: {redact(exc)}")


def _is_folder(blob: Any) -> bool:
    """A "folder": a name ending in '/' or an ADLS directory stub (as the streamer skips)."""
    metadata = {k.lower(): v for k, v in (blob.metadata or {}).items()}
    return blob.name.endswith("/") or (blob.size == 0 and metadata.get("hdi_isfolder") == "true")


def list_objects(client: Client, uri: ModelURI) -> Iterator[ObjectInfo]:
    """Every blob under the model directory, recursively."""
    from azure.core.exceptions import AzureError

    try:
        container = client.get_container_client(uri.bucket)
        for blob in container.list_blobs(name_starts_with=uri.prefix, include=["metadata"]):
            if _is_folder(blob):
                continue
            yield ObjectInfo(
                path=uri.relative(blob.name),
                key=blob.name,
                size=int(blob.size),
                etag=str(blob.etag or "").strip('"'),
            )
    except AzureError as exc:
        raise translate(exc, uri, client, "listing") from None


def _pinned(etag: str | None) -> dict[str, Any]:
    """The condition that reads only the version ``etag`` names (``If-Match``)."""
    from azure.core import MatchConditions

    return {"etag": f'"{etag}"', "match_condition": MatchConditions.IfNotModified} if etag else {}


def download(client: Client, uri: ModelURI, obj: ObjectInfo, dest: str) -> int:
    """Write the listed version of one blob (``If-Match`` its ETag) to ``dest``; return the
    bytes written."""
    from azure.core.exceptions import AzureError, ResourceModifiedError

    try:
        blob = client.get_blob_client(uri.bucket, obj.key)
        with open(dest, "wb") as f:
            return int(blob.download_blob(**_pinned(obj.etag)).readinto(f))
    except ResourceModifiedError:
        raise changed(uri, obj.path, obj.etag) from None
    except AzureError as exc:
        raise translate(exc, uri, client, f"reading {obj.path!r} of") from None


def read(
    client: Client,
    uri: ModelURI,
    path: str,
    start: int | None = None,
    end: int | None = None,
    *,
    etag: str | None = None,
) -> bytes:
    """The blob ``path`` of the model directory, or its bytes ``start``..``end`` inclusive;
    with ``etag`` only from that version (``If-Match``)."""
    from azure.core.exceptions import AzureError, ResourceModifiedError

    options: dict[str, Any] = (
        {} if start is None else {"offset": start, "length": (end or start) - start + 1}
    )
    options.update(_pinned(etag))
    try:
        blob = client.get_blob_client(uri.bucket, uri.key(path))
        data: bytes = blob.download_blob(**options).readall()
        return data
    except ResourceModifiedError:
        raise changed(uri, path, etag) from None
    except AzureError as exc:
        raise translate(exc, uri, client, f"reading {path!r} of") from None


def write(client: Client, uri: ModelURI, path: str, source: str) -> None:
    """Upload the local file ``source`` as the blob ``path`` under ``uri`` (what this
    library writes: the compile cache's artifacts)."""
    from azure.core.exceptions import AzureError

    try:
        with open(source, "rb") as f:
            client.get_blob_client(uri.bucket, uri.key(path)).upload_blob(f, overwrite=True)
    except AzureError as exc:
        raise translate(exc, uri, client, f"writing {path!r} under") from None


# --- this backend's settings (ObjectStoreConfig's Azure fields) --------------------------------
def check_settings(store: ObjectStoreConfig) -> None:
    """A connection string or an account key; the account it names agrees; its endpoint has
    the one form the streamer's reader requests, or a suffix says where that is."""
    if store.azure_connection_string is not None and store.azure_account_key is not None:
        raise ValueError("give either azure_connection_string or azure_account_key, not both")
    if store.azure_connection_string is None:
        return
    parts = azure_connection_parts(store.azure_connection_string.get_secret_value())
    named = parts.get("AccountName")
    if store.azure_account_name and named and named != store.azure_account_name:
        raise ValueError(
            f"azure_account_name is {store.azure_account_name!r} but the connection "
            f"string names account {named!r}: give one"
        )
    reader = azure_reader_env(store.azure_connection_string.get_secret_value())
    if "AZURE_STORAGE_ENDPOINT_SUFFIX" not in reader and not store.azure_endpoint_suffix:
        raise ValueError(
            "the connection string's BlobEndpoint "
            f"{redact(parts['BlobEndpoint'])!r} is not "
            "https://<AccountName>.<suffix>, the only form the streamer's Azure reader "
            "requests (it ignores connection strings); set azure_endpoint_suffix to where "
            "https://<AccountName>.<suffix> reaches the same service (Azurite: start it "
            "with --cert/--key and give 'localhost:<port>')"
        )


def derive_env(store: ObjectStoreConfig, put: Put) -> None:
    """azure-storage-blob's (the listing here) and the streamer's Azure reader's variables
    (it reads no connection string: its parts are given one by one)."""
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
    if store.ca_bundle and (
        store.azure_connection_string or store.azure_account_name or store.azure_account_key
    ):  # an Azure store's CA: for this library's client and the streamer's Python listing
        put(CA_ENV, store.ca_bundle)
