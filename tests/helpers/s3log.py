"""What the S3 server (SeaweedFS) served, read from its access log, and fresh copies of
the tiny models to change without touching the session's layouts."""

from __future__ import annotations

import time
import uuid
from collections import Counter

from helpers.models import UploadedModel
from helpers.waiting import wait_until
from ray_stream_llm.tools.localstore import LocalS3Server, Request

BUCKET = "models"
LOG_BARRIER_BUCKET = "fetch-test-log-barrier"


def log_barrier(server: LocalS3Server, timeout: float = 15.0) -> None:
    """Return once every request answered before this call is in the server's access log.

    The log is append-only: a PUT of a fresh key made now is logged after every request
    whose handler had returned before it was sent, so once its line shows up theirs are
    there too. What the barrier does not order: SeaweedFS writes a request's line in its
    S3 middleware once the handler has returned (weed/s3api/stats.go, the ``stats.go:42``
    of each line), and a response whose last bytes went straight to the socket (a large
    GET's) is complete at the client a moment before that. The short wait after the
    barrier is for such a line: between a request's last byte and its line the client
    sees nothing to wait on.
    """
    key = f"barrier/{uuid.uuid4().hex}"
    server.put(f"s3://{LOG_BARRIER_BUCKET}/{key}", b".")
    wait_until(
        lambda: any(r.method == "PUT" and r.key == key for r in server.served()),
        timeout,
        f"barrier {key} never reached the access log",
    )
    time.sleep(0.05)  # a request answered, its handler not yet returned (see above)


class AccessLog:
    """The requests the server logged from construction on."""

    def __init__(self, server: LocalS3Server) -> None:
        self.server = server
        log_barrier(server)
        self.start = len(server.served())

    def requests(self) -> list[Request]:
        log_barrier(self.server)
        return self.server.served()[self.start :]

    def gets(self, prefix: str = "") -> Counter[str]:
        """``key -> number of GETs answered with the object`` in ``BUCKET`` under ``prefix``."""
        return Counter(
            r.key
            for r in self.requests()
            if r.method == "GET"
            and r.status in (200, 206)
            and r.bucket == BUCKET
            and r.key
            and r.key.startswith(prefix)
        )


def prefix_of(uri: str) -> str:
    """``s3://models/a/b/`` -> ``a/b/``."""
    assert uri.startswith(f"s3://{BUCKET}/") and uri.endswith("/"), uri
    return uri[len(f"s3://{BUCKET}/") :]


def copy_model(server: LocalS3Server, model: UploadedModel, name: str) -> UploadedModel:
    """Upload ``model``'s local directory to a fresh prefix (leaving the session layout alone)."""
    uri = f"s3://{BUCKET}/tiny/fetch-test/{name}-{uuid.uuid4().hex[:8]}/"
    server.upload_dir(model.local, uri)
    return UploadedModel(
        name=name, uri=uri, local=model.local, metadata=model.metadata, weights=model.weights
    )
