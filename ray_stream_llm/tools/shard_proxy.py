"""An HTTP/1.1 proxy on 127.0.0.1 in front of an S3 server (the sharded benchmark's store-side
count) that records, for every request,
the method, the object, the status and the response body bytes it carried: what the store
served, per object, in bytes (SeaweedFS's access log names the objects but not the bytes).

Point the job's ``AWS_ENDPOINT_URL`` at :attr:`ByteProxy.endpoint_url`. Requests are parsed
just enough to find their ends: ``Content-Length`` or ``chunked`` bodies, ``Expect:
100-continue``, HEAD and bodiless statuses; keep-alive connections carry many requests.
"""

from __future__ import annotations

import socket
import threading
import urllib.parse
from collections import Counter
from dataclasses import dataclass


@dataclass(frozen=True)
class Served:
    method: str
    bucket: str
    key: str
    status: int
    body_bytes: int  # response body bytes sent to the client
    range: str | None  # the request's Range header
    agent: str  # the request's User-Agent: botocore (driver, metadata) or the streamer's SDK

    @property
    def by_streamer(self) -> bool:
        """Sent by the Run:ai streamer (the AWS C++ SDK), not by boto3 (checks, listings)."""
        return "botocore" not in self.agent.lower() and "boto3" not in self.agent.lower()


class _Conn:
    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.buf = b""

    def _fill(self) -> bool:
        data = self.sock.recv(1 << 16)
        if not data:
            return False
        self.buf += data
        return True

    def head(self) -> bytes | None:
        while b"\r\n\r\n" not in self.buf:
            if not self._fill():
                return None
        head, _, self.buf = self.buf.partition(b"\r\n\r\n")
        return head + b"\r\n\r\n"

    def line(self) -> bytes:
        while b"\r\n" not in self.buf:
            if not self._fill():
                raise ConnectionError("closed in a chunk header")
        line, _, self.buf = self.buf.partition(b"\r\n")
        return line + b"\r\n"

    def exactly(self, n: int, out: socket.socket) -> int:
        """Forward ``n`` body bytes to ``out``; returns them."""
        left = n
        while left:
            if not self.buf and not self._fill():
                raise ConnectionError("closed in a body")
            piece, self.buf = self.buf[:left], self.buf[left:]
            out.sendall(piece)
            left -= len(piece)
        return n

    def chunked(self, out: socket.socket) -> int:
        total = 0
        while True:
            size_line = self.line()
            out.sendall(size_line)
            size = int(size_line.split(b";")[0].strip(), 16)
            if size == 0:
                while True:  # trailers, then the empty line
                    trailer = self.line()
                    out.sendall(trailer)
                    if trailer == b"\r\n":
                        return total
            total += self.exactly(size, out)
            out.sendall(self.line())  # the CRLF after the chunk

    def until_close(self, out: socket.socket) -> int:
        total = len(self.buf)
        out.sendall(self.buf)
        self.buf = b""
        while self._fill():
            total += len(self.buf)
            out.sendall(self.buf)
            self.buf = b""
        return total


def _headers(head: bytes) -> tuple[str, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    fields = {}
    for line in lines[1:]:
        if ":" in line:
            name, _, value = line.partition(":")
            fields[name.strip().lower()] = value.strip()
    return lines[0], fields


def _body(conn: _Conn, fields: dict[str, str], out: socket.socket, *, to_close: bool) -> int:
    if "chunked" in fields.get("transfer-encoding", "").lower():
        return conn.chunked(out)
    if "content-length" in fields:
        return conn.exactly(int(fields["content-length"]), out)
    return conn.until_close(out) if to_close else 0


class ByteProxy:
    def __init__(self, upstream_port: int):
        self.upstream = ("127.0.0.1", upstream_port)
        self.served: list[Served] = []
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._stop = threading.Event()
        self._socks: set[socket.socket] = set()
        self._threads: list[threading.Thread] = []

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> ByteProxy:
        thread = threading.Thread(target=self._accept, daemon=True)
        thread.start()
        self._threads.append(thread)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._listener.close()
        with self._lock:
            socks = list(self._socks)
        for sock in socks:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()
        for thread in self._threads:
            thread.join(timeout=5)

    def reset(self) -> None:
        with self._lock:
            self.served.clear()

    def records(self) -> list[Served]:
        with self._lock:
            return list(self.served)

    def get_bytes(
        self, bucket: str, prefix: str = "", *, streamer_only: bool = False
    ) -> Counter[str]:
        """``key -> response body bytes of the GETs of it`` under ``bucket``/``prefix``."""
        out: Counter[str] = Counter()
        for r in self.records():
            if streamer_only and not r.by_streamer:
                continue
            if r.method == "GET" and r.bucket == bucket and r.key and r.key.startswith(prefix):
                out[r.key] += r.body_bytes
        return out

    def _accept(self) -> None:
        self._listener.settimeout(0.2)
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except (TimeoutError, OSError):
                continue
            thread = threading.Thread(target=self._serve, args=(client,), daemon=True)
            thread.start()
            self._threads.append(thread)

    def _serve(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(self.upstream)
        except OSError:
            client.close()
            return
        with self._lock:
            self._socks.update((client, upstream))
        down, up = _Conn(client), _Conn(upstream)
        try:
            while not self._stop.is_set():
                head = down.head()
                if head is None:
                    return
                request_line, fields = _headers(head)
                method, target = request_line.split(" ")[:2]
                upstream.sendall(head)
                answer = None
                if fields.get("expect", "").lower() == "100-continue":
                    answer = up.head()
                    if answer is None:
                        return
                    if answer.split(b" ")[1].startswith(b"100"):
                        client.sendall(answer)
                        answer = None
                if answer is None:
                    _body(down, fields, upstream, to_close=False)
                    answer = up.head()
                    while answer is not None and answer.split(b" ")[1].startswith(b"100"):
                        client.sendall(answer)
                        answer = up.head()
                    if answer is None:
                        return
                status_line, rfields = _headers(answer)
                status = int(status_line.split(" ")[1])
                client.sendall(answer)
                if method == "HEAD" or status in (204, 304):
                    sent = 0
                else:
                    sent = _body(up, rfields, client, to_close=True)
                path = urllib.parse.unquote(urllib.parse.urlsplit(target).path)
                bucket, _, key = path.lstrip("/").partition("/")
                with self._lock:
                    self.served.append(
                        Served(
                            method,
                            bucket,
                            key,
                            status,
                            sent,
                            fields.get("range"),
                            fields.get("user-agent", ""),
                        )
                    )
                if rfields.get("connection", "").lower() == "close":
                    return
        except (OSError, ValueError, IndexError):
            return
        finally:
            for sock in (client, upstream):
                try:
                    sock.close()
                except OSError:
                    pass
            with self._lock:
                self._socks.difference_update((client, upstream))
