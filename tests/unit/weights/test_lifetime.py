"""Who holds a region (``weights/lifetime.py``): real processes, their references in a real
directory; no Ray, no store."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
from helpers.waiting import wait_until

from ray_stream_llm.weights import lifetime

HOLD = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    from ray_stream_llm.weights.lifetime import add_ref, region_lock

    region = Path(sys.argv[1])
    with region_lock(region):
        add_ref(region)
    print(os.getpid(), flush=True)
    if sys.argv[2] == "stay":
        sys.stdin.read()  # until the test closes it
""")

# a parent (standing for a raylet) starts the holder (its worker), then exits
SPAWN = textwrap.dedent("""
    import subprocess, sys
    holder = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2], "stay"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    print(holder.stdout.readline().strip(), flush=True)
""")


def _region(tmp_path: Path) -> Path:
    region = tmp_path / "node" / "0123456789abcdef"
    (region / ".refs").mkdir(parents=True)
    return region


def test_the_children_of_an_ended_parent_hold_nothing_once_it_is_named(tmp_path):
    """A Ray's workers outlive its raylet by seconds (a notebook's stage actor: 1.7 s idle,
    more under load); the driver's exit retires the region at once, naming the raylet."""
    region = _region(tmp_path)
    parent = subprocess.Popen(
        [sys.executable, "-c", SPAWN, HOLD, str(region)], stdout=subprocess.PIPE, text=True
    )
    assert parent.stdout is not None
    holder = psutil.Process(int(parent.stdout.readline()))
    assert parent.wait(timeout=60) == 0
    try:
        assert holder.is_running() and holder.status() != psutil.STATUS_ZOMBIE
        (ref,) = lifetime.live_refs(region)
        assert ref.name == f"{holder.pid}-{lifetime._proc_start(holder.pid)}"
        assert ref.read_text().split() == [str(parent.pid)]  # its parent, recorded
        assert not lifetime.retire(region)  # held: no ended parent named
        assert not lifetime.retire(region, ended_parent=os.getpid())  # not its parent
        assert region.exists()
        assert lifetime.retire(region, ended_parent=parent.pid)
        assert not region.exists() and not region.parent.exists()
        assert holder.is_running()  # not ended by the library: only not counted
    finally:
        holder.kill()


def test_a_holder_that_exited_unreaped_holds_nothing(tmp_path):
    """A zombie (exited, its parent has not reaped it yet) maps nothing."""
    region = _region(tmp_path)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(region), "exit"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None
        assert int(holder.stdout.readline()) == holder.pid
        wait_until(
            lambda: psutil.Process(holder.pid).status() == psutil.STATUS_ZOMBIE, 30, "its exit"
        )
        assert len(list((region / ".refs").iterdir())) == 1  # its reference, left behind
        assert lifetime.live_refs(region) == []
        assert lifetime.retire(region) and not region.exists()
    finally:
        holder.wait()
