"""``ray-stream-llm local-store``: the embedded S3 store with a model in it, until Ctrl-C.

Starts SeaweedFS on 127.0.0.1 (:class:`~ray_stream_llm.tools.localstore.LocalS3Server`),
publishes a model directory into it (the demo model, SmolLM2-135M-Instruct, by
default), writes the store's variables to ``env.sh`` in its directory (mode 0600: they
hold this store's own random credentials, valid only for it; and :data:`LOOPBACK_ENV`,
since only this machine reaches the store), prints the ``export`` lines and the
``ObjectStoreConfig(...)`` snippet, and stops the server on Ctrl-C or SIGTERM, removing
what it wrote.
"""

from __future__ import annotations

import os
import shutil
import signal
import threading
from collections.abc import Callable
from pathlib import Path

from ray_stream_llm.cache import cache_root

DEFAULT_PORT = 8333  # SeaweedFS's own default S3 port
ENV_NAMES = ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION")
# The store listens on 127.0.0.1 only, so a job that reads it runs on this machine: the Ray
# such a job starts binds to 127.0.0.1 too, not to every interface (Ray's Linux default).
LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


def default_dir() -> Path:
    return cache_root() / "local-store"


def _size(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def serve(
    model_dir: Path | None,
    uri: str | None,
    *,
    port: int = DEFAULT_PORT,
    directory: Path | None = None,
    say: Callable[[str], None] = print,
    ready: threading.Event | None = None,
) -> int:
    """Run the store until SIGINT or SIGTERM; return the exit status."""
    from ray_stream_llm.tools.localstore import LocalS3Server

    if model_dir is None:
        from ray_stream_llm.tools.demo_model import ensure_demo_model

        say("Preparing the demo model (converted once, then cached) ...")
        model_dir = ensure_demo_model()
    if not (model_dir / "config.json").is_file():
        raise FileNotFoundError(
            f"{str(model_dir)!r} has no config.json: give the directory of a Hugging Face "
            "model (config.json, tokenizer files, *.safetensors)"
        )
    uri = uri or f"s3://models/{model_dir.name}/"
    root = directory or default_dir()
    shutil.rmtree(root / "server", ignore_errors=True)  # ours: a fresh store each start
    root.mkdir(parents=True, exist_ok=True)
    stop = threading.Event()
    previous = {
        sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)
    }
    env_file = root / "env.sh"
    try:
        with LocalS3Server(root / "server", port=port) as server:
            keys = server.upload_dir(model_dir, uri)
            size = sum(f.stat().st_size for f in model_dir.rglob("*") if f.is_file())
            env = {k: v for k, v in server.env().items() if k in ENV_NAMES}
            exports = " ".join(f"{k}={v}" for k, v in env.items())
            fd = os.open(env_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(f"export {exports}\n")
                f.write("export " + " ".join(f"{k}={v}" for k, v in LOOPBACK_ENV.items()) + "\n")
            say(
                f"Local S3 store (SeaweedFS) on {server.endpoint_url}, pid {server.pid}: "
                f"{uri} ({len(keys)} files, {_size(size)})\n"
                f"\nIn another shell, point the AWS variables at it (and keep a Ray started "
                "there on 127.0.0.1):\n"
                f"  source {env_file}\n"
                f"or\n  export {exports}\n"
                f"\nOr give it in the config (no variables needed):\n"
                f"  ObjectStoreConfig(endpoint_url={server.endpoint_url!r}, "
                f"aws_access_key_id={server.access_key_id!r},\n"
                f"                    aws_secret_access_key={server.secret_access_key!r}, "
                f"region_name={server.region!r})\n"
                f"\nTry: ray-stream-llm inspect {uri}\n"
                "These credentials are this store's own, valid only here. Stop with Ctrl-C."
            )
            if ready is not None:
                ready.set()
            stop.wait()
            say("Stopping the store ...")
    finally:
        env_file.unlink(missing_ok=True)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    shutil.rmtree(root / "server", ignore_errors=True)
    say("Stopped.")
    return 0
