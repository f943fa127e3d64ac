"""The one dispatch point between a model URI and the module that lists and reads its store.

``_s3`` (``s3://``), ``_gcs`` (``gs://``) and ``_azure`` (``az://``) each offer the
same functions, each raising this library's typed errors (bucket or object missing,
credentials refused, store unreachable or slow):

* ``make_client(store)`` and ``endpoint_of(client)``;
* ``list_objects(client, uri) -> Iterator[ObjectInfo]``: every object of the model
  directory;
* ``download(client, uri, obj, dest) -> int``: one object written to ``dest``;
* ``read(client, uri, path, start=None, end=None) -> bytes``: an object, or its bytes
  ``start`` to ``end`` inclusive.

The metadata fetch, ``inspect_model`` and the engines' store check call them through
:func:`list_model`, :func:`download` and :func:`read` here.
"""

from __future__ import annotations

import dataclasses
import importlib
from types import ModuleType
from typing import Any

from ray_stream_llm.errors import (
    MissingBackendError,
    ModelNotFoundError,
    StoreTimeoutError,
    StoreUnreachableError,
)
from ray_stream_llm.store import ObjectStoreConfig
from ray_stream_llm.uri import STREAMABLE_SCHEMES, ModelURI

# scheme -> (module of this package, the client library its listing imports)
_MODULES = {"s3": ("_s3", "boto3"), "gs": ("_gcs", "google.cloud.storage"),
            "az": ("_azure", "azure.storage.blob")}


@dataclasses.dataclass(frozen=True)
class ObjectInfo:
    """One object of a listing, keyed relative to the model directory."""

    path: str
    key: str
    size: int
    etag: str


def _module(uri: ModelURI) -> ModuleType:
    return importlib.import_module(f"ray_stream_llm.{_MODULES[uri.scheme][0]}")


def check_backend(uri: ModelURI) -> None:
    """Fail at first use, with the pip line, when the streamer's backend for ``uri``'s
    scheme (or the client library the listing uses) is not installed."""
    package, pip_line = STREAMABLE_SCHEMES[uri.scheme]
    for name in (package, _MODULES[uri.scheme][1]):
        try:
            importlib.import_module(name)
        except ImportError:
            raise MissingBackendError(
                f"streaming {uri.scheme}:// needs {package.replace('_', '-')} (and {name}), "
                f"which is not installed: {pip_line}"
            ) from None


def list_model(uri: ModelURI, store: ObjectStoreConfig | None) -> tuple[Any, list[ObjectInfo]]:
    """A client for ``uri``'s store and every object of the model directory; a typed error
    when the backend is missing or the prefix holds nothing."""
    check_backend(uri)
    backend = _module(uri)
    client = backend.make_client(store)
    listing = list(backend.list_objects(client, uri))
    if not listing:
        raise ModelNotFoundError(
            f"no objects under {str(uri)!r} at endpoint {backend.endpoint_of(client)!r}; "
            "check the prefix (it is case-sensitive)"
        )
    return client, listing


def download(client: Any, uri: ModelURI, obj: ObjectInfo, dest: str) -> int:
    """Write one object to ``dest``; return the bytes written."""
    written = _module(uri).download(client, uri, obj, dest)
    if written != obj.size:
        raise StoreUnreachableError(
            f"{obj.path!r} of {str(uri)!r}: got {written} bytes, the listing said {obj.size}; "
            "the object changed or the connection was cut, retry"
        )
    return written


def read(client: Any, uri: ModelURI, path: str, start: int | None = None,
         end: int | None = None) -> bytes:
    """The object ``path`` of the model directory, or its bytes ``start``..``end`` inclusive."""
    return _module(uri).read(client, uri, path, start, end)


def timed_out(where: str) -> StoreTimeoutError:
    return StoreTimeoutError(
        f"the store did not answer in time ({where}); check the endpoint and the network"
    )


def unreachable(where: str, check: str) -> StoreUnreachableError:
    return StoreUnreachableError(
        f"cannot reach the object store ({where}); check {check} and that the store is up"
    )
