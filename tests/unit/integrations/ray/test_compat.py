"""Whether Ray ends a dead worker's processes itself, per version and setting
(integrations/ray/compat.py: ``ray_ends_workers_processes``, issue 55 item 2): the node agent
sends them no signal where it does. No Ray started; the behaviour of each Ray is measured on
a real one in tests/integration/test_agent.py."""

from __future__ import annotations

import pytest

from ray_stream_llm.integrations.ray.compat import (
    PROCESS_GROUPS,
    SUBREAPER,
    ray_ends_workers_processes,
)


@pytest.mark.parametrize(
    ("version", "settings", "ends"),
    [
        # Ray's defaults: per-worker process groups from 2.60 on, nothing before
        ("2.48.0", {}, False),
        ("2.54.1", {}, False),
        ("2.59.0", {}, False),
        ("2.60.0", {}, True),
        ("2.60.1", {}, True),
        # the process groups turned on where the raylet has the setting, off on 2.60
        ("2.54.1", {PROCESS_GROUPS: "true"}, True),
        ("2.54.1", {PROCESS_GROUPS: "1"}, True),
        ("2.54.1", {PROCESS_GROUPS: True}, True),
        ("2.48.0", {PROCESS_GROUPS: "true"}, False),  # no such setting in 2.48's raylet
        ("2.60.0", {PROCESS_GROUPS: "false"}, False),
        ("2.60.0", {PROCESS_GROUPS: "0"}, False),
        ("2.60.0", {PROCESS_GROUPS: "no"}, False),  # Ray reads only true or 1 as on
        # the subreaper, on any Ray of the range
        ("2.48.0", {SUBREAPER: "true"}, True),
        ("2.48.0", {SUBREAPER: "TRUE"}, True),
        ("2.54.1", {SUBREAPER: "1"}, True),
        ("2.60.0", {PROCESS_GROUPS: "false", SUBREAPER: "true"}, True),
        ("2.48.0", {SUBREAPER: "false"}, False),
    ],
)
def test_ray_ends_a_dead_workers_processes_per_version_and_setting(version, settings, ends):
    assert ray_ends_workers_processes(version, settings) is ends


@pytest.mark.parametrize(
    ("version", "settings", "ends"),
    [
        ("2.48.0", {}, False),
        ("2.54.1", {}, False),
        ("2.60.0", {}, True),
        ("2.54.1", {PROCESS_GROUPS: "true"}, True),
        ("2.60.0", {PROCESS_GROUPS: "false"}, False),
        # the subreaper ends orphans from its raylet: none once that raylet is gone
        ("2.48.0", {SUBREAPER: "true"}, False),
        ("2.60.0", {PROCESS_GROUPS: "false", SUBREAPER: "true"}, False),
    ],
)
def test_a_local_rays_shutdown_ends_its_workers_processes_per_version_and_setting(
    version, settings, ends
):
    assert ray_ends_workers_processes(version, settings, at_shutdown=True) is ends
