"""The store backend contract: the Backend protocol, the listing record and the error
helpers every backend shares.

A backend is a module of this package that offers the :class:`Backend` functions and
raises this library's typed errors (bucket or object missing, credentials refused,
store unreachable or slow). It imports nothing from the dispatcher
(:mod:`ray_stream_llm.stores`); adding a store is one entry in
:data:`~ray_stream_llm.stores.registry.BACKENDS` and one module.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import time
import urllib.parse
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from ray_stream_llm.errors import ObjectChangedError, StoreTimeoutError, StoreUnreachableError
from ray_stream_llm.stores.registry import DEFAULT_TIMEOUT_S, TIMEOUT_ENV

if TYPE_CHECKING:
    from ray_stream_llm.stores.settings import ObjectStoreConfig
    from ray_stream_llm.uri import ModelURI

logger = logging.getLogger(__name__)
T = TypeVar("T")
# Inside the job's actors (a node's metadata fetch, its shared pull's budget, the compile
# cache's calls): part of an engine start that takes minutes, beside engines compiling on
# the node's cores, which can keep a process off the CPU for tens of seconds (seen: every
# node of a three-node job over 30 s while a second job started three engines)
NODE_TIMEOUT_S = 300.0
# A store that cannot be reached, waited out (StoreDeadline's wait_out_outages): the first
# wait before calling it again, doubled up to the last
OUTAGE_WAIT_S = 0.5
OUTAGE_MAX_WAIT_S = 5.0
# in the message of a call that waited the store out for its whole budget (a node's pull
# writes it into its failure mark; the engine actor then does not retry to wait again)
WAITED_OUT = "of retries, the store's budget"


def default_budget() -> float:
    """The store budget where the caller names none: the user's (``timeout_s``, delivered
    to every process as ``RAY_STREAM_LLM_STORE_TIMEOUT_S``), else :data:`NODE_TIMEOUT_S`
    in a Ray worker (a stage or engine actor) and :data:`DEFAULT_TIMEOUT_S` elsewhere."""
    chosen = os.environ.get(TIMEOUT_ENV)
    if chosen:
        return float(chosen)
    return NODE_TIMEOUT_S if _in_ray_worker() else DEFAULT_TIMEOUT_S


def _in_ray_worker() -> bool:
    """Whether this process is a Ray worker (never imports Ray: a process that has not
    imported it is none)."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return False
    try:
        return bool(ray.get_runtime_context().worker.mode == ray.WORKER_MODE)
    except Exception:  # an older or partial Ray: the driver's default
        return False


# Each backend's own client object (boto3 S3 client, google.cloud.storage.Client,
# azure BlobServiceClient); opaque to everything but the backend that made it.
Client = Any


@dataclasses.dataclass(frozen=True)
class ObjectInfo:
    """One object of a listing, keyed relative to the model directory."""

    path: str
    key: str
    size: int
    etag: str


class Backend(Protocol):
    """The functions a backend module offers; each raises the typed errors."""

    def make_client(
        self,
        store: ObjectStoreConfig | None,
        deadline: StoreDeadline,
        *,
        max_pool_connections: int = 10,
    ) -> Client:
        """A client for the store, from ``store`` where it sets something, else the
        environment; it runs ``deadline.check_request`` before every request it sends,
        takes its connect and read timeouts from ``deadline`` and retries a few times at
        most (see :class:`StoreDeadline`); it keeps up to ``max_pool_connections``
        connections open (for parallel ranged reads)."""

    def endpoint_of(self, client: Client) -> str:
        """The endpoint the client talks to, safe to show."""

    def list_objects(self, client: Client, uri: ModelURI) -> Iterator[ObjectInfo]:
        """Every object of the model directory, recursively."""

    def download(self, client: Client, uri: ModelURI, obj: ObjectInfo, dest: str) -> int:
        """Write the listed version of one object (``obj.etag``) to ``dest``; return the
        bytes written (ObjectChangedError naming it when the store holds another)."""

    def read(
        self,
        client: Client,
        uri: ModelURI,
        path: str,
        start: int | None = None,
        end: int | None = None,
        *,
        etag: str | None = None,
    ) -> bytes:
        """An object of the model directory, or its bytes ``start`` to ``end`` inclusive;
        with ``etag`` only from that version (ObjectChangedError naming it otherwise)."""

    def write(self, client: Client, uri: ModelURI, path: str, source: str) -> None:
        """Upload the local file ``source`` as the object ``path`` under ``uri`` (only what
        this library writes: the compile cache's artifacts)."""

    def check_settings(self, store: ObjectStoreConfig) -> None:
        """Raise ValueError (pydantic reports it) for a contradiction among this backend's
        fields of ``store``; called when an ObjectStoreConfig is made."""

    def derive_env(self, store: ObjectStoreConfig, put: Put) -> None:
        """``put(name, value, is_secret=...)`` each variable this backend's consumers (its
        client here, the streamer's reader, Ray's downloader) read, from ``store``."""


class Put(Protocol):
    def __call__(self, name: str, value: Any, *, is_secret: bool = False) -> None: ...


BACKEND_FUNCTIONS = (
    "make_client",
    "endpoint_of",
    "list_objects",
    "download",
    "read",
    "write",
    "check_settings",
    "derive_env",
)


def timed_out(where: str, seconds: float | None = None) -> StoreTimeoutError:
    within = f" within {seconds:g}s" if seconds is not None else " in time"
    return StoreTimeoutError(
        f"the store did not answer{within} ({where}); check the endpoint and the network, "
        "or raise ObjectStoreConfig.timeout_s"
    )


def changed(uri: ModelURI, path: str, etag: str | None) -> ObjectChangedError:
    """The store holds another version of ``path`` than the one listed (ETag ``etag``)."""
    return ObjectChangedError(
        f"{path!r} of {str(uri)!r} changed in the store while it was read (it is no longer "
        f"the version with ETag {etag!r}); nothing of the new version was used: run the job "
        "again to load it"
    )


def unreachable(where: str, check: str) -> StoreUnreachableError:
    return StoreUnreachableError(
        f"cannot reach the object store ({where}); check {check} and that the store is up"
    )


class StoreDeadline:
    """A budget of seconds for a sequence of store calls (a preflight, one node's fetch,
    one region's pull), kept without a thread of its own: every call runs in its caller's
    thread, and the budget is checked at three places:

    - before each call (:meth:`call`): none starts once the budget is spent;
    - before each request a call sends (:meth:`check`, run by the client each backend makes
      with this deadline: a retry, the next page of a listing, the next chunk of a
      download): none goes out once the budget is spent;
    - after each call: one that ends past the budget is a timeout, even when it succeeded.

    Past the budget a call raises :class:`~ray_stream_llm.errors.StoreTimeoutError` naming
    the call and the budget. What bounds a request already sent is its client's per-attempt
    timeouts, which the backends take from here (:attr:`connect_timeout`,
    :attr:`read_timeout`); the client's retries are few and their back-offs short (S3: 3
    attempts; GCS: 5 s of retries; Azure: 3 attempts). So a call ends at most one attempt's
    timeouts (``connect_timeout + read_timeout``), or one back-off, after the budget. The
    read timeout bounds each wait for bytes, not a whole response: a store that keeps
    sending a trickle of bytes holds the one request it is answering until it ends, and
    only the next request (or the call's end) sees the budget spent.

    ``wait_out_outages`` (the job's actors: a node's metadata step and its shared pull): a
    call that fails because the store cannot be reached or did not answer
    (:class:`~ray_stream_llm.errors.StoreUnreachableError`,
    :class:`~ray_stream_llm.errors.StoreTimeoutError`) is made again after a back-off
    (:data:`OUTAGE_WAIT_S` doubling to :data:`OUTAGE_MAX_WAIT_S`) for as long as the budget
    lasts: a store restarted within the budget is a pause, not a failure. Once no call fits
    in the budget, the call raises its last error, saying how long it waited (within the
    budget). Without it (the driver's preflight, the user's own calls) the first failure
    is raised at once.
    """

    def __init__(self, total: float | None = None, *, wait_out_outages: bool = False):
        if total is None:
            total = default_budget()
        self.total = total
        self.wait_out_outages = wait_out_outages
        self._start = time.monotonic()
        self._end = self._start + total
        self._warned = False

    @property
    def connect_timeout(self) -> float:
        return min(5.0, self.total)

    @property
    def read_timeout(self) -> float:
        return max(1.0, min(10.0, self.total / 3))

    def remaining(self) -> float:
        return self._end - time.monotonic()

    def check(self, where: str) -> None:
        """A typed timeout naming ``where`` once the budget is spent; nothing before."""
        if self.remaining() <= 0:
            raise timed_out(where, self.total)

    def check_request(self, method: str, url: str) -> None:
        """:meth:`check` for a request a client is about to send (its method and its URL's
        path: the query, which can hold a SAS token, is never named)."""
        self.check(f"{method} {urllib.parse.urlsplit(url).path}")

    def call(self, where: str, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in this thread, or a typed timeout naming ``where`` when the budget
        is spent before it starts or when it ends (a timeout it raised itself, one of its
        requests refused by :meth:`check`, or a late result). With ``wait_out_outages``, a
        store that cannot be reached is called again until the budget is spent."""
        wait = OUTAGE_WAIT_S
        while True:
            self.check(where)
            try:
                result = fn(*args)
            except StoreTimeoutError as exc:
                if self.remaining() <= 0:
                    raise timed_out(where, self.total) from None
                if not self.wait_out_outages:
                    raise  # its attempts timed out within the budget: the backend named it
                error: StoreTimeoutError | StoreUnreachableError = exc
            except StoreUnreachableError as exc:
                if not self.wait_out_outages:
                    raise
                error = exc
            else:
                self.check(where)
                return result
            wait = self._wait_out(error, where, wait)

    def _wait_out(
        self, error: StoreTimeoutError | StoreUnreachableError, where: str, wait: float
    ) -> float:
        """Sleep ``wait`` s (less where the budget is nearly spent: the last call is made
        with :data:`OUTAGE_WAIT_S` left) before the call is made again, and return the next
        wait; or raise ``error``, saying how long the store was waited for, when no call
        fits in the budget any more."""
        if self.remaining() <= OUTAGE_WAIT_S:
            waited = time.monotonic() - self._start
            raise type(error)(
                f"{error}; still so after {waited:.0f}s {WAITED_OUT} of {self.total:g}s "
                "(ObjectStoreConfig.timeout_s)"
            ) from None
        if not self._warned:  # once per budget: a pull's ranges meet the same outage
            self._warned = True
            logger.warning(
                "The object store did not answer (%s): %s; retrying for up to %.0fs more",
                where,
                error,
                self.remaining(),
            )
        time.sleep(min(wait, self.remaining() - OUTAGE_WAIT_S))
        return min(wait * 2, OUTAGE_MAX_WAIT_S)
