"""Object stores: the dispatch from a model URI to its scheme's backend.

:func:`list_model`, :func:`download` and :func:`read` are what the metadata fetch,
``inspect_model`` and the engines' store check call; each looks the scheme up in
:data:`~ray_stream_llm.stores.registry.BACKENDS`, loads that backend at first use (a
missing package is a :class:`~ray_stream_llm.errors.MissingBackendError` with the pip
line), and bounds every call by a :class:`~ray_stream_llm.stores.base.StoreDeadline`.
"""

from __future__ import annotations

import functools
import importlib
from typing import TYPE_CHECKING, cast

from ray_stream_llm.errors import MissingBackendError, ModelNotFoundError, StoreUnreachableError
from ray_stream_llm.redact import redact
from ray_stream_llm.stores.base import (
    BACKEND_FUNCTIONS,
    Backend,
    Client,
    ObjectInfo,
    StoreDeadline,
)
from ray_stream_llm.stores.registry import BACKENDS

if TYPE_CHECKING:
    from ray_stream_llm.stores.settings import ObjectStoreConfig
    from ray_stream_llm.uri import ModelURI

__all__ = [
    "ObjectInfo",
    "StoreDeadline",
    "backend",
    "check_backend",
    "download",
    "list_model",
    "read",
]


def check_backend(scheme: str) -> None:
    """Fail at first use, with the pip line, when the streamer's backend for ``scheme``
    (or the client library the listing uses) is not installed."""
    spec = BACKENDS[scheme]
    for name in (spec.streamer_package, spec.client_package):
        try:
            importlib.import_module(name)
        except ImportError:
            raise MissingBackendError(
                f"streaming {scheme}:// needs {spec.streamer_package.replace('_', '-')} "
                f"(and {name}), which is not installed: {spec.pip_line}"
            ) from None


def backend(scheme: str) -> Backend:
    """The backend module of ``scheme``, checked to offer every Backend function; a
    MissingBackendError with the pip line when its packages are not installed."""
    check_backend(scheme)  # each time: cheap once imported, and the install may change
    return _load(scheme)


@functools.cache
def _load(scheme: str) -> Backend:
    module = importlib.import_module(BACKENDS[scheme].module)
    missing = [name for name in BACKEND_FUNCTIONS if not callable(getattr(module, name, None))]
    if missing:
        raise TypeError(f"store backend {module.__name__} lacks {missing}")
    return cast(Backend, module)


def list_model(
    uri: ModelURI,
    store: ObjectStoreConfig | None,
    deadline: StoreDeadline | None = None,
    *,
    connections: int = 10,
    client: Client | None = None,
) -> tuple[Client, list[ObjectInfo]]:
    """A client for ``uri``'s store (``connections``: how many calls it may have open at
    once; ``client``: one made already) and every object of the model directory; a typed
    error when the backend is missing, the prefix holds nothing or the deadline passes."""
    deadline = deadline or StoreDeadline(store.timeout_s if store is not None else None)
    impl = backend(uri.scheme)
    client = client or impl.make_client(store, deadline, max_pool_connections=connections)
    listing = deadline.call(f"listing {str(uri)!r}", lambda: list(impl.list_objects(client, uri)))
    if not listing:
        raise ModelNotFoundError(
            f"no objects under {str(uri)!r} at endpoint {redact(impl.endpoint_of(client))!r}; "
            "check the prefix (it is case-sensitive)"
        )
    return client, listing


def download(
    client: Client, uri: ModelURI, obj: ObjectInfo, dest: str, deadline: StoreDeadline
) -> int:
    """Write one object to ``dest``; return the bytes written."""
    written = deadline.call(
        f"reading {obj.path!r} of {str(uri)!r}",
        backend(uri.scheme).download,
        client,
        uri,
        obj,
        dest,
    )
    if written != obj.size:
        raise StoreUnreachableError(
            f"{obj.path!r} of {str(uri)!r}: got {written} bytes, the listing said {obj.size}; "
            "the object changed or the connection was cut, retry"
        )
    return written


def read(
    client: Client,
    uri: ModelURI,
    path: str,
    deadline: StoreDeadline,
    start: int | None = None,
    end: int | None = None,
    *,
    etag: str | None = None,
) -> bytes:
    """The object ``path`` of the model directory, or its bytes ``start``..``end`` inclusive;
    with ``etag``, only from that version of the object (an
    :class:`~ray_stream_llm.errors.ObjectChangedError` naming it when the store holds
    another)."""
    return deadline.call(
        f"reading {path!r} of {str(uri)!r}",
        functools.partial(backend(uri.scheme).read, etag=etag),
        client,
        uri,
        path,
        start,
        end,
    )
