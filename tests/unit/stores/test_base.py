"""The store budget where the caller names none (stores/base.py ``default_budget``): the
driver's 30 s, the user's ``timeout_s`` once set (delivered to every process by the
settings' environment). The job's actors' 300 s needs a Ray worker:
tests/integration/test_compat.py."""

from __future__ import annotations

import pytest

from ray_stream_llm.stores.base import (
    DEFAULT_TIMEOUT_S,
    NODE_TIMEOUT_S,
    TIMEOUT_ENV,
    StoreDeadline,
    default_budget,
)
from ray_stream_llm.stores.settings import ObjectStoreConfig, derive_settings


@pytest.fixture
def no_budget_set(monkeypatch: pytest.MonkeyPatch) -> None:
    """No budget delivered to this process (whatever it was started with)."""
    monkeypatch.delenv(TIMEOUT_ENV, raising=False)


def test_outside_ray_the_budget_is_the_drivers_30_s(no_budget_set):
    assert (DEFAULT_TIMEOUT_S, NODE_TIMEOUT_S) == (30.0, 300.0)
    assert default_budget() == 30.0
    assert StoreDeadline().total == 30.0
    # a config that leaves timeout_s unset delivers none: each process keeps its default
    assert TIMEOUT_ENV not in derive_settings(ObjectStoreConfig()).env
    assert TIMEOUT_ENV not in derive_settings(None).env


def test_the_users_timeout_s_is_every_process_budget(no_budget_set, monkeypatch):
    """``timeout_s`` set: the settings carry it to every process (as the builder delivers
    the settings' env to each stage), and that process's default budget is it."""
    env = derive_settings(ObjectStoreConfig(timeout_s=90)).env
    monkeypatch.setenv(TIMEOUT_ENV, env[TIMEOUT_ENV])  # what a stage's runtime_env holds
    assert default_budget() == 90.0
    assert StoreDeadline().total == 90.0
    assert StoreDeadline(5).total == 5.0  # a caller's own budget is its own
