"""Deliver derived object-store settings to every process, merged with the user's own.

Values, not hidden mutations: the non-secret settings become ``env_vars`` of each stage's
``runtime_env``, and ``model_loader_extra_config`` of the engine. Secrets (secret keys,
session tokens, Azure keys) do not go into the runtime_env, because Ray's runtime-env agent
writes runtime_envs to its log: they travel in the stage UDFs' constructor arguments and are
set in each actor's environment there (:class:`ray_stream_llm.integrations.ray.udfs.SecretEnv`).
A value the user already set differently is an error naming both sources; secrets are never
shown.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from ray_stream_llm.config import streaming_load_format
from ray_stream_llm.errors import SettingsConflictError
from ray_stream_llm.stores.settings import StoreSettings

_STAGES = ("chat_template_stage", "tokenize_stage", "detokenize_stage", "prepare_multimodal_stage")
_HIDDEN = "**********"


def _shown(name: str, value: Any, settings: StoreSettings) -> str:
    return _HIDDEN if name in settings.secret_env else repr(value)


def merge_runtime_env(
    runtime_env: Mapping[str, Any] | None, settings: StoreSettings, where: str
) -> dict[str, Any] | None:
    """``runtime_env`` with the settings' env vars added; ``where`` names it in errors."""
    if not settings.env:
        return dict(runtime_env) if runtime_env is not None else None
    merged = dict(runtime_env or {})
    env_vars = dict(merged.get("env_vars") or {})
    for name, value in settings.env.items():
        if name in env_vars and str(env_vars[name]) != value:
            raise SettingsConflictError(
                f"{where}['env_vars'][{name!r}] is {_shown(name, env_vars[name], settings)}, but "
                f"object_store sets {name} to {_shown(name, value, settings)}; set it in one "
                "place only (remove it from the runtime_env or from ObjectStoreConfig)"
            )
        if name not in settings.secret_env:  # secrets travel in the UDFs' arguments
            env_vars[name] = value
    merged["env_vars"] = env_vars
    return merged


def merge_engine_kwargs(
    engine_kwargs: Mapping[str, Any], settings: StoreSettings
) -> dict[str, Any]:
    """``engine_kwargs`` with the streamer tuning in ``model_loader_extra_config``; for
    ``runai_streamer_sharded`` (whose loader accepts only ``pattern`` there) the tuning
    travels in the RUNAI_STREAMER_* variables alone."""
    merged = dict(engine_kwargs)
    sharded = streaming_load_format(merged) == "runai_streamer_sharded"
    if not settings.model_loader_extra_config or sharded:
        return merged
    extra = dict(merged.get("model_loader_extra_config") or {})
    for key, value in settings.model_loader_extra_config.items():
        if key in extra and extra[key] != value:
            raise SettingsConflictError(
                f"engine_kwargs['model_loader_extra_config'][{key!r}] is {extra[key]!r}, but "
                f"object_store.streamer_{key} is {value!r}; set it in one place only"
            )
        extra[key] = value
    merged["model_loader_extra_config"] = extra
    return merged


def _stage_runtime_env(value: Any) -> Any:
    if isinstance(value, dict):
        return value.get("runtime_env")
    return getattr(value, "runtime_env", None)


def job_runtime_env() -> dict[str, Any] | None:
    """The runtime_env of the Ray job this driver runs in (``ray job submit``), if any."""
    raw = os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR")
    if not raw:
        return None
    try:
        return json.loads(raw).get("runtime_env") or None
    except (ValueError, AttributeError):
        return None


def store_updates(
    config: Any, settings: StoreSettings, updates: Mapping[str, Any]
) -> dict[str, Any]:
    """Check the user's runtime_envs against ``settings`` (processor, stages, the Ray job's),
    before anything starts; return the config updates (the engine's loader settings).

    The env vars themselves are delivered after Ray's builder ran, into each stage's own
    ``runtime_env`` (:func:`deliver_env`): not into the processor's, which Ray's builder
    also hands to ``ray.init``, and Ray refuses to merge that with a job's runtime_env
    that sets the same variable.
    """
    if not settings.env and not settings.model_loader_extra_config:
        return {}
    merge_runtime_env(config.runtime_env, settings, "runtime_env")
    for name in _STAGES:
        stage_env = _stage_runtime_env(updates.get(name, getattr(config, name, None)))
        merge_runtime_env(stage_env, settings, f"{name}.runtime_env")
    merge_runtime_env(job_runtime_env(), settings, "the Ray job's runtime_env")
    if config.streams_from_object_store:
        return {"engine_kwargs": merge_engine_kwargs(config.engine_kwargs, settings)}
    return {}


def deliver_env(
    map_batches_kwargs: Mapping[str, Any], settings: StoreSettings, stage: str
) -> dict[str, Any]:
    """A stage's ``map_batches`` kwargs with the non-secret settings in its runtime_env."""
    out = dict(map_batches_kwargs)
    if settings.env:
        out["runtime_env"] = merge_runtime_env(
            out.get("runtime_env"), settings, f"{stage} runtime_env"
        )
    return out


def with_defaults(runtime_env: Mapping[str, Any] | None, env: Mapping[str, str]) -> dict[str, Any]:
    """``runtime_env`` with ``env`` among its ``env_vars`` where it sets none of those names."""
    out = dict(runtime_env or {})
    out["env_vars"] = {**env, **(out.get("env_vars") or {})}
    return out
