"""The one dispatch point between a model URI and the module that lists and reads its store.

``_s3`` (``s3://``), ``_gcs`` (``gs://``) and ``_azure`` (``az://``) each offer the
same three functions, which the metadata fetch, ``inspect_model`` and the
engines' store check call through this module:

* ``list_model(uri, store) -> (client, [ObjectInfo])``: every object of the model
  directory, or a typed error (backend missing, bucket or prefix missing,
  credentials refused, store unreachable);
* ``download(client, uri, obj, dest) -> int``: one object written to ``dest``;
* ``read(client, uri, path, start=None, end=None) -> bytes``: an object, or its bytes
  ``start`` to ``end`` inclusive.
"""

from __future__ import annotations

import dataclasses
import importlib
from types import ModuleType
from typing import Any

from ray_stream_llm.errors import MissingBackendError, ModelNotFoundError, StoreUnreachableError
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
    """A client for ``uri``'s store and every object of the model directory (never empty)."""
    check_backend(uri)
    return _module(uri).list_model(uri, store)


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


def no_objects(uri: ModelURI, endpoint: str) -> ModelNotFoundError:
    """The error for a model prefix that holds no object."""
    return ModelNotFoundError(
        f"no objects under {str(uri)!r} at endpoint {endpoint!r}; "
        "check the prefix (it is case-sensitive)"
    )
