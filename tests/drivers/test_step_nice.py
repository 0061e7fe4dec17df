"""``background_step_nice`` (drivers/classes.step_policy): the background step workers at
a nice value while the compile and load threads stay SCHED_IDLE, observed on the real
kernel from inside a step's run."""

from __future__ import annotations

import os

import pytest

from npumanager.config import Config
from npumanager.drivers.bg_threads import background_pool
from npumanager.drivers.classes import step_policy
from npumanager.drivers.steps import StepRunner
from npumanager.hal.host_config import HostConfig
from tests.drivers.test_background_lower import BASE, Probe, policy, step


def test_step_policy_changes_only_idle_steps() -> None:
    assert step_policy("idle", 10, -1) == ("idle", 10)
    assert step_policy("idle", 10, 19) == ("nice", 19)
    assert step_policy("idle", 10, 0) == ("nice", 0)
    # (nice, normal and share steps already are what they say)
    assert step_policy("nice", 10, 19) == ("nice", 10)
    assert step_policy("normal", 10, 19) == ("normal", 10)
    assert step_policy("share", 10, 19) == ("share", 10)
    for bad in (-2, 20):
        with pytest.raises(ValueError, match="background_step_nice"):
            step_policy("idle", 10, bad)


def test_steps_run_at_the_nice_value_while_loads_stay_sched_idle() -> None:
    cfg = Config.load(None, {"driver": [{"name": "ref", "plugin": "reference",
                                         "background_step_nice": 19}]})
    hc = HostConfig.from_config(cfg, "ref")
    assert (hc.background_sched, hc.background_step_nice) == ("idle", 19)
    sched, nice = step_policy(hc.background_sched, hc.background_nice,
                              hc.background_step_nice)
    runner = StepRunner("t", 1, inline_limit=1024, max_frame=1 << 20,
                        background_sched=sched, background_nice=nice)
    loads = background_pool(1, "npu-t-bgcompile", hc.background_sched, hc.background_nice)
    try:
        probe = Probe()
        error, after = step(runner, probe)
        assert error is None
        lowered = (os.SCHED_OTHER, min(19, BASE[1] + 19))
        assert probe.inside == [lowered] and after == lowered
        assert loads.submit(policy).result(10) == (os.SCHED_IDLE, BASE[1])
        fg = Probe()
        assert step(runner, fg, background=False)[1] == BASE  # foreground: untouched
    finally:
        runner.close()
        loads.shutdown()


def test_default_keeps_steps_sched_idle() -> None:
    hc = HostConfig.from_config(Config.load(None, {}), "reference")
    assert hc.background_step_nice == -1
    assert step_policy(hc.background_sched, hc.background_nice,
                       hc.background_step_nice) == (hc.background_sched, hc.background_nice)
