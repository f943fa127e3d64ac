"""uv's flags for `uv pip install` from pip's own configuration on this machine (make setup
installs with uv, which reads no pip.conf): pip's index, extra indexes, find-links,
constraint files and certificate (`pip config list`: its files and PIP_* variables, the
variables first), and pip's way of choosing among indexes (the best version from any of
them). A file:// index that is not there is left out, as pip leaves it out (with a warning).
Printed as shell words."""

from __future__ import annotations

import ast
import os
import shlex
import subprocess
import sys
from urllib.parse import urlparse


def pip_config() -> dict[str, str]:
    listed = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=True
    ).stdout
    files: dict[str, str] = {}
    env: dict[str, str] = {}
    for line in listed.splitlines():
        key, _, value = line.partition("=")
        where, _, name = key.partition(".")
        if where in (":env:", "global", "install"):
            (env if where == ":env:" else files)[name] = ast.literal_eval(value)
    return {**files, **env}


def present(url: str) -> bool:
    parsed = urlparse(url)
    return parsed.scheme != "file" or os.path.isdir(parsed.path)


def flags(config: dict[str, str]) -> list[str]:
    out = ["--index-strategy", "unsafe-best-match"]
    if index := config.get("index-url"):
        out += ["--default-index", index]
    for url in config.get("extra-index-url", "").split():
        if present(url):
            out += ["--index", url]
    for location in config.get("find-links", "").split():
        out += ["--find-links", location]
    for path in config.get("constraint", "").split():
        out += ["--constraints", path]
    if config.get("cert"):
        out += ["--native-tls"]  # the system's certificates, as pip's cert names them
    return out


if __name__ == "__main__":
    print(shlex.join(flags(pip_config())))
