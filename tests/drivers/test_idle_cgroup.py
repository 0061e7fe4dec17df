"""Which background threads join the host's cpu.idle cgroup (hal/idle_cgroup.py), decided
without a cgroup fs: a fake group of plain files records the ids the host writes."""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from npumanager.drivers.base import PreparedModel
from npumanager.drivers.events import RunStep
from npumanager.drivers.steps import Execution, StepRunner
from npumanager.hal import idle_cgroup
from npumanager.hal.idle_cgroup import BOOST, COMPILE, COMPILE_CHILD, STEP, IdleGroup, joins
from npumanager.testing.fake_cgroup import fake_group, written
from npumanager.testing.onnx_models import matmul_model


def test_only_what_stays_background_joins_and_only_at_sched_idle() -> None:
    assert joins(STEP, "idle") and joins(COMPILE, "idle")
    assert joins(COMPILE_CHILD, "idle")
    # The host could not take it out again to raise it: it stays out.
    assert not joins(COMPILE_CHILD, "idle", child_can_raise=True)
    assert not joins(BOOST, "idle")  # a starved step's normal-priority thread
    for sched in ("nice", "normal", "share"):
        assert not any(joins(k, sched) for k in (STEP, COMPILE, COMPILE_CHILD, BOOST))


def test_the_v1_cpu_hierarchy_is_found_in_the_mounts() -> None:
    mounts = ("cgroup2 /sys/fs/cgroup/unified cgroup2 rw 0 0\n"
              "cgroup /sys/fs/cgroup/cpuacct cgroup rw,cpuacct 0 0\n"
              "cgroup /sys/fs/cgroup/cpu,cpuacct cgroup rw,relatime,cpu,cpuacct 0 0\n")
    assert idle_cgroup.v1_cpu_root(mounts) == Path("/sys/fs/cgroup/cpu,cpuacct")
    assert idle_cgroup.v1_cpu_root("cgroup2 /sys/fs/cgroup cgroup2 rw 0 0\n") is None


def test_group_names_carry_npuds_pid_and_a_safe_host_name() -> None:
    assert idle_cgroup.group_name("reference", 42) == "npumanager-bg.42.reference"
    assert idle_cgroup.group_name("../x y", 7) == "npumanager-bg.7.___x_y"


def test_only_empty_groups_of_npuds_that_are_gone_are_removed(tmp_path: Path) -> None:
    dead = 2 ** 22 + 12345  # above pid_max's usual 4194304: no such process
    gone = tmp_path / f"npumanager-bg.{dead}.reference"
    live = tmp_path / f"npumanager-bg.{os.getpid()}.reference"
    busy = tmp_path / f"npumanager-bg.{dead}.other"
    other = tmp_path / "someone-elses"
    for d in (gone, live, busy, other):
        d.mkdir()
    (busy / "tasks").touch()  # (a real group with threads refuses rmdir the same way)
    idle_cgroup.remove_stale(tmp_path)
    assert not gone.exists()
    assert live.exists() and busy.exists() and other.exists()


def _runner(group: IdleGroup, starve_ms: int = 0) -> StepRunner:
    return StepRunner("t", 2, inline_limit=1024, max_frame=1 << 20, background_sched="idle",
                      background_starve_ms=starve_ms, idle_group=group)


class TidProbe(PreparedModel):
    """Records the native id of the thread that runs it."""

    inputs: list[Any] = []
    outputs: list[Any] = []
    memory_bytes = 0

    def __init__(self) -> None:
        self.tid = 0

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.tid = threading.get_native_id()
        return {"y": np.zeros(1, np.float32)}

    def release(self) -> None:
        pass


def _step(runner: StepRunner, background: bool) -> int:
    """Run one step; the native id of the thread that ran it."""
    probe = TidProbe()
    done = threading.Event()
    runner.start(Execution(1, probe, {"x": np.zeros(1, np.float32)}, {}),
                 RunStep(1, 0, True, False, background=background),
                 lambda error, us: done.set())
    assert done.wait(60)
    return probe.tid


def test_background_step_workers_join_foreground_and_boosted_ones_do_not(
        tmp_path: Path) -> None:
    group = fake_group(tmp_path)
    runner = _runner(IdleGroup(str(group), "idle"), starve_ms=1000)
    try:
        fg = _step(runner, background=False)
        assert written(group) == []
        bg = _step(runner, background=True)
        assert bg in written(group)  # the SCHED_IDLE worker that ran it joined at its start
        assert os.sched_getscheduler(bg) == os.SCHED_IDLE
        with runner._guard_lock:
            runner.guard._owed = True  # a step starved: the next runs at normal priority
        boosted = _step(runner, background=True)
        assert boosted != bg and boosted not in written(group) and fg not in written(group)
        assert os.sched_getscheduler(boosted) == os.SCHED_OTHER
    finally:
        runner.close()
    assert written(group, "cgroup.procs") == []


def test_without_a_group_or_with_another_policy_nothing_is_written(tmp_path: Path) -> None:
    group = fake_group(tmp_path)
    for g in (IdleGroup("", "idle"), IdleGroup(str(group), "nice")):
        assert not g.join_this_thread(STEP)
        assert not g.join_process(os.getpid(), can_raise=False)
    assert written(group) == [] and written(group, "cgroup.procs") == []


def test_a_group_that_cannot_be_written_is_logged_once_and_the_host_goes_on(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    g = IdleGroup(str(tmp_path / "gone"), "idle")
    with caplog.at_level(logging.WARNING, "npumanager.hal.idle_cgroup"):
        assert not g.join_this_thread(STEP)
        assert not g.join_this_thread(COMPILE)
        assert not g.join_process(os.getpid(), can_raise=False)
    assert len([r for r in caplog.records if "SCHED_IDLE only" in r.message]) == 1
    assert g.joined == 0


def test_the_compile_child_joins_only_where_its_bound_cannot_raise_it(tmp_path: Path) -> None:
    from npumanager.drivers.compile_worker import CompileWorker

    group = fake_group(tmp_path)
    worker = CompileWorker("cg-test", "idle", 10, starve_ms=0,
                           idle_group=IdleGroup(str(group), "idle"))
    try:
        worker.compile(matmul_model(dim=8, depth=1), level=99, threads=1, n_model=1,
                       n_data=1, max_bytes=1 << 30)
        assert written(group, "cgroup.procs") == [worker.pid]
    finally:
        worker.close()
    assert written(group) == []
