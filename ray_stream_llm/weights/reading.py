"""The node's region as the engine's processes read it: they never hold it and never pull.

vLLM's processes are given the model's metadata directory and no ``model_weights``; the
engine actor names the model's URI for that directory in :data:`WEIGHTS_ENV`
(:func:`weights_of`) and the node's region in :data:`REGION_ENV`, so vLLM's compile key
holds neither the URI nor the node; this library's loader
(``integrations/vllm/loader.py``) finds the region there (:func:`region_of`), reads the
files the stage actor planned, in their order (:func:`planned_files`), and awaits each one
by its name until it is whole (:func:`wait_for`, :func:`file_source`), so the first engine
streams while the pull goes on. The region's holders (``weights/region.py``) see that the
pull goes on; a pull that fails fails every waiter with its typed error.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from ray_stream_llm.uri import parse_model_uri
from ray_stream_llm.weights.marks import CREATED, UNSHARED, budget, done, marker, objects_of
from ray_stream_llm.weights.pull import pull_error, pull_timeout

# set by the engine actor for its vLLM processes: the node's region its engine reads
REGION_ENV = "RAY_STREAM_LLM_REGION"
# set by the engine actor for its vLLM processes, which are given no model_weights: the
# model directory it gave vLLM and the URI its weights stream from (neither the URI nor the
# node is then in vLLM's compile key)
WEIGHTS_ENV = "RAY_STREAM_LLM_WEIGHTS"


def weights_env(model_dir: str, uri: str) -> str:
    """The value of :data:`WEIGHTS_ENV` naming ``uri`` as the weights of ``model_dir``."""
    return json.dumps({"model": os.path.normpath(model_dir), "weights": uri})


def weights_of(model_or_path: str | os.PathLike[str]) -> str:
    """What the engine's loader streams for ``model_or_path`` (vLLM's ``model_weights``, or
    its ``model`` where it has none): the URI :data:`WEIGHTS_ENV` names for that model
    directory, else ``model_or_path`` itself."""
    path = os.fspath(model_or_path)
    try:
        named = json.loads(os.environ.get(WEIGHTS_ENV) or "{}")
        if os.path.normpath(path) == named["model"]:
            return str(named["weights"])
    except (ValueError, KeyError, TypeError):
        pass  # none named, or for another directory
    return path


def region_of(model_weights: str | os.PathLike[str]) -> Path | None:
    """The node's region an engine given ``model_weights`` reads: the region named in
    :data:`REGION_ENV` when its marker records that URI, else the region at the directory
    ``model_weights`` (:func:`region_of_dir`), else None (the store's URI, a plain
    directory)."""
    named = os.environ.get(REGION_ENV)
    region = region_of_dir(named) if named else None
    if region is not None:
        try:
            recorded = str(parse_model_uri(str(marker(region)["uri"])))
            if recorded == str(parse_model_uri(os.fspath(model_weights))):
                return region
        except (OSError, ValueError, KeyError, TypeError):
            pass  # not that model's URI: whatever ``model_weights`` itself is
    return region_of_dir(model_weights)


def region_of_dir(directory: str | os.PathLike[str]) -> Path | None:
    """The region at ``directory`` (it holds the region's marker), or None. Keyed on the
    directory itself, whatever string named it (relative, ``~``, ``..``)."""
    try:
        path = Path(os.path.realpath(os.path.expanduser(os.fspath(directory))))
        return path if (path / CREATED).is_file() else None
    except (OSError, ValueError):
        return None


def planned_files(model_weights: str | os.PathLike[str]) -> list[str] | None:
    """The weight files of the region ``model_weights`` stands for (:func:`region_of`), in
    the order its marker lists them (the store's listing the stage actor planned from), or
    None where it is no region."""
    region = region_of(model_weights)
    if region is None:
        return None
    return [str(region / obj.path) for obj in objects_of(region)]


def file_source(region: str | Path, name: str) -> tuple[str, float]:
    """In the engine's process: what to stream for the weight file ``name`` of ``region``
    (the directory vLLM was given) once it may be read, and the seconds waited: the whole
    file (:func:`wait_for`), or its object in the store when 'auto' gave the region up
    before pulling it (the URI made from the region's marker)."""
    region = Path(region)
    waited = wait_for(region, name)
    if done(region, name):
        return str(region / name), waited
    return parse_model_uri(marker(region)["uri"]).object_uri(name), waited


def wait_for(region: str | Path, name: str, timeout: float | None = None) -> float:
    """In the engine's process: block until the weight file ``name`` of ``region`` is
    whole (under its name), or the region was given up for the store (:data:`UNSHARED`,
    'auto' only: see :func:`file_source`); seconds waited. Raises when the pull failed (its
    typed error: :func:`pull_error`) or the region is gone. The region's holders see that
    its pull goes on (:meth:`NodeWeights.tend`); this process never pulls. ``timeout``: by
    default the region's pull timeout (:func:`pull_timeout`)."""
    region = Path(region)
    if not (region / CREATED).is_file():
        raise FileNotFoundError(f"{region} is not a shared region (or it was removed)")
    objects = objects_of(region)
    if name not in {o.path for o in objects}:
        raise FileNotFoundError(f"{name!r} is not a weight file of the shared region {region}")
    if timeout is None:
        timeout = pull_timeout(sum(o.size for o in objects), budget(region))
    begin = time.monotonic()
    while not done(region, name):
        if (region / UNSHARED).exists():
            break
        if (error := pull_error(region)) is not None:  # None: no failure mark
            raise error
        if not (region / CREATED).exists():
            raise FileNotFoundError(f"the shared region {region} was removed while {name} waited")
        if time.monotonic() - begin > timeout:
            raise TimeoutError(
                f"{region / name} not complete after {timeout:.0f}s (the pull's budget for "
                "its size)"
            )
        time.sleep(0.05)
    return time.monotonic() - begin
