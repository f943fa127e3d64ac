"""A TCP proxy on 127.0.0.1 whose downstream bytes share one bandwidth cap.

It stands for a node's share of a real store's link in the benchmarks: every
connection through it (every engine, every range GET) draws from one token bucket
of ``rate`` bytes per second, and ``bytes_down`` counts what the store sent.
"""

from __future__ import annotations

import socket
import threading
import time


class Throttle:
    """``with Throttle(upstream_port, rate) as link:`` then use ``link.endpoint_url``."""

    def __init__(self, upstream_port: int, rate: float, *, burst: int = 1 << 20):
        self.upstream = ("127.0.0.1", upstream_port)
        self.rate = float(rate)
        self.burst = burst
        self.bytes_down = 0
        self._tokens = float(burst)
        self._last = time.monotonic()
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._stop = threading.Event()
        self._conns: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True, name="throttle")

    def store_env(self, env: dict[str, str]) -> dict[str, str]:
        """``env`` with the S3 endpoint variables (boto3 and the streamer; Ray's pyarrow
        path) pointed through this link."""
        return {
            **env,
            "AWS_ENDPOINT_URL": self.endpoint_url,
            "AWS_ENDPOINT_URL_S3": self.endpoint_url,
        }

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> Throttle:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._listener.close()
        self._thread.join(5)
        for conn in list(self._conns):
            try:
                conn.close()
            except OSError:
                pass

    def _take(self, n: int) -> None:
        """Wait until ``n`` bytes may pass the cap."""
        while True:
            with self._lock:
                now = time.monotonic()
                self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
                self._last = now
                if self._tokens >= n:
                    self._tokens -= n
                    self.bytes_down += n
                    return
                wait = (n - self._tokens) / self.rate
            time.sleep(min(wait, 0.05))

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream)
            except OSError:
                client.close()
                continue
            self._conns += [client, server]
            threading.Thread(target=self._pipe, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client, True), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, downstream: bool) -> None:
        try:
            while chunk := src.recv(64 << 10):
                if downstream:
                    self._take(len(chunk))
                dst.sendall(chunk)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
