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


def _region(tmp_path: Path) -> Path:
    region = tmp_path / "node" / "0123456789abcdef"
    (region / ".refs").mkdir(parents=True)
    return region


def _actor_mark(region: Path, actor: str, raylet: int) -> None:
    """The mark a Ray actor's ``add_ref`` writes: its id, its raylet's pid and start time."""
    start = lifetime._proc_start(raylet)
    (region / ".refs" / f"actor-{actor}").write_text(f"{raylet} {start}\n")


def test_an_actors_mark_holds_while_its_ray_runs_and_ray_has_it_alive(tmp_path):
    """An actor holds a region while its raylet runs; the node's agent, a worker of that
    raylet, asks Ray's actor table (``actor_alive``) and counts only the live ones; a mark
    of another raylet is that Ray's agent's to judge; once a raylet has ended, its actors
    hold nothing, whatever their workers still do (a notebook's stage actor outlived its
    raylet by 1.7 s)."""
    region = _region(tmp_path)
    other = subprocess.Popen(  # stands for another Ray's raylet
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    )
    try:
        _actor_mark(region, "a1", other.pid)
        writing = region / ".refs" / f".actor-d4.{os.getpid()}.1.tmp"  # write_whole's
        writing.touch()
        _actor_mark(region, "b2", os.getppid())  # this process's raylet, as for the agent
        _actor_mark(region, "c3", os.getppid())
        asked: list[str] = []

        def alive(actor: str) -> bool:
            asked.append(actor)
            return actor == "c3"

        assert len(lifetime.live_refs(region)) == 3  # no actor table: every Ray runs
        assert writing.exists()  # a mark being written: not a holder yet, and left alone
        held = lifetime.live_refs(region, alive)
        assert sorted(r.name for r in held) == ["actor-a1", "actor-c3"]
        assert sorted(asked) == ["b2", "c3"]  # never about another Ray's actor
        assert not (region / ".refs" / "actor-b2").exists()  # dead: its mark removed
        (region / ".refs" / "actor-c3").unlink()  # dropped
        assert not lifetime.retire(region, actor_alive=alive)  # a1's Ray runs
        assert other.stdin is not None
        other.stdin.close()
        other.wait(timeout=30)
        assert lifetime.live_refs(region) == []  # its Ray has ended
        assert lifetime.retire(region) and not region.exists()
    finally:
        other.kill()


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
