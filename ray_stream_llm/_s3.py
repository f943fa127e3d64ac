"""The S3 client used for listing and metadata, and its errors translated.

A fresh ``boto3.session.Session`` per call site: boto3's default session caches
the credentials it resolved first, so later settings would be ignored. With no
settings the standard AWS chain applies (``AWS_ENDPOINT_URL``, keys, region,
profile, instance metadata). Addressing follows what the streamer does:
path style when ``RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING=0`` or when the
endpoint host is an IP address or ``localhost``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

from ray_stream_llm._backends import ObjectInfo, timed_out, unreachable
from ray_stream_llm.errors import (
    AccessDeniedError,
    ModelNotFoundError,
    RayStreamLLMError,
    StoreUnreachableError,
)
from ray_stream_llm.store import ObjectStoreConfig, derive_settings, is_local_or_ip
from ray_stream_llm.uri import ModelURI

__all__ = ["ObjectInfo", "download", "endpoint_of", "list_objects", "make_client", "read",
           "translate"]

_NOT_FOUND = {"NoSuchBucket", "NoSuchKey", "404", "NotFound"}
_DENIED = {"AccessDenied", "403", "Forbidden", "AllAccessDisabled", "AccountProblem"}
_BAD_KEY = {"InvalidAccessKeyId"}
_BAD_SECRET = {"SignatureDoesNotMatch"}
_CREDENTIALS_FIX = (
    "check aws_access_key_id / aws_secret_access_key (or profile_name) in ObjectStoreConfig, "
    "or AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (AWS_PROFILE) in the environment"
)


def _path_style(endpoint: str | None) -> bool:
    """Path style as the streamer would address the store: set to path, or IP/localhost."""
    if os.environ.get("RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING") == "0":
        return True
    host = urlsplit(endpoint).hostname if endpoint else None
    return bool(host) and is_local_or_ip(host)


def make_client(store: ObjectStoreConfig | None = None, *, max_pool_connections: int = 10) -> Any:
    """A boto3 S3 client in a fresh session: from ``store`` where it sets something,
    from the standard environment for the rest."""
    import boto3
    from botocore import UNSIGNED
    from botocore.config import Config

    settings = derive_settings(store)
    endpoint = (
        settings.boto3_client.get("endpoint_url")
        or os.environ.get("AWS_ENDPOINT_URL_S3")
        or os.environ.get("AWS_ENDPOINT_URL")
    )
    options = dict(settings.boto3_client.get("config", {}))
    if options.get("signature_version") == "unsigned":
        options["signature_version"] = UNSIGNED
    if "s3" not in options and _path_style(endpoint):
        options["s3"] = {"addressing_style": "path"}
    config = Config(
        connect_timeout=10,
        read_timeout=60,
        retries={"max_attempts": 3, "mode": "standard"},
        max_pool_connections=max_pool_connections,
        **options,
    )
    session = boto3.session.Session(**settings.boto3_session)
    return session.client(
        "s3",
        endpoint_url=endpoint or None,
        config=config,
        verify=settings.boto3_client.get("verify"),
    )


def endpoint_of(client: Any) -> str:
    return str(client.meta.endpoint_url)


def translate(exc: BaseException, uri: ModelURI, client: Any, what: str) -> RayStreamLLMError:
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
    if isinstance(exc, bexc.NoCredentialsError):
        return AccessDeniedError(f"no credentials found for {where}; {_CREDENTIALS_FIX}")
    if isinstance(exc, (bexc.ReadTimeoutError, bexc.ConnectTimeoutError)):
        return timed_out(where)
    if isinstance(exc, (bexc.EndpointConnectionError, bexc.ConnectionClosedError)):
        return unreachable(where, "AWS_ENDPOINT_URL")
    if isinstance(exc, bexc.BotoCoreError):
        return StoreUnreachableError(f"{type(exc).__name__} for {where}: {exc}")
    return RayStreamLLMError(f"{type(exc).__name__} for {where}: {exc}")


def list_objects(client: Any, uri: ModelURI) -> Iterator[ObjectInfo]:
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


def download(client: Any, uri: ModelURI, obj: ObjectInfo, dest: str) -> int:
    """Write one object to ``dest``; return the bytes written."""
    from botocore import exceptions as bexc

    written = 0
    try:
        body = client.get_object(Bucket=uri.bucket, Key=obj.key)["Body"]
        with open(dest, "wb") as f:
            for chunk in body.iter_chunks(1 << 20):
                f.write(chunk)
                written += len(chunk)
    except (bexc.BotoCoreError, bexc.ClientError) as exc:
        raise translate(exc, uri, client, f"reading {obj.path!r} of") from None
    return written


def read(client: Any, uri: ModelURI, path: str, start: int | None = None,
         end: int | None = None) -> bytes:
    """The object ``path`` of the model directory, or its bytes ``start``..``end`` inclusive."""
    from botocore import exceptions as bexc

    kwargs = {"Bucket": uri.bucket, "Key": uri.key(path)}
    if start is not None:
        kwargs["Range"] = f"bytes={start}-{end}"
    try:
        return client.get_object(**kwargs)["Body"].read()
    except (bexc.BotoCoreError, bexc.ClientError) as exc:
        raise translate(exc, uri, client, f"reading {path!r} of") from None
