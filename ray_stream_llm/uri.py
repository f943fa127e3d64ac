"""Parse and normalise object-store model URIs.

The schemes the Run:ai streamer reads are the keys of the store registry
(:data:`ray_stream_llm.stores.registry.BACKENDS`); here are the spellings users try
that it does not read, each with the form to use instead. A model URI always
names a "directory": with or without a trailing slash it means the same model,
and the normalised form ends in ``/`` so that ``s3://b/llama`` never also
matches ``s3://b/llama-2/``. Object keys become local paths only through the one
key-safety rule, :meth:`ModelURI.safe_relative`.
"""

from __future__ import annotations

import dataclasses
import posixpath
import re

from ray_stream_llm.errors import InvalidModelURIError, UnsafeObjectKeyError
from ray_stream_llm.redact import has_userinfo, redact
from ray_stream_llm.stores.registry import BACKENDS

# Schemes that look right but the streamer does not read: the fix for each.
_REFUSED_SCHEMES: dict[str, str] = {
    "s3a": "use s3://{rest} (s3a:// is Hadoop's name for the same store)",
    "s3n": "use s3://{rest} (s3n:// is Hadoop's name for the same store)",
    "gcs": "use gs://{rest}",
    "abfss": "use az://<container>/<path> and set the storage account in the Azure settings",
    "abfs": "use az://<container>/<path> and set the storage account in the Azure settings",
    "azure": "use az://{rest}",
    "http": "give the bucket URI (s3://bucket/prefix/) and the endpoint separately "
    "(AWS_ENDPOINT_URL); signed or plain HTTP URLs cannot be listed",
    "https": "give the bucket URI (s3://bucket/prefix/) and the endpoint separately "
    "(AWS_ENDPOINT_URL); signed or plain HTTP URLs cannot be listed",
    "file": "a local path needs no streaming from object storage; pass the directory itself",
}

_URI_RE = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://(?P<rest>.*)$")
# What a user meant as a URI even when mistyped ("s3:/bucket", "s3:bucket/x").
_URI_ATTEMPT_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+:(?!\\)")
# S3 rules (3-63 chars, lowercase, digits, dots, hyphens) loosened to also admit
# GCS and Azure container names; anything else cannot be a bucket.
_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{1,221}[a-z0-9]$")


@dataclasses.dataclass(frozen=True)
class ModelURI:
    """A normalised object-store location of a model directory."""

    scheme: str
    bucket: str
    prefix: str  # "" for the bucket root, else ends with "/"

    def __str__(self) -> str:
        return f"{self.scheme}://{self.bucket}/{self.prefix}"

    def key(self, relative: str) -> str:
        """The object key of a file given relative to the model directory."""
        return self.prefix + relative

    def object_uri(self, relative: str) -> str:
        """The URI of a file given relative to the model directory.

        >>> ModelURI("s3", "b", "m/").object_uri("model.safetensors")
        's3://b/m/model.safetensors'
        """
        return f"{self.scheme}://{self.bucket}/{self.key(relative)}"

    def relative(self, key: str) -> str:
        """The path of an object key relative to the model directory."""
        if not key.startswith(self.prefix):
            raise ValueError(f"object key {key!r} is not under {str(self)!r}")
        return key[len(self.prefix) :]

    def safe_relative(self, path: str) -> str:
        """``path`` if, written under a local directory, it stays inside it; else an
        :class:`UnsafeObjectKeyError` naming the object. The one key-safety rule: no
        absolute path, no '..' or '.' segment, no empty segment ('//'), no '\\', no NUL.

        >>> ModelURI("s3", "b", "m/").safe_relative("sub/config.json")
        'sub/config.json'
        """
        if not is_safe_relative(path):
            raise UnsafeObjectKeyError(
                f"object key {self.key(path)!r} under {str(self)!r} would be written outside "
                "the model directory (absolute path, '..', '.', '//', '\\' or NUL); rename "
                "or delete that object in the store"
            )
        return path


def is_safe_relative(path: str) -> bool:
    """Whether ``path`` is a plain relative POSIX path that stays where it is written."""
    return bool(
        path
        and not path.startswith("/")
        and "\\" not in path
        and "\x00" not in path
        and posixpath.normpath(path) == path
        and path not in (".", "..")
        and not path.startswith("../")
    )


def looks_like_uri(value: object) -> bool:
    """Whether ``value`` was meant as a URI (has a ``scheme:``), even a malformed one.

    A Windows drive letter (``C:\\models``) is one letter and does not count.
    """
    return isinstance(value, str) and _URI_ATTEMPT_RE.match(value.strip()) is not None


def parse_model_uri(uri: str) -> ModelURI:
    """Parse ``uri`` into a :class:`ModelURI` or raise a clear error.

    >>> str(parse_model_uri("s3://models/llama"))
    's3://models/llama/'
    >>> parse_model_uri("s3://models/llama/") == parse_model_uri("s3://models/llama")
    True
    """
    if not isinstance(uri, str) or not uri.strip():
        raise InvalidModelURIError(
            "model URI must be a non-empty string like 's3://bucket/path/to/model/', "
            f"got {redact(uri) if isinstance(uri, str) else type(uri).__name__!r}"
        )
    match = _URI_RE.match(uri.strip())
    if match is None:
        raise InvalidModelURIError(
            f"model URI {redact(uri)!r} is malformed (no 'scheme://'); write it as "
            "'s3://bucket/path/to/model/' (or gs://, az://)"
        )
    scheme, rest = match["scheme"].lower(), match["rest"]
    if scheme in _REFUSED_SCHEMES:
        shown_rest = redact(uri).split("://", 1)[-1]
        raise InvalidModelURIError(
            f"model URI {redact(uri)!r}: scheme {scheme + '://'!r} is not read by the "
            f"Run:ai streamer; {_REFUSED_SCHEMES[scheme].format(rest=shown_rest)}"
        )
    if scheme not in BACKENDS:
        raise InvalidModelURIError(
            f"model URI {redact(uri)!r}: unsupported scheme {scheme + '://'!r}; "
            f"use one of {', '.join(s + '://' for s in BACKENDS)}"
        )
    if "?" in rest or "#" in rest:
        raise InvalidModelURIError(
            f"model URI {redact(uri)!r} has a query or fragment; give the plain "
            f"'{scheme}://bucket/path/' and put credentials in the settings, not the URI"
        )
    bucket, _, path = rest.partition("/")
    if has_userinfo(uri):
        raise InvalidModelURIError(
            f"model URI {redact(uri)!r} carries credentials before the bucket ('user@'); "
            f"give the plain '{scheme}://bucket/path/' and put credentials in "
            "ObjectStoreConfig (or the environment), never in the URI"
        )
    if not _BUCKET_RE.match(bucket) or ".." in bucket:
        raise InvalidModelURIError(
            f"model URI {redact(uri)!r}: {redact(bucket)!r} is not a valid bucket name "
            "(3-63 lowercase letters, digits, '.', '-'); write it as "
            f"'{scheme}://bucket/path/to/model/'"
        )
    parts = [p for p in path.split("/") if p]
    if any(p in (".", "..") for p in parts):
        raise InvalidModelURIError(
            f"model URI {redact(uri)!r} contains '.' or '..' path segments; give the plain prefix"
        )
    if "//" in path.rstrip("/"):
        raise InvalidModelURIError(
            f"model URI {redact(uri)!r} contains an empty path segment ('//'); remove it"
        )
    prefix = "/".join(parts) + "/" if parts else ""
    return ModelURI(scheme=scheme, bucket=bucket, prefix=prefix)
