"""The fault proxy of ray_stream_llm.tools.link, tapped: what went through it (each GET's
byte range included), how long the link held each piece of a request, and where a cut fell,
counted by the proxy itself; and the store behind a slow link."""

from __future__ import annotations

import re
import socket
import threading
import time
from typing import Any

import pytest

from ray_stream_llm.tools.link import Link
from ray_stream_llm.tools.localstore import LocalS3Server

_REQUEST = re.compile(rb"(?:^|\r\n)([A-Z]+) (\S+) HTTP/1\.[01]\r\n")
# a GET's target and its headers, for the byte range it asked for
_GET = re.compile(rb"(?:^|\r\n)GET (\S+) HTTP/1\.[01]\r\n(.*?)\r\n\r\n", re.S)
_RANGE = re.compile(rb"(?im)^range: *bytes=(\d+)-(\d+)")
ALL = re.compile("")  # TappedLink.hold(None): every piece a client sends


def slow_link(
    s3_server: LocalS3Server,
    rate: float,
    *,
    burst: int = 1 << 20,
    monkeypatch: pytest.MonkeyPatch | None = None,
) -> Link:
    """The S3 server behind a link capped at ``rate`` bytes/s once a first ``burst`` bytes
    have passed (a context manager: the link runs inside its ``with``). With
    ``monkeypatch``, every client this process makes from now on goes through it
    (``AWS_ENDPOINT_URL``); else the caller hands ``link.endpoint_url`` to whom it means."""
    link = Link(s3_server.port, rate=rate, burst=burst)
    if monkeypatch is not None:
        monkeypatch.setenv("AWS_ENDPOINT_URL", link.endpoint_url)
    return link


class _Wrapped:
    """A socket seen through the tap: the link calls it as it calls the socket (its set of
    connections holds the socket itself, so the wrapper compares and hashes as that)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sock, name)

    def __eq__(self, other: object) -> bool:
        return self.sock == other

    def __hash__(self) -> int:
        return hash(self.sock)


class _Client(_Wrapped):
    """The client's side of one connection: its request lines noted, the time each piece
    came in kept for the store's side."""

    def __init__(self, sock: socket.socket, link: TappedLink) -> None:
        super().__init__(sock)
        self.link = link
        self.received_at = 0.0
        self.last_request = ""  # the line of the request the store answers now

    def recv(self, n: int) -> bytes:
        data = self.sock.recv(n)
        self.received_at = time.monotonic()
        lines = [f"{m.decode()} {t.decode()}" for m, t in _REQUEST.findall(data)]
        self.link.requests.extend(lines)
        if lines:
            self.last_request = lines[-1]
        for target, headers in _GET.findall(data):
            asked = _RANGE.search(headers)
            self.link.ranges.append(
                (
                    target.decode().split("?")[0],
                    (int(asked[1]), int(asked[2])) if asked else None,
                )
            )
        link = self.link
        if link.holding is not None and (
            link.holding is ALL or any(link.holding.search(line) for line in lines)
        ):
            with link._lock:
                passing = link.hold_after > 0
                link.hold_after -= passing
            if not passing:
                link.held_requests.extend(lines or ["<bytes the link cannot read>"])
                link.released.wait()  # never forwarded until released (or the link closes)
        return data


class _Store(_Wrapped):
    """The store's side of the same connection: how long each piece was held on the way."""

    def __init__(self, sock: socket.socket, client: _Client, link: TappedLink) -> None:
        super().__init__(sock)
        self.client, self.link = client, link

    def sendall(self, data: bytes) -> None:
        self.link.held.append(time.monotonic() - self.client.received_at)
        self.sock.sendall(data)


class TappedLink(Link):
    """The fault proxy, noting the requests that went through it, how long it held each piece
    a client sent, and, at the cut, what had come down and which requests had been sent."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.requests: list[str] = []  # "GET /bucket/key?query", in the order sent
        # each GET's path and byte range (first, last; None: the whole object), in order
        self.ranges: list[tuple[str, tuple[int, int] | None]] = []
        self.ranges_at_cut: list[tuple[str, tuple[int, int] | None]] = []
        self.held: list[float] = []  # s between a client's piece coming in and going on
        self.bytes_at_cut: int | None = None
        self.requests_at_cut: list[str] = []
        self.holding: re.Pattern[str] | None = None
        self.hold_after = 0  # matching pieces still let through before the hold begins
        self.held_requests: list[str] = []  # the requests the link kept from the store
        self.released = threading.Event()
        self._clients: dict[socket.socket, _Client] = {}
        self._slow: tuple[re.Pattern[str], float, int] | None = None

    def slow(self, pattern: str, rate: float, piece: int = 1 << 10) -> None:
        """From now on send the answers to the requests whose line matches ``pattern`` at
        ``rate`` bytes/s, in pieces of ``piece`` bytes, each on time: the client's reads
        never wait long enough to time out (the others' at the link's own cap). Called
        again, it changes the rate of an answer under way."""
        self._slow = (re.compile(pattern), float(rate), piece)

    def _piece(self, client: socket.socket) -> int:
        # read before the request it answers is known: small pieces for all while any is slow
        return super()._piece(client) if self._slow is None else self._slow[2]

    def _throttle(self, client: socket.socket, n: int) -> None:
        slow, tapped = self._slow, self._clients.get(client)
        if slow is not None and tapped is not None and slow[0].search(tapped.last_request):
            time.sleep(n / slow[1])
        else:
            super()._throttle(client, n)

    def hold(self, pattern: str | None = None, after: int = 0) -> None:
        """From now on keep from the store every request whose line ("GET /bucket/key?query")
        matches ``pattern``, once ``after`` of them have gone through; None: everything a
        client sends, readable or not (TLS): a store that stops answering. Until
        :meth:`release` or the link closes."""
        self.released.clear()
        self.hold_after = after
        self.holding = ALL if pattern is None else re.compile(pattern)

    def release(self) -> None:
        """Forward what was held, and hold nothing more."""
        self.holding = None
        self.released.set()

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        self.release()  # the held pieces go nowhere: every connection was reset

    def _pump(self, src: socket.socket, dst: socket.socket, downstream: bool) -> None:
        if downstream:
            super()._pump(src, dst, downstream)
        else:
            client = self._clients[src] = _Client(src, self)
            try:
                super()._pump(client, _Store(dst, client, self), downstream)  # type: ignore[arg-type]
            finally:
                self._clients.pop(src, None)

    def cut(self) -> None:
        with self._lock:
            if self.cut_at is None:
                self.bytes_at_cut = self.bytes_down
                self.requests_at_cut = list(self.requests)
                self.ranges_at_cut = list(self.ranges)
        super().cut()
