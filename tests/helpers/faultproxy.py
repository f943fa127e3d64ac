"""A TCP proxy on 127.0.0.1 in front of the S3 server that injects faults: it cuts every
connection once a number of response bytes has gone through and then refuses connections
for a while (or for good), and it can add latency to every request chunk."""

from __future__ import annotations

import socket
import struct
import threading
import time


def _reset(sock: socket.socket) -> None:
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # RST
        sock.close()
    except OSError:
        pass


class FaultProxy:
    def __init__(
        self,
        upstream_port: int,
        *,
        cut_after_bytes: int | None = None,
        down_for: float | None = None,
        latency: float = 0.0,
    ):
        self.upstream = ("127.0.0.1", upstream_port)
        self.cut_after_bytes = cut_after_bytes
        self.down_for = down_for  # None: down for good once cut
        self.latency = latency
        self.bytes_down = 0
        self.cut_at: float | None = None
        self.refused = 0
        self._lock = threading.Lock()
        self._conns: set[socket.socket] = set()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> FaultProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        _reset(self._listener)
        with self._lock:
            for conn in list(self._conns):
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
            except OSError:
                _reset(client)
                continue
            with self._lock:
                self._conns.update((client, server))
            threading.Thread(target=self._pump, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, True), daemon=True).start()

    def _cut(self) -> None:
        with self._lock:
            if self.cut_at is None:
                self.cut_at = time.monotonic()
            conns, self._conns = list(self._conns), set()
        for conn in conns:
            _reset(conn)

    def _pump(self, src: socket.socket, dst: socket.socket, downstream: bool) -> None:
        try:
            while True:
                data = src.recv(1 << 16)
                if not data:
                    break
                if not downstream and self.latency:
                    time.sleep(self.latency)
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
                        self._cut()
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
