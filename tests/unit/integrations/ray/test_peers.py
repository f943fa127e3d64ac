"""The peers' tree and a node's serving of its region (integrations/ray/peers.py): the
choice of a parent, the ranges a region serves while it fills, and the reads of a node with
no parent; regions in tmp_path, no Ray."""

from __future__ import annotations

import json
import os

import pytest

from ray_stream_llm.integrations.ray import peers
from ray_stream_llm.weights.marks import (
    CREATED,
    FAILED,
    PullSource,
    partial,
    record_digest,
    record_progress,
)

NAME = "model.safetensors"
DATA = bytes(range(256)) * 4  # 1024 bytes


@pytest.fixture
def region(tmp_path):
    """A region made for one weight file, nothing of it written yet."""
    made = {"objects": [{"path": NAME, "key": f"m/{NAME}", "size": len(DATA), "etag": "e"}]}
    (tmp_path / CREATED).write_text(json.dumps(made))
    return tmp_path


def test_each_node_gets_the_earliest_parent_with_room():
    tree = peers.Directory(fanout=2)
    assert tree.join("a", "server-a") == (None, None)  # the first reads the store
    assert tree.join("b", "server-b") == ("a", "server-a")
    assert tree.join("c", "server-c") == ("a", "server-a")
    assert tree.join("d", "server-d") == ("b", "server-b")  # a serves 2: full
    assert tree.tree() == {"a": None, "b": "a", "c": "a", "d": "b"}


def test_a_whole_region_only_serves():
    tree = peers.Directory(fanout=1)
    tree.join("a", "server-a")
    assert tree.join("w", "server-w", whole=True) == (None, None)
    assert tree.join("b", "server-b") == ("a", "server-a")
    assert tree.join("c", "server-c") == ("w", "server-w")


def test_a_lost_parent_leaves_and_its_child_is_given_another_never_below_itself():
    tree = peers.Directory(fanout=1)
    for node in "abc":
        tree.join(node, f"server-{node}")
    assert tree.tree() == {"a": None, "b": "a", "c": "b"}
    # b lost a: a leaves; b may not take its own child c as parent (a loop): the store
    assert tree.lost("b", "a") == (None, None)
    assert tree.tree() == {"b": None, "c": "b"}
    assert tree.lost("c", "b") == (None, None)  # b gone too: c reads the store
    assert tree.lost("gone", "c") == (None, None)  # a node that left asks: the store


def test_a_range_is_served_from_the_partial_file_once_the_prefix_has_it(region):
    path = partial(region, NAME)
    path.parent.mkdir()
    path.write_bytes(DATA[:600])
    record_progress(region, NAME, 600)
    assert peers.read_range(region, NAME, 100, 599) == DATA[100:600]


def test_a_whole_file_is_served_from_its_name(region):
    (region / NAME).write_bytes(DATA)
    assert peers.read_range(region, NAME, 1000, 1023) == DATA[1000:]


def test_only_the_regions_weight_files_are_served(region):
    (region / "secret.json").write_text("{}")
    with pytest.raises(ValueError, match="'secret.json' is not a weight file"):
        peers.read_range(region, "secret.json", 0, 1)
    with pytest.raises(ValueError, match="not a weight file"):
        peers.read_range(region, "../" + NAME, 0, 1)


def test_a_failed_pull_or_a_removed_region_stops_the_serving(region):
    (region / FAILED).write_text("{}")
    with pytest.raises(RuntimeError, match="its pull stopped"):
        peers.read_range(region, NAME, 0, 9)
    (region / FAILED).unlink()
    os.remove(region / CREATED)
    with pytest.raises(FileNotFoundError, match="was removed"):
        peers.read_range(region, NAME, 0, 9)


def test_a_whole_files_digest_is_the_one_its_pull_recorded(region):
    (region / NAME).write_bytes(DATA)
    record_digest(region, NAME, "ab" * 32)
    assert peers.file_digest(region, NAME) == "ab" * 32


def test_a_node_without_a_parent_reads_the_store_and_counts_it(region):
    asked: list[tuple[str, int, int]] = []

    def store_read(name, start, end):
        asked.append((name, start, end))
        return DATA[start : end + 1]

    reader = peers.PeerRead(region, "node-1", store_read)
    assert reader(NAME, 0, 99) == DATA[:100]
    assert reader(NAME, 100, 1023) == DATA[100:]
    assert asked == [(NAME, 0, 99), (NAME, 100, 1023)]
    assert reader.digest(NAME) is None  # the store's ETag is checked instead
    assert reader.status() == PullSource(source="store", store_bytes=len(DATA))
