"""``background_burst_here`` (drivers/bg_here.py): a BACKGROUND burst step the state starts
at once runs on the burst's own thread, lowered (SCHED_IDLE) only for the run. The
lowering alone (tried once per thread; a thread that may not return is never lowered),
the runner's starvation bound, then the host's shell with a real SDK client over the real
socket: which thread ran each step and at what policy, and the same records as through
the lowered workers."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from npumanager import nn
from npumanager.drivers.base import PreparedModel, TensorSpec
from npumanager.drivers.bg_here import this_thread
from npumanager.drivers.events import RunStep
from npumanager.drivers.lowering import RunLowering
from npumanager.drivers.steps import Execution, StepRunner
from npumanager.nn.burst import Burst

from .test_bg_handback import records
from .test_burst_shell import close, served
from .test_host_shell import Stack, X, run, uid

pytestmark = pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="Linux policies")


def policy() -> int:
    return os.sched_getscheduler(threading.get_native_id())


def on_a_thread(fn: Any) -> Any:
    """``fn()`` on a fresh thread (each thread tries its lowering once), its result."""
    box: list[Any] = []
    t = threading.Thread(target=lambda: box.append(fn()))
    t.start()
    t.join()
    return box[0]


def test_a_thread_lowers_itself_for_a_run_and_returns() -> None:
    def body() -> tuple[Any, ...]:
        low = this_thread("idle", 19)
        assert isinstance(low, RunLowering) and this_thread("idle", 19) is low  # once
        before = policy()
        low.lower()
        inside = policy()
        low.restore()
        return before, inside, policy()

    assert on_a_thread(body) == (os.SCHED_OTHER, os.SCHED_IDLE, os.SCHED_OTHER)

    def niced() -> tuple[int, int]:
        low = this_thread("nice", 15)
        assert low is not None
        low.lower()
        inside = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        low.restore()
        return inside, os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    assert on_a_thread(niced) == (15, 0)
    # Policies that lower nothing here: the workers decide.
    assert on_a_thread(lambda: this_thread("normal", 19)) is None
    assert on_a_thread(lambda: this_thread("share", 19)) is None


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to take another uid")
def test_a_thread_that_could_not_return_is_never_lowered() -> None:
    """Another uid with RLIMIT_NICE 0 (the default for a user's process): this_thread
    says no, and the thread is still SCHED_OTHER afterwards; ``unlowered`` (mode
    "normal") still gives a switch, one that changes nothing."""
    code = ("import os, resource, threading\n"
            "resource.setrlimit(resource.RLIMIT_NICE, (0, 0))\n"
            "os.setgid(65534); os.setuid(65534)\n"
            "from npumanager.drivers.bg_here import this_thread\n"
            "print(this_thread('idle', 19), os.sched_getscheduler(0) == os.SCHED_OTHER)\n"
            # "normal" lowers nothing, so it needs no limit: its switch works both ways.
            "from npumanager.drivers.bg_here import unlowered\n"
            "low = unlowered(); low.lower(); low.restore()\n"
            "print(low is unlowered(), os.sched_getscheduler(0) == os.SCHED_OTHER,\n"
            "      os.getpriority(os.PRIO_PROCESS, 0))\n")
    root = str(Path(__file__).resolve().parents[2])
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd="/", env={**os.environ, "PYTHONPATH": root}, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["None", "True", "True", "True", "0"]


class Seen(PreparedModel):
    """y = x + 1, noting the policy of the thread that runs it."""

    def __init__(self) -> None:
        self.inputs = [TensorSpec("x", "float32", (1, 4))]
        self.outputs = [TensorSpec("y", "float32", (1, 4))]
        self.memory_bytes = 4096
        self.policies: list[int] = []

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.policies.append(policy())
        return {"y": inputs["x"] + 1}

    def release(self) -> None:
        pass


def test_the_runner_lowers_for_the_run_unless_the_starvation_bound_boosts_it() -> None:
    runner = StepRunner("t", 1, inline_limit=1 << 20, max_frame=1 << 20,
                        background_sched="idle", background_starve_ms=50)
    model = Seen()
    step = RunStep(1, step=0, last=False, inline=False, background=True)

    def steps() -> list[int]:
        low = this_thread("idle", 19)
        assert low is not None
        after = []
        for _ in range(2):
            ex = Execution(1, model, {"x": X}, {})
            assert runner.run_here(ex, step, low)[0] is None
            after.append(policy())
        # A step that waited past the bound (its wall time less its CPU time) ended: the
        # next one runs at normal priority (drivers/starve.py), the one after lowered.
        with runner._guard_lock:
            runner.guard._owed = True
        for _ in range(2):
            assert runner.run_here(Execution(1, model, {"x": X}, {}), step, low)[0] is None
            after.append(policy())
        return after

    try:
        assert on_a_thread(steps) == [os.SCHED_OTHER] * 4
        assert model.policies == [os.SCHED_IDLE, os.SCHED_IDLE, os.SCHED_OTHER,
                                  os.SCHED_IDLE]
        assert runner.background_stats()["boosted"] == 1
    finally:
        runner.close()


# --- the host's shell -----------------------------------------------------------------


def niceness() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


@pytest.mark.parametrize("mode", ["lowered", "nice", "normal"])
def test_a_background_bursts_steps_run_on_its_thread_lowered_with_the_same_records(
        runtime_dir: Path, state_dir: Path, mode: str) -> None:
    """BACKGROUND burst executions (the test's uid is below the foreground threshold)
    that are never inline (inline_run_us = 0): with background_burst_here each step runs
    on the burst's own thread, at SCHED_IDLE ("lowered", background_sched "idle") or
    nice 19 ("nice"), and that thread is back at normal priority between runs; without
    it on the lowered workers. The state's decisions, counts, jobs, ledger and reports
    to npud are the same either way."""
    n = 5

    def served_with(here: str) -> tuple[Any, ...]:
        got: list[Any] = []

        async def body(s: Stack) -> None:
            await s.grant("g1", uid())
            dev = await asyncio.to_thread(nn.device, "gated", runtime_dir)
            burst: Burst | None = None
            try:
                model = await asyncio.to_thread(dev.prepare_model, b"cheap", "g1")
                gated = s.driver.models[0]
                seen: list[tuple[str, int, int]] = []
                plain = gated.run

                def noting(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
                    seen.append((threading.current_thread().name, policy(), niceness()))
                    return plain(inputs)

                gated.run = noting  # type: ignore[method-assign]
                burst = await asyncio.to_thread(model.burst)
                for i in range(n):
                    out = await asyncio.to_thread(burst.execute, {"x": X + i})
                    np.testing.assert_array_equal(out["y"], X + i + 1)
                await served(s, n)
                [server] = list(s.host.bursts._servers.values())
                tid = server.thread.native_id
                assert tid is not None
                between = (os.sched_getscheduler(tid), os.getpriority(os.PRIO_PROCESS, tid))
                got.append((seen, between, records(s)))
            finally:
                await close(burst, dev)

        run(runtime_dir, state_dir, body, inline_run_us=0, background_burst_here=here,
            background_nice=19)
        return tuple(got[0])

    seen_here, between, with_here = served_with(mode)
    seen_workers, _, without = served_with("off")
    inside = {"lowered": (os.SCHED_IDLE, 0), "nice": (os.SCHED_OTHER, 19),
              "normal": (os.SCHED_OTHER, 0)}[mode]
    assert [(p, nc) for _, p, nc in seen_here] == [inside] * n
    assert all(t.startswith("npu-burst-") for t, _, _ in seen_here), seen_here
    assert between == (os.SCHED_OTHER, 0)
    assert all(t.startswith("npu-gated-bg") for t, _, _ in seen_workers), seen_workers
    assert with_here == without
