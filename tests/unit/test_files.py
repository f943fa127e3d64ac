"""The library's one file lock (ray_stream_llm.files.locked), between real processes: the
kernel's own table of locks (/proc/locks) shows when a process waits for one; and a file's
SHA-256 (files.sha256_of) against the sha256sum tool's."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from helpers.waiting import wait_until

from ray_stream_llm.files import locked, sha256_of, try_locked

# holds the lock at argv[1] until a line comes ("unlink": removes the lock file first), then
# prints the moment it lets go
HOLDER = """
import os, sys, time
from ray_stream_llm.files import locked
held = locked(sys.argv[1])
print("held", flush=True)
if sys.stdin.readline().strip() == "unlink":
    os.unlink(sys.argv[1])
print(time.time(), flush=True)
held.release()
"""
# waits for the lock at argv[1], prints the moment it holds it, lets go when a line comes
WAITER = """
import sys, time
from ray_stream_llm.files import locked
with locked(sys.argv[1]):
    print(time.time(), flush=True)
    sys.stdin.readline()
"""
_WAITING = re.compile(r"->\s+FLOCK\s+\S+\s+\S+\s+\d+\s+([0-9a-f]+):([0-9a-f]+):(\d+)\s")


def _start(script: str, path: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", script, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def _waited_on(path: Path) -> bool:
    """Whether a process waits for the flock of the file now at ``path`` (/proc/locks)."""
    st = os.stat(path)
    want = (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
    for m in _WAITING.finditer(Path("/proc/locks").read_text()):
        if (int(m[1], 16), int(m[2], 16), int(m[3])) == want:
            return True
    return False


def _holding(path: Path) -> subprocess.Popen[str]:
    holder = _start(HOLDER, path)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    assert try_locked(path) is None  # another process holds it: not to be had
    return holder


def _waiting(path: Path) -> subprocess.Popen[str]:
    waiter = _start(WAITER, path)
    wait_until(lambda: _waited_on(path), 30, f"no process waits for {path} (/proc/locks)")
    return waiter


def test_a_second_process_waits_until_the_first_releases(tmp_path):
    path = tmp_path / "one.lock"
    holder = _holding(path)
    try:
        waiter = _waiting(path)
        released = float(holder.communicate("release\n", timeout=30)[0])
        got = float(waiter.communicate("\n", timeout=30)[0])
        assert got >= released  # it held the lock only once the first had let go
        assert waiter.returncode == 0 and holder.returncode == 0
    finally:
        holder.kill()
        holder.wait()


def test_a_killed_holder_releases_its_lock_to_the_process_waiting(tmp_path):
    path = tmp_path / "one.lock"
    holder = _holding(path)
    waiter = _waiting(path)
    holder.kill()  # SIGKILL: nothing of the holder's runs
    assert holder.wait(30) == -9
    out, _ = waiter.communicate("\n", timeout=30)
    assert waiter.returncode == 0 and float(out) > 0  # it got the lock
    held = try_locked(path)
    assert held is not None  # and nobody holds it now
    held.release()


def test_a_lock_file_removed_while_a_process_waits_is_taken_as_the_file_now_there(tmp_path):
    """The waiter is granted the removed file's lock, sees it is no longer at the path and
    locks the new one: the file at the path is the one held, so a third process waits."""
    path = tmp_path / "one.lock"
    holder = _holding(path)
    try:
        waiter = _waiting(path)
        holder.communicate("unlink\n", timeout=30)
        assert waiter.stdout is not None and float(waiter.stdout.readline()) > 0  # it holds
        assert path.exists() and try_locked(path) is None
        waiter.communicate("\n", timeout=30)
    finally:
        holder.kill()
        holder.wait()
    held = try_locked(path)
    assert held is not None
    held.release()


def test_a_lock_is_not_reentrant_and_released_once(tmp_path):
    path = tmp_path / "one.lock"
    with locked(path) as held:
        assert try_locked(path) is None  # this process's second hold would wait
    held.release()  # a second release does nothing
    again = try_locked(path)
    assert again is not None
    again.release()


def test_sha256_of_is_the_sha256sum_tools_digest(tmp_path):
    """Over several of its read chunks, and for an empty file."""
    for name, data in (("big", os.urandom(3 << 20) + b"tail"), ("empty", b"")):
        path = tmp_path / name
        path.write_bytes(data)
        tool = subprocess.run(["sha256sum", str(path)], capture_output=True, text=True, check=True)
        assert sha256_of(path) == tool.stdout.split()[0], name
