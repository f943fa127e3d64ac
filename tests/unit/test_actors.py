"""The library's actor names and its actors' logging (ray_stream_llm/actors.py), no Ray."""

from __future__ import annotations

import logging

import pytest

from ray_stream_llm.actors import actor_logging, agent_name


@pytest.fixture
def package_logger():
    """The package's logger and the root's handlers, restored after the test."""
    package, root = logging.getLogger("ray_stream_llm"), logging.getLogger()
    saved = package.level, list(package.handlers), list(root.handlers)
    package.handlers.clear()
    yield package
    package.setLevel(saved[0])
    package.handlers[:] = saved[1]
    root.handlers[:] = saved[2]


def test_each_node_has_its_own_agent_name():
    assert agent_name("abc123") == "rsl-agent-abc123"
    assert agent_name("a") != agent_name("b")


def test_unconfigured_logging_shows_info_lines_once(package_logger):
    package_logger.setLevel(logging.NOTSET)
    logging.getLogger().handlers.clear()  # pytest's capture handler included
    actor_logging()
    actor_logging()  # a second actor of the process adds no second handler
    assert package_logger.level == logging.INFO
    assert len(package_logger.handlers) == 1


def test_logging_configured_by_the_user_is_left_as_it_is(package_logger):
    package_logger.setLevel(logging.WARNING)
    logging.getLogger().handlers[:] = [logging.NullHandler()]
    actor_logging()
    assert package_logger.level == logging.WARNING
    assert package_logger.handlers == []
