"""The marks in a node's region (``weights/region.py``) that its pull writes and its readers
(engines on the node, peers on other nodes: ``integrations/ray/peers.py``) go by, and the region's
marker (:data:`CREATED`: what the region was made for) as they read it."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from ray_stream_llm.files import write_whole
from ray_stream_llm.stores import ObjectInfo

CREATED = ".created"  # the region's marker: a file of a directory holding it is a region file
UNSHARED = ".unshared"  # 'auto' gave the region up (it no longer fits): stream the store
FAILED = ".failed"  # the pull failed: the typed error (class and message), for every waiter
PARTIAL = ".partial"  # the files still being written, renamed to the region once whole
DIGESTS = ".sha256"  # each whole file's sha256, recorded before its rename (peers check it)
WARM_UNTIL = ".warm_until"  # a region kept for a later job: the time it may be removed
PROGRESS = ".progress"  # per file being written: the bytes from its start with no gap
PULL_RECORD = ".pull.json"  # the finished pull: when, how many bytes, from where
PEER_RECORD = ".peer.json"  # where this node's pull reads from (a peer node, or the store)
PULL_LOCK = ".pull.lock"  # held by the one process pulling into the region
LOCK = ".lock"  # the region's lock (weights/lifetime.py)
REFS = ".refs"  # one file per holder (weights/lifetime.py)


def partial(region: Path, name: str) -> Path:
    """Where ``name`` is written until every byte is in and checked."""
    return region / PARTIAL / name


def done(region: Path, name: str) -> bool:
    """Whether ``name`` is whole: only a checked file is renamed to its name in the region."""
    return (region / name).is_file()


def progress(region: Path, name: str) -> int:
    """Bytes of ``name`` in ``region`` from its start with no gap (what a peer may serve)."""
    try:
        return int((region / PROGRESS / name).read_text() or 0)
    except (OSError, ValueError):
        return 0


def record_progress(region: Path, name: str, nbytes: int) -> None:
    folder = region / PROGRESS
    folder.mkdir(exist_ok=True)
    write_whole(folder / name, str(nbytes))


def record_digest(region: Path, name: str, hexdigest: str) -> None:
    path = region / DIGESTS / name
    path.parent.mkdir(parents=True, exist_ok=True)
    write_whole(path, hexdigest)


def digest_of(region: Path, name: str) -> str | None:
    """The sha256 the pull recorded for ``name`` (None before it is whole)."""
    try:
        return (region / DIGESTS / name).read_text() or None
    except OSError:
        return None


def record_failure(region: Path, error: BaseException) -> None:
    """The pull failed with ``error``: ``.failed`` holds its class's name and its message
    (JSON), written whole; raises ``OSError`` where it cannot be written."""
    write_whole(region / FAILED, json.dumps({"class": type(error).__name__, "message": str(error)}))


def failure(region: Path) -> tuple[str, str] | None:
    """The pull's failure as ``.failed`` records it: the error's class name and its message;
    None when there is no mark. A mark of an older release (plain text, ``Class: message``)
    or one whose message could not be written (empty) gives the class name ``''`` and the
    text as it is."""
    try:
        text = (region / FAILED).read_text()
    except OSError:
        return None
    try:
        record = json.loads(text)
    except ValueError:
        return "", text
    if (
        isinstance(record, dict)
        and isinstance(record.get("class"), str)
        and isinstance(record.get("message"), str)
    ):
        return record["class"], record["message"]
    return "", text


def marker(region: Path) -> dict[str, Any]:
    """The region's marker (:data:`CREATED`) as written when the region was made."""
    meta: dict[str, Any] = json.loads((region / CREATED).read_text())
    return meta


def objects_of(region: str | Path) -> tuple[ObjectInfo, ...]:
    """The weight objects a region was made for, in the order its marker lists them."""
    meta = marker(Path(region))
    return tuple(ObjectInfo(**o) for o in meta["objects"])


def _setting(region: Path, key: str, unreadable: Any = None) -> Any:
    """The marker's ``key`` (None where it has none), or ``unreadable`` where the marker
    cannot be read (the region removed meanwhile)."""
    try:
        return marker(region).get(key)
    except (OSError, ValueError):
        return unreadable


def budget(region: Path) -> float | None:
    value = _setting(region, "timeout_s")
    return float(value) if value is not None else None


def required(region: Path) -> bool:
    return bool(_setting(region, "required", unreadable=True))


def kv_cache_engines(region: Path) -> int:
    return int(_setting(region, "kv_cache_engines") or 0)


def keep_warm_s(region: Path) -> float:
    return float(_setting(region, "keep_warm_s") or 0.0)


def fanout(region: Path) -> int:
    """The nodes a node serves at once (``weight_peers``); 0: each reads the store."""
    return int(_setting(region, "peers") or 0)


@dataclasses.dataclass(frozen=True)
class PullSource:
    """Where a node's pull read: ``source`` is ``"store"``, ``"peer <node id>"`` or
    ``"kept warm"``; the bytes from each, the peers given up on the way (also in
    :data:`PEER_RECORD`, while the pull reads)."""

    source: str = "store"
    peer_bytes: int = 0
    store_bytes: int = 0
    peers_lost: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class PullRecord:
    """The pull that filled a region (:data:`PULL_RECORD`): when, how many bytes, from
    where, by which process."""

    started: float
    finished: float
    bytes: int
    pid: int
    read: PullSource = PullSource()

    def to_json(self) -> str:
        fields = dataclasses.asdict(self)
        return json.dumps({**fields.pop("read"), **fields})

    @classmethod
    def from_json(cls, text: str) -> PullRecord:
        """Raises ``ValueError`` where ``text`` is not such a record."""
        try:
            data = json.loads(text)
            read = PullSource(
                str(data.get("source", "store")),
                int(data.get("peer_bytes", 0)),
                int(data.get("store_bytes", 0)),
                tuple(data.get("peers_lost", ())),
            )
            return cls(
                float(data["started"]), float(data["finished"]), int(data["bytes"]),
                int(data.get("pid", 0)), read,
            )  # fmt: skip
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"not a pull record: {text[:200]!r}") from exc


def pull_record(region: str | Path) -> PullRecord | None:
    """The record of the pull that filled ``region``; None before it is written (the pull
    writes it just after its last file is whole) or where it cannot be read."""
    try:
        return PullRecord.from_json((Path(region) / PULL_RECORD).read_text())
    except (OSError, ValueError):
        return None


def record_pull(region: Path, record: PullRecord) -> None:
    write_whole(region / PULL_RECORD, record.to_json())
