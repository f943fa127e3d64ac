"""Processes that outlive the Ray worker that starts them (the shm janitor, the region's
reaper): started in a session of their own, since Ray kills a worker's children when the
worker exits. Standard library only."""

from __future__ import annotations

import shlex
import subprocess


def detach(argv: list[str]) -> None:
    """Start ``argv`` as an orphan in a session of its own (the shell that starts it exits
    at once): Ray kills a worker's child processes when the worker exits, and the point of
    these processes is to outlive the actor that started them."""
    command = " ".join(shlex.quote(a) for a in argv)
    subprocess.run(
        ["/bin/sh", "-c", f"setsid {command} </dev/null >/dev/null 2>&1 &"],
        check=True,
        close_fds=True,
    )
