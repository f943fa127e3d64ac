"""A TCP proxy on 127.0.0.1 that stands for the link between a node and its store: the one
proxy of the benchmarks and the fault tests.

Every connection through one :class:`Link` shares what it is given:

- ``rate`` (bytes/s, with ``burst``): one token bucket for the bytes the store sends, a
  node's share of a real store's link (the benchmarks);
- ``latency`` (s): a delay before each chunk the client sends (a slow store);
- ``cut_after_bytes``: once that many bytes came down, every open connection is reset and
  new ones are refused, for ``down_for`` seconds (None: for good): a store that drops
  (:meth:`Link.cut` drops it at once).

``bytes_down`` counts what the store sent through it; ``refused`` the connections refused
while it was down. (Per-object bytes need HTTP: :mod:`.shard_proxy`.)
"""

from __future__ import annotations

import socket
import struct
import threading
import time


def _reset(sock: socket.socket) -> None:
    """Close with a TCP RST, as a dropped link does."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()
    except OSError:
        pass


class Link:
    """``with Link(upstream_port, rate=...) as link:`` then use ``link.endpoint_url`` (or
    ``link.store_env(env)``)."""

    def __init__(
        self,
        upstream_port: int,
        *,
        rate: float | None = None,
        burst: int = 1 << 20,
        latency: float = 0.0,
        cut_after_bytes: int | None = None,
        down_for: float | None = None,
    ):
        self.upstream = ("127.0.0.1", upstream_port)
        self.rate = None if rate is None else float(rate)
        self.burst = burst
        self.latency = latency
        self.cut_after_bytes = cut_after_bytes
        self.down_for = down_for  # None: down for good once cut
        self.bytes_down = 0
        self.cut_at: float | None = None
        self.refused = 0
        self._tokens = float(burst)
        self._last = time.monotonic()
        self._lock = threading.Lock()
        self._conns: set[socket.socket] = set()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True, name="link")

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def store_env(self, env: dict[str, str]) -> dict[str, str]:
        """``env`` with the S3 endpoint variables (boto3 and the streamer; Ray's pyarrow
        path) pointed through this link."""
        return {
            **env,
            "AWS_ENDPOINT_URL": self.endpoint_url,
            "AWS_ENDPOINT_URL_S3": self.endpoint_url,
        }

    def __enter__(self) -> Link:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        try:  # wakes the accept() blocked in the link's thread (closing alone does not)
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        _reset(self._listener)
        with self._lock:
            conns, self._conns = list(self._conns), set()
        for conn in conns:
            _reset(conn)
        self._thread.join(timeout=5)

    def _down(self) -> bool:
        if self.cut_at is None:
            return False
        return self.down_for is None or time.monotonic() < self.cut_at + self.down_for

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self._down():
                self.refused += 1
                _reset(client)
                continue
            try:
                server = socket.create_connection(self.upstream, timeout=10)
                server.settimeout(None)  # the connect is bounded, the transfer is not
            except OSError:
                _reset(client)
                continue
            with self._lock:
                self._conns.update((client, server))
            threading.Thread(target=self._pump, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, True), daemon=True).start()

    def _take(self, n: int) -> None:
        """Wait until ``n`` bytes may pass the cap (in pieces of at most ``burst``: the
        bucket never holds more)."""
        assert self.rate is not None
        while n > self.burst:
            self._take(self.burst)
            n -= self.burst
        while True:
            with self._lock:
                now = time.monotonic()
                self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
                self._last = now
                if self._tokens >= n:
                    self._tokens -= n
                    return
                wait = (n - self._tokens) / self.rate
            time.sleep(min(wait, 0.05))

    def cut(self) -> None:
        """Drop the link now: every open connection reset, new ones refused for
        ``down_for`` seconds (None: for good)."""
        with self._lock:
            if self.cut_at is None:
                self.cut_at = time.monotonic()
            conns, self._conns = list(self._conns), set()
        for conn in conns:
            _reset(conn)

    def _piece(self, client: socket.socket) -> int:
        """The most the link reads at once from the store for ``client``."""
        return 64 << 10

    def _throttle(self, client: socket.socket, n: int) -> None:
        """Hold ``n`` bytes the store sent for ``client`` as long as the link's cap says."""
        if self.rate is not None:
            self._take(n)

    def _pump(self, src: socket.socket, dst: socket.socket, downstream: bool) -> None:
        try:
            while data := src.recv(self._piece(dst) if downstream else 64 << 10):
                if not downstream and self.latency:
                    time.sleep(self.latency)
                if downstream:
                    self._throttle(dst, len(data))
                dst.sendall(data)
                if downstream:
                    with self._lock:
                        self.bytes_down += len(data)
                        over = (
                            self.cut_after_bytes is not None
                            and self.cut_at is None
                            and self.bytes_down >= self.cut_after_bytes
                        )
                    if over:
                        self.cut()
                        return
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            with self._lock:
                self._conns.discard(src)
                self._conns.discard(dst)
