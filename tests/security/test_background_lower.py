"""``background_lower = "run"`` under a real driver user (drivers/lowering.py).

A step worker lowered only around its runs must return to normal priority after each:
allowed to a host that npud started as root (RLIMIT_NICE 20, set before it dropped root:
drivers/compile_starve.py), refused without the limit, where the worker stays lowered for
good (as with "thread") instead of failing its steps. Each case runs in a process under a
real unprivileged uid; policies are read with ``os.sched_getscheduler`` on the worker."""

from __future__ import annotations

import os
import threading
from typing import Any

from npumanager.testing import procs
from tests.drivers.test_background_lower import Probe, step
from tests.security.harness import ATTACKER, needs_root
from tests.security.test_compile_starve import needs_the_limit

pytestmark = needs_root

IDLE, OTHER = os.SCHED_IDLE, os.SCHED_OTHER


def _steps() -> dict[str, Any]:
    from npumanager.drivers.steps import StepRunner

    runner = StepRunner("t", 1, inline_limit=1024, max_frame=1 << 20, background_sched="idle",
                        background_lower="run")
    try:
        out: list[Any] = []
        for _ in range(2):
            probe = Probe()
            error, after = step(runner, probe)
            out.append((error, probe.before[0][0], probe.inside[0][0], after[0]))
        return {"uid": os.getuid(), "steps": out,
                "me": os.sched_getscheduler(threading.get_native_id())}
    finally:
        runner.close()


def _as_driver_user(limit: int) -> dict[str, Any]:
    import resource

    resource.setrlimit(resource.RLIMIT_NICE, (limit, limit))  # inherited by the fork
    try:
        got: dict[str, Any] = procs.run_as(ATTACKER, None, _steps, timeout=60)
        return got
    finally:
        resource.setrlimit(resource.RLIMIT_NICE, (0, 0))


@needs_the_limit
def test_with_the_limit_the_worker_returns_to_normal_after_each_run() -> None:
    got = _as_driver_user(20)
    assert got["uid"] == ATTACKER, got
    assert got["steps"] == [(None, OTHER, IDLE, OTHER)] * 2, got
    assert got["me"] == OTHER


def test_without_the_limit_the_worker_stays_lowered_and_its_steps_run() -> None:
    got = _as_driver_user(0)
    assert got["uid"] == ATTACKER, got
    assert got["steps"] == [(None, IDLE, IDLE, IDLE)] * 2, got


def test_as_root_the_worker_returns_to_normal() -> None:
    got: dict[str, Any] = procs.run_as(None, None, _steps, timeout=60)
    assert got["steps"] == [(None, OTHER, IDLE, OTHER)] * 2, got


