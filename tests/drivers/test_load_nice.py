"""``background_load_nice`` (drivers/classes.load_policy): a BACKGROUND model's load (the
compile child, every thread of it, and the host's threads that build the session from its
artifacts) at a nice value instead of SCHED_IDLE, where ``background_sched`` is "idle".
Real compile child and ONNX Runtime; the child's policy read from /proc, the session
build's on the thread that built it."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest

from npumanager.config import Config
from npumanager.drivers.base import CompileOptions, PreparedModel
from npumanager.drivers.classes import load_policy
from npumanager.drivers.prepare import Preparer
from npumanager.drivers.reference import ReferenceDriver
from npumanager.hal.host_config import HostConfig
from npumanager.testing.thread_sched import thread_scheds
from tests.drivers.test_compile_worker import mlp, prepare


def test_load_policy_changes_only_idle_loads() -> None:
    assert load_policy("idle", 10, -1) == ("idle", 10)
    assert load_policy("idle", 10, 19) == ("nice", 19)
    assert load_policy("idle", 10, 0) == ("nice", 0)
    # "share" compiles at SCHED_IDLE (fair share is for steps): the key applies there too.
    assert load_policy("share", 10, -1) == ("idle", 10)
    assert load_policy("share", 10, 19) == ("nice", 19)
    # (nice and normal loads already are what they say)
    assert load_policy("nice", 10, 19) == ("nice", 10)
    assert load_policy("normal", 10, 19) == ("normal", 10)
    for bad in (-2, 20):
        with pytest.raises(ValueError, match="background_load_nice"):
            load_policy("idle", 10, bad)


def test_the_default_keeps_loads_sched_idle() -> None:
    hc = HostConfig.from_config(Config.load(None, {}), "reference")
    assert hc.background_load_nice == -1
    assert load_policy(hc.background_sched, hc.background_nice,
                       hc.background_load_nice) == ("idle", hc.background_nice)


class Watched(ReferenceDriver):
    """The reference driver, noting the policy and nice value of each thread that loads."""

    def __init__(self) -> None:
        super().__init__({})
        self.loads: list[tuple[str, int, int]] = []

    def _note(self) -> None:
        self.loads.append((threading.current_thread().name,
                           os.sched_getscheduler(threading.get_native_id()),
                           os.getpriority(os.PRIO_PROCESS, threading.get_native_id())))

    def compile_in_worker(self, worker: Any, onnx: bytes | tuple[int, int],
                          options: CompileOptions, caching: bool,
                          max_bytes: int) -> PreparedModel | None:
        # (on the thread that hands the model to the compile child, then builds the
        # session from its artifacts)
        self._note()
        return super().compile_in_worker(worker, onnx, options, caching, max_bytes)


def policies(pid: int) -> set[tuple[int, int]]:
    """(policy, nice) of every thread of process ``pid``, from the kernel."""
    return set(thread_scheds(pid).values())


def test_a_background_load_runs_at_the_nice_value(tmp_path: Path) -> None:
    """The key on a host whose background is SCHED_IDLE: the compile child's every thread
    and the session build at SCHED_OTHER nice 19; a FOREGROUND load stays at normal
    priority."""
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    driver = Watched()
    cfg = Config.load(None, {"driver": [{"name": "reference", "plugin": "reference",
                                         "background_load_nice": 19}]})
    hc = HostConfig.from_config(cfg, "reference")
    assert (hc.background_sched, hc.background_load_nice) == ("idle", 19)
    p = Preparer(hc, driver, driver.get_number_of_cache_files_needed(), state)
    try:
        got: Any = prepare(p, mlp())  # background: the compile child, then the build
        assert p.worker is not None and p.worker.pid is not None
        assert policies(p.worker.pid) == {(os.SCHED_OTHER, 19)}
        fg = prepare(p, mlp(seed=1), background=False)
        assert got.model is not None and fg.model is not None
    finally:
        p.close()
    (bg_name, bg_pol, bg_nice), = driver.loads
    assert "bgcompile" in bg_name and (bg_pol, bg_nice) == (os.SCHED_OTHER, 19), driver.loads


def test_background_sched_nice_is_left_as_it_is(tmp_path: Path) -> None:
    """Where background_sched is not "idle" the key changes nothing: the load is what
    background_sched says (nice background_nice here)."""
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    driver = Watched()
    hc = HostConfig("reference", background_sched="nice", background_nice=12,
                    background_load_nice=19)
    p = Preparer(hc, driver, driver.get_number_of_cache_files_needed(), state)
    try:
        prepare(p, mlp())
        assert p.worker is not None and p.worker.pid is not None
        assert policies(p.worker.pid) == {(os.SCHED_OTHER, 12)}
    finally:
        p.close()
    assert [(pol, nice) for _, pol, nice in driver.loads] == [(os.SCHED_OTHER, 12)]
