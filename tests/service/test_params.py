"""ManagerParams from the config: defaults, overrides, thermal knobs, bad values."""

from __future__ import annotations

import pytest

from npumanager.constants import Policy, ThermalStatus
from npumanager.errors import InvalidArgument
from npumanager.service.policy import ManagerParams


def test_from_config_reads_defaults() -> None:
    from npumanager.config import Config

    p = ManagerParams.from_config(Config())
    assert p.policy.policy is Policy.BUDGET
    assert p.max_budget == 4 and dict(p.weights) == {0: 1, 1: 2, 2: 4}
    assert p.unload_deadline_s == 5.0 and p.max_queue_wait_s == 0.0
    assert p.max_requests_per_uid == 256 and p.default_importance == 1000
    assert p.size_bytes == {0: 1 << 30, 1: 2 << 30, 2: 4 << 30}
    assert p.thermal_budget_scale[ThermalStatus.MODERATE] == 0.75
    assert p.thermal_keep_rank[ThermalStatus.SEVERE] == 230
    assert p.thermal_keep_rank[ThermalStatus.MODERATE] is None
    assert p.thermal_keep_rank[ThermalStatus.SHUTDOWN] == -1
    assert p.opportunistic_wait_from is ThermalStatus.MODERATE


def test_from_config_overrides_and_rejects_bad_values() -> None:
    from npumanager.config import Config

    cfg = Config.load(
        overrides={
            "policy": {"name": "turn_taking"},
            "manager": {"unload_deadline_s": 1.5, "max_queue_wait_s": 9},
        }
    )
    p = ManagerParams.from_config(cfg)
    assert p.policy.policy is Policy.TURN_TAKING and p.max_budget == 1
    assert p.unload_deadline_s == 1.5 and p.max_queue_wait_s == 9.0
    for bad in ({"name": "nope"}, {"max_budget": 0}, {"weights": {"2": -1}}):
        with pytest.raises(InvalidArgument):
            ManagerParams.from_config(Config.load(overrides={"policy": bad}))


def test_from_config_thermal_knobs() -> None:
    from npumanager.config import Config

    cfg = Config.load(
        overrides={
            "policy": {
                "thermal_budget_scale": {"moderate": 0.5, "4": 0.1},
                "thermal_keep_rank": {"severe": 1000000, "critical": 300},
                "opportunistic_wait_from": "severe",
                "size_bytes": {"0": 512},
            }
        }
    )
    p = ManagerParams.from_config(cfg)
    assert p.thermal_budget_scale[ThermalStatus.MODERATE] == 0.5
    assert p.thermal_budget_scale[ThermalStatus.CRITICAL] == 0.1
    assert p.thermal_keep_rank[ThermalStatus.SEVERE] is None
    assert p.thermal_keep_rank[ThermalStatus.CRITICAL] == 300
    assert p.opportunistic_wait_from is ThermalStatus.SEVERE
    assert p.size_bytes[0] == 512
    for bad in (
        {"thermal_budget_scale": {"moderate": 2.0}},
        {"thermal_budget_scale": {"lukewarm": 0.5}},
        {"thermal_keep_rank": {"severe": -5}},
        {"size_bytes": {"0": 0}},
    ):
        with pytest.raises(InvalidArgument):
            ManagerParams.from_config(Config.load(overrides={"policy": bad}))
