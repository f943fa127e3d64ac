"""Listing and metadata reads for ``gs://`` URIs (google-cloud-storage), errors translated.

Credentials are resolved the way the streamer's own GCS listing resolves them, from
the derived settings over the process environment:
``RUNAI_STREAMER_GCS_USE_ANONYMOUS_CREDENTIALS`` (unsigned requests), else
``RUNAI_STREAMER_GCS_CREDENTIAL_FILE`` (a service-account JSON file), else
Application Default Credentials. ``STORAGE_EMULATOR_HOST`` points the client at an
emulator (``gcs_emulator_endpoint`` sets it, with ``CLOUD_STORAGE_EMULATOR_ENDPOINT``
for the streamer's C++ reader).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

from ray_stream_llm.errors import (
    AccessDeniedError,
    ModelNotFoundError,
    RayStreamLLMError,
    StoreUnreachableError,
)
from ray_stream_llm.redact import redact
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

_DEFAULT_ENDPOINT = "https://storage.googleapis.com"
# per attempt: connect, read (seconds); the client's adapter sends each request with its
# StoreDeadline's instead (the same from a budget of 30 s up), and checks that budget first
_TIMEOUT = (5, 10)
_SCOPES = ["https://www.googleapis.com/auth/devstorage.read_only"]
_CREDENTIALS_FIX = (
    "set gcs_credentials_file in ObjectStoreConfig (or RUNAI_STREAMER_GCS_CREDENTIAL_FILE) to a "
    "service-account JSON file whose account may list and read the bucket, or anonymous=True "
    "for a public bucket"
)


def _retry() -> Any:
    """google-cloud-storage's retry, bounded to a few seconds (its default keeps trying a
    closed port for two minutes)."""
    from google.cloud.storage.retry import DEFAULT_RETRY

    return DEFAULT_RETRY.with_delay(initial=0.25, maximum=2.0, multiplier=2.0).with_timeout(5.0)


def make_client(
    store: ObjectStoreConfig | None = None,
    deadline: StoreDeadline | None = None,
    *,
    max_pool_connections: int = 10,
) -> Client:
    """A ``google.cloud.storage.Client``: from ``store`` where it sets something, from the
    environment for the rest; timeouts from ``deadline``, which every request then checks
    first (without one: the timeouts of ``store.timeout_s``, and no budget)."""
    import google.auth
    from google.auth import exceptions as aexc
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    env = derive_settings(store).env
    endpoint = setting(env, "STORAGE_EMULATOR_HOST")
    anonymous = (setting(env, "RUNAI_STREAMER_GCS_USE_ANONYMOUS_CREDENTIALS") or "").lower()
    keyfile = setting(env, "RUNAI_STREAMER_GCS_CREDENTIAL_FILE")
    where = f"endpoint {endpoint or _DEFAULT_ENDPOINT!r}"
    try:
        if anonymous in ("1", "true"):
            credentials, project = AnonymousCredentials(), None
        elif keyfile:  # any type the streamer's own listing accepts (it calls the same)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                credentials, project = google.auth.load_credentials_from_file(
                    keyfile, scopes=_SCOPES
                )
        else:
            credentials, project = google.auth.default(scopes=_SCOPES)
    except aexc.DefaultCredentialsError as exc:
        source = (
            f"the credentials file {keyfile!r}" if keyfile else ("Application Default Credentials")
        )
        raise AccessDeniedError(
            f"no usable Google credentials for {where} ({source}: {exc}); {_CREDENTIALS_FIX}"
        ) from None
    options = {"api_endpoint": endpoint} if endpoint else None
    # "<none>": listing and reading objects need no project (as Client.create_anonymous_client)
    client = storage.Client(
        project=project or "<none>", credentials=credentials, client_options=options
    )
    # requests keeps 10 connections per host by default
    pool = max(10, max_pool_connections)
    adapter = _deadline_adapter(deadline, store, pool)
    for prefix in ("https://", "http://"):
        client._http.mount(prefix, adapter)
    return client


def _deadline_adapter(
    deadline: StoreDeadline | None, store: ObjectStoreConfig | None, pool: int
) -> Any:
    """A requests adapter that checks ``deadline`` before each request it sends (each
    attempt of a call, each page of a listing) and bounds each by the deadline's connect
    and read timeouts (without a deadline: those of ``store.timeout_s``, and no check)."""
    from requests.adapters import HTTPAdapter

    budget = deadline or StoreDeadline(store.timeout_s if store is not None else None)

    class DeadlineAdapter(HTTPAdapter):
        def send(self, request: Any, *args: Any, **kwargs: Any) -> Any:
            if deadline is not None:
                deadline.check_request(str(request.method), str(request.url))
            kwargs["timeout"] = (budget.connect_timeout, budget.read_timeout)
            return super().send(request, *args, **kwargs)

    return DeadlineAdapter(pool_connections=pool, pool_maxsize=pool)


def endpoint_of(client: Client) -> str:
    return redact(client.api_endpoint or _DEFAULT_ENDPOINT)


def translate(exc: BaseException, uri: ModelURI, client: Client, what: str) -> RayStreamLLMError:
    """Turn a google-cloud-storage / google-auth / requests exception into a typed error."""
    import requests
    from google.api_core import exceptions as gexc
    from google.auth import exceptions as aexc
    from google.cloud.storage.exceptions import DataCorruption

    where = f"{what} {str(uri)!r} at endpoint {endpoint_of(client)!r}"
    if isinstance(exc, gexc.RetryError) and exc.cause is not None:
        return translate(exc.cause, uri, client, what)
    if isinstance(exc, gexc.NotFound):
        if what == "listing":  # a prefix without objects lists empty; a 404 is the bucket
            return ModelNotFoundError(
                f"bucket {uri.bucket!r} does not exist ({where}); check the bucket name "
                "and the endpoint (gcs_emulator_endpoint / STORAGE_EMULATOR_HOST)"
            )
        return ModelNotFoundError(f"not found: {where}; check the path")
    if isinstance(
        exc, (gexc.Forbidden, gexc.Unauthorized, aexc.RefreshError, aexc.DefaultCredentialsError)
    ):
        return AccessDeniedError(f"access denied ({where}): {exc}; {_CREDENTIALS_FIX}")
    if isinstance(exc, (requests.Timeout, gexc.DeadlineExceeded)):
        return timed_out(where)
    if isinstance(exc, requests.ConnectionError):
        return unreachable(where, "gcs_emulator_endpoint (STORAGE_EMULATOR_HOST)")
    if isinstance(exc, DataCorruption):
        return StoreUnreachableError(
            f"checksum mismatch ({where}): the object changed or the connection was cut, retry"
        )
    if isinstance(exc, gexc.GoogleAPICallError):
        return StoreUnreachableError(
            f"the store answered HTTP {exc.code} ({where}): {exc.message}; check that the "
            "endpoint is a GCS JSON API endpoint"
        )
    return RayStreamLLMError(f"{type(exc).__name__} for {where}: {redact(exc)}")


def _errors() -> tuple[type[BaseException], ...]:
    import requests
    from google.api_core import exceptions as gexc
    from google.auth import exceptions as aexc
    from google.cloud.storage.exceptions import DataCorruption

    return (gexc.GoogleAPIError, aexc.GoogleAuthError, requests.RequestException, DataCorruption)


def list_objects(client: Client, uri: ModelURI) -> Iterator[ObjectInfo]:
    """Every object under the model directory, recursively."""
    try:
        for blob in client.list_blobs(
            uri.bucket, prefix=uri.prefix, retry=_retry(), timeout=_TIMEOUT
        ):
            if blob.name.endswith("/"):  # a "folder" placeholder object
                continue
            yield ObjectInfo(
                path=uri.relative(blob.name),
                key=blob.name,
                size=int(blob.size),
                etag=str(blob.etag or blob.generation or ""),
            )
    except _errors() as exc:
        raise translate(exc, uri, client, "listing") from None


def _pinned(etag: str | None) -> dict[str, Any]:
    """The precondition that reads only the version ``etag`` names (the listing's ETag, or
    its generation where it gave none)."""
    if not etag:
        return {}
    return {"if_generation_match": int(etag)} if etag.isdigit() else {"if_etag_match": etag}


def download(client: Client, uri: ModelURI, obj: ObjectInfo, dest: str) -> int:
    """Write the listed version of one object (pinned to its ETag) to ``dest``, checksum
    verified by the client; return the bytes written."""
    from google.api_core import exceptions as gexc

    try:
        with open(dest, "wb") as f:
            client.bucket(uri.bucket).blob(obj.key).download_to_file(
                f, retry=_retry(), timeout=_TIMEOUT, **_pinned(obj.etag)
            )
            return f.tell()
    except gexc.PreconditionFailed:
        raise changed(uri, obj.path, obj.etag) from None
    except _errors() as exc:
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
    """The object ``path`` of the model directory, or its bytes ``start``..``end`` inclusive;
    with ``etag`` (the listing's ETag, or its generation where it gave none) only from that
    version."""
    from google.api_core import exceptions as gexc

    blob = client.bucket(uri.bucket).blob(uri.key(path))
    try:
        data: bytes = blob.download_as_bytes(
            start=start, end=end, retry=_retry(), timeout=_TIMEOUT, **_pinned(etag)
        )
    except gexc.PreconditionFailed:
        raise changed(uri, path, etag) from None
    except _errors() as exc:
        raise translate(exc, uri, client, f"reading {path!r} of") from None
    return data


def write(client: Client, uri: ModelURI, path: str, source: str) -> None:
    """Upload the local file ``source`` as the object ``path`` under ``uri`` (what this
    library writes: the compile cache's artifacts)."""
    try:
        client.bucket(uri.bucket).blob(uri.key(path)).upload_from_filename(
            source, retry=_retry(), timeout=_TIMEOUT
        )
    except _errors() as exc:
        raise translate(exc, uri, client, f"writing {path!r} under") from None


# --- this backend's settings (ObjectStoreConfig's GCS fields) ----------------------------------
def check_settings(store: ObjectStoreConfig) -> None:
    """A credentials file goes with neither unsigned requests nor an emulator."""
    if store.gcs_credentials_file and (store.anonymous or store.gcs_emulator_endpoint):
        raise ValueError(
            "gcs_credentials_file cannot go with anonymous=True or gcs_emulator_endpoint "
            "(requests to an emulator carry no credentials): remove one"
        )


def derive_env(store: ObjectStoreConfig, put: Put) -> None:
    """google-cloud-storage's (the listing here) and the streamer's GCS reader's variables."""
    if store.anonymous:
        put("RUNAI_STREAMER_GCS_USE_ANONYMOUS_CREDENTIALS", "1")
    put("RUNAI_STREAMER_GCS_CREDENTIAL_FILE", store.gcs_credentials_file)
    put("GOOGLE_APPLICATION_CREDENTIALS", store.gcs_credentials_file)
    if store.gcs_emulator_endpoint:
        put("STORAGE_EMULATOR_HOST", store.gcs_emulator_endpoint)  # google-cloud-storage
        put("CLOUD_STORAGE_EMULATOR_ENDPOINT", store.gcs_emulator_endpoint)  # google-cloud-cpp
        put("RUNAI_STREAMER_GCS_USE_ANONYMOUS_CREDENTIALS", "1")  # the streamer's listing
