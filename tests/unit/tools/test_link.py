"""The fault proxy of ray_stream_llm.tools.link (the benchmarks' and the fault tests' link
between a node and its store): closing it is immediate, and closes what it held."""

from __future__ import annotations

import socket
import time

from helpers.waiting import wait_until

from ray_stream_llm.tools.link import Link


def _waiting_in_accept(link: Link) -> bool:
    """Whether the link's thread sleeps in the kernel's accept (its wait channel)."""
    try:
        with open(f"/proc/self/task/{link._thread.native_id}/wchan") as f:
            return f.read() == "inet_csk_accept"
    except OSError:
        return False


def test_closing_a_link_ends_its_thread_at_once_and_refuses_new_connections():
    """Before: closing the listener did not wake the accept() blocked in the link's thread,
    so every ``with Link(...)`` that lived past its first instant waited out a 5 s join at
    the exit, and left the thread running."""
    upstream = socket.create_server(("127.0.0.1", 0))
    try:
        with Link(upstream.getsockname()[1]) as link:
            port = link.port
            wait_until(lambda: _waiting_in_accept(link), 5, "the link never waited for a client")
            start = time.monotonic()
        elapsed = time.monotonic() - start
        assert elapsed < 1.0, f"closing the link took {elapsed:.2f}s"
        assert not link._thread.is_alive()
        try:
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
        except OSError:
            pass
        else:
            raise AssertionError(f"the closed link still accepts on port {port}")
    finally:
        upstream.close()
