"""The S3 client used for listing and metadata, and its errors translated.

A fresh ``boto3.session.Session`` per call site: boto3's default session caches
the credentials it resolved first, so later settings would be ignored. With no
settings the standard AWS chain applies (``AWS_ENDPOINT_URL``, keys, region,
profile, instance metadata). Addressing follows
:func:`~ray_stream_llm.stores.settings.s3_addressing_style`, as the streamer will
address the store.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
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
from ray_stream_llm.stores.settings import ObjectStoreConfig, s3_addressing_style, setting
from ray_stream_llm.uri import ModelURI

_NOT_FOUND = {"NoSuchBucket", "NoSuchKey", "404", "NotFound"}
_DENIED = {"AccessDenied", "403", "Forbidden", "AllAccessDisabled", "AccountProblem"}
_BAD_KEY = {"InvalidAccessKeyId"}
_BAD_SECRET = {"SignatureDoesNotMatch"}
_CREDENTIALS_FIX = (
    "check aws_access_key_id / aws_secret_access_key (or profile_name) in ObjectStoreConfig, "
    "or AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (AWS_PROFILE) in the environment"
)


def _session_kwargs(store: ObjectStoreConfig) -> dict[str, str]:
    """boto3 session arguments for what ``store`` sets; the AWS chain supplies the rest."""
    kwargs: dict[str, str] = {}
    if store.aws_access_key_id is not None and store.aws_secret_access_key is not None:
        kwargs["aws_access_key_id"] = store.aws_access_key_id
        kwargs["aws_secret_access_key"] = store.aws_secret_access_key.get_secret_value()
    if store.aws_session_token is not None:
        kwargs["aws_session_token"] = store.aws_session_token.get_secret_value()
    if store.profile_name:
        kwargs["profile_name"] = store.profile_name
    if store.region_name:
        kwargs["region_name"] = store.region_name
    return kwargs


def make_client(
    store: ObjectStoreConfig | None = None,
    deadline: StoreDeadline | None = None,
    *,
    max_pool_connections: int = 10,
) -> Client:
    """A boto3 S3 client in a fresh session: from ``store`` where it sets something,
    from the standard environment for the rest; timeouts from ``deadline``, which every
    request then checks first. Without one: the timeouts of ``store.timeout_s``, and no
    budget over the client's calls (a long tool run's uploads, a benchmark)."""
    import boto3
    from botocore import UNSIGNED
    from botocore import exceptions as bexc
    from botocore.config import Config

    store = store or ObjectStoreConfig()
    budget = deadline or StoreDeadline(store.timeout_s)
    endpoint = (
        store.endpoint_url or setting({}, "AWS_ENDPOINT_URL_S3") or setting({}, "AWS_ENDPOINT_URL")
    )
    style = s3_addressing_style(endpoint, store.addressing_style)
    if style is None and setting({}, "RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING") == "0":
        style = "path"  # as the streamer will address the store
    options: dict[str, Any] = {}
    if style:
        options["s3"] = {"addressing_style": style}
    if store.anonymous:
        options["signature_version"] = UNSIGNED
    config = Config(
        connect_timeout=budget.connect_timeout,
        read_timeout=budget.read_timeout,
        # 3 attempts in all (botocore's max_attempts counts the retries), back-offs of 1-2 s
        retries={"max_attempts": 2, "mode": "standard"},
        max_pool_connections=max_pool_connections,
        **options,
    )
    try:
        session = boto3.session.Session(**_session_kwargs(store))
        client = session.client(
            "s3", endpoint_url=endpoint or None, config=config, verify=store.ca_bundle
        )
    except bexc.ProfileNotFound as exc:
        raise AccessDeniedError(
            f"AWS profile {exc.kwargs.get('profile')!r} is not in ~/.aws/config or "
            "~/.aws/credentials; set profile_name (AWS_PROFILE) to a profile that exists"
        ) from None
    except bexc.PartialCredentialsError as exc:
        raise AccessDeniedError(_partial(exc)) from None
    if deadline is not None:  # every request (each attempt, each page) first checks it
        client.meta.events.register("before-send.s3", _checked(deadline))
    return client


def _checked(deadline: StoreDeadline) -> Callable[..., None]:
    def before_send(request: Any, **_: Any) -> None:
        deadline.check_request(request.method, request.url)

    return before_send


def _partial(exc: BaseException) -> str:
    missing = getattr(exc, "kwargs", {}).get("cred_var", "a credential")
    return (
        f"partial AWS credentials: {missing} is missing (AWS_ACCESS_KEY_ID and "
        "AWS_SECRET_ACCESS_KEY go together); set both, or unset AWS_ACCESS_KEY_ID to use a "
        "profile or an instance role"
    )


def endpoint_of(client: Client) -> str:
    return redact(client.meta.endpoint_url)


def translate(exc: BaseException, uri: ModelURI, client: Client, what: str) -> RayStreamLLMError:
    """Turn a boto3/botocore exception into this library's typed error."""
    from botocore import exceptions as bexc

    endpoint = endpoint_of(client)
    where = f"{what} {str(uri)!r} at endpoint {endpoint!r}"
    if isinstance(exc, bexc.ClientError):
        code = str(exc.response.get("Error", {}).get("Code", ""))
        if code.isdigit():  # an HTTP status without an S3 error document
            return StoreUnreachableError(
                f"the endpoint answered HTTP {code} without an S3 error ({where}): it does not "
                "look like an S3 API endpoint; check endpoint_url / AWS_ENDPOINT_URL"
            )
        if code == "NoSuchBucket":
            return ModelNotFoundError(
                f"bucket {uri.bucket!r} does not exist ({where}); check the bucket name "
                "and the endpoint (AWS_ENDPOINT_URL)"
            )
        if code in _NOT_FOUND:
            return ModelNotFoundError(f"not found: {where}; check the path")
        if code in _BAD_KEY:
            return AccessDeniedError(
                f"the access key id is not known to the store ({where}); {_CREDENTIALS_FIX}"
            )
        if code in _BAD_SECRET:
            return AccessDeniedError(
                f"the secret key does not match the access key id ({where}); {_CREDENTIALS_FIX}"
            )
        if code in _DENIED:
            return AccessDeniedError(
                f"access denied ({where}); {_CREDENTIALS_FIX}, and check the bucket policy"
            )
        return StoreUnreachableError(
            f"the store answered {code or 'an unknown error'!s} ({where}); check that the "
            "endpoint is an S3 API endpoint (AWS_ENDPOINT_URL)"
        )
    if isinstance(exc, bexc.PartialCredentialsError):
        return AccessDeniedError(f"{_partial(exc)} ({where})")
    if isinstance(exc, bexc.NoCredentialsError):
        return AccessDeniedError(f"no credentials found for {where}; {_CREDENTIALS_FIX}")
    if isinstance(exc, (bexc.ReadTimeoutError, bexc.ConnectTimeoutError)):
        return timed_out(where)
    if isinstance(exc, (bexc.EndpointConnectionError, bexc.ConnectionClosedError)):
        return unreachable(where, "AWS_ENDPOINT_URL")
    if isinstance(exc, bexc.BotoCoreError):
        return StoreUnreachableError(f"{type(exc).__name__} for {where}: {redact(exc)}")
    return RayStreamLLMError(f"{type(exc).__name__} for {where}: {redact(exc)}")


def list_objects(client: Client, uri: ModelURI) -> Iterator[ObjectInfo]:
    """Every object under the model directory, recursively."""
    from botocore import exceptions as bexc

    try:
        paginator = client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=uri.bucket, Prefix=uri.prefix):
            for obj in page.get("Contents", ()):
                key = obj["Key"]
                if key.endswith("/"):  # a "folder" marker object
                    continue
                yield ObjectInfo(
                    path=uri.relative(key),
                    key=key,
                    size=int(obj["Size"]),
                    etag=str(obj.get("ETag", "")).strip('"'),
                )
    except (bexc.BotoCoreError, bexc.ClientError) as exc:
        raise translate(exc, uri, client, "listing") from None


def download(client: Client, uri: ModelURI, obj: ObjectInfo, dest: str) -> int:
    """Write the listed version of one object (``If-Match`` its ETag) to ``dest``; return
    the bytes written."""
    from botocore import exceptions as bexc

    kwargs: dict[str, str] = {"Bucket": uri.bucket, "Key": obj.key}
    if obj.etag:
        kwargs["IfMatch"] = f'"{obj.etag}"'
    written = 0
    try:
        body = client.get_object(**kwargs)["Body"]
        with open(dest, "wb") as f:
            for chunk in body.iter_chunks(1 << 20):
                f.write(chunk)
                written += len(chunk)
    except (bexc.BotoCoreError, bexc.ClientError) as exc:
        if isinstance(exc, bexc.ClientError) and _code(exc) in ("PreconditionFailed", "412"):
            raise changed(uri, obj.path, obj.etag) from None
        raise translate(exc, uri, client, f"reading {obj.path!r} of") from None
    return written


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
    with ``etag`` only from that version (``If-Match``)."""
    from botocore import exceptions as bexc

    kwargs: dict[str, str] = {"Bucket": uri.bucket, "Key": uri.key(path)}
    if start is not None:
        kwargs["Range"] = f"bytes={start}-{end}"
    if etag:
        kwargs["IfMatch"] = f'"{etag}"'
    try:
        data: bytes = client.get_object(**kwargs)["Body"].read()
    except (bexc.BotoCoreError, bexc.ClientError) as exc:
        if isinstance(exc, bexc.ClientError) and _code(exc) in ("PreconditionFailed", "412"):
            raise changed(uri, path, etag) from None
        raise translate(exc, uri, client, f"reading {path!r} of") from None
    return data


def write(client: Client, uri: ModelURI, path: str, source: str) -> None:
    """Upload the local file ``source`` as the object ``path`` under ``uri`` (what this
    library writes: the compile cache's artifacts)."""
    from botocore import exceptions as bexc

    try:
        client.upload_file(source, uri.bucket, uri.key(path))
    except (bexc.BotoCoreError, bexc.ClientError) as exc:
        raise translate(exc, uri, client, f"writing {path!r} under") from None
    except Exception as exc:  # boto3's transfer manager wraps the client's errors
        cause = exc.__cause__ or exc.__context__
        if isinstance(cause, (bexc.BotoCoreError, bexc.ClientError)):
            raise translate(cause, uri, client, f"writing {path!r} under") from None
        raise


def _code(exc: Any) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


# --- this backend's settings (ObjectStoreConfig's S3 fields) -----------------------------------
def check_settings(store: ObjectStoreConfig) -> None:
    """The S3 credentials: a key pair whole, a session token with it, a profile or keys,
    unsigned requests with neither."""
    explicit = store.aws_access_key_id is not None or store.aws_secret_access_key is not None
    if (store.aws_access_key_id is None) != (store.aws_secret_access_key is None):
        raise ValueError("give both aws_access_key_id and aws_secret_access_key, or neither")
    if store.aws_session_token is not None and not explicit:
        raise ValueError("aws_session_token needs aws_access_key_id and aws_secret_access_key")
    if store.profile_name is not None and explicit:
        raise ValueError(
            f"give either profile_name ({store.profile_name!r}) or explicit keys, not both"
        )
    if store.anonymous and (explicit or store.profile_name):
        raise ValueError("anonymous=True sends unsigned requests: remove the credentials")


def derive_env(store: ObjectStoreConfig, put: Put) -> None:
    """boto3's chain (here and Ray's downloader), Ray's pyarrow path
    (``AWS_ENDPOINT_URL_S3``, ``AWS_S3_ADDRESSING_STYLE``) and the streamer's S3 reader."""
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
