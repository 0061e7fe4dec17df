"""``background_burst_here = "normal-pass"`` (drivers/bg_pass.py): two bursts of one
BACKGROUND model with executions in flight at once on one channel, so one waits for the
other's step. With "normal" the waiting execution's step, started by the state when the
other's ends, runs on a lowered worker; with "normal-pass" the burst thread that ended
the step runs it after its own answer, and every answer is still the right one. The
host's shell with a real SDK client over the real socket."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from npumanager import nn
from npumanager.drivers import bg_pass
from npumanager.drivers.events import RunStep
from npumanager.drivers.steps import Execution
from npumanager.nn.burst import Burst

from .test_burst_shell import close
from .test_host_shell import Stack, X, run, uid


def threads_that_ran(runtime_dir: Path, state_dir: Path, mode: str, n: int = 6
                     ) -> list[str]:
    """Two bursts, each on a thread of the app executing ``n`` times at once with the
    other (each run 20 ms, so one always waits for the channel): the name of the driver
    thread that ran each step."""
    got: list[str] = []

    async def body(s: Stack) -> None:
        await s.grant("g1", uid())
        dev = await asyncio.to_thread(nn.device, "gated", runtime_dir)
        bursts: list[Burst] = []
        try:
            model = await asyncio.to_thread(dev.prepare_model, b"cheap", "g1")
            gated = s.driver.models[0]
            plain = gated.run

            def noting(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
                got.append(threading.current_thread().name)
                time.sleep(0.02)
                return plain(inputs)

            gated.run = noting  # type: ignore[method-assign]
            bursts = [await asyncio.to_thread(model.burst) for _ in range(2)]

            def stream(k: int) -> None:
                for i in range(n):
                    x = X + 10 * k + i
                    out = bursts[k].execute({"x": x})
                    np.testing.assert_array_equal(out["y"], x + 1)

            await asyncio.gather(*(asyncio.to_thread(stream, k) for k in range(2)))
        finally:
            for b in bursts:
                await asyncio.to_thread(b.close)
            await close(None, dev)

    run(runtime_dir, state_dir, body, inline_run_us=0, background_burst_here=mode)
    return got


def test_a_waiting_bursts_step_runs_on_the_thread_that_ended_the_step_before(
        runtime_dir: Path, state_dir: Path) -> None:
    passed = threads_that_ran(runtime_dir, state_dir, "normal-pass")
    assert len(passed) == 12
    assert all(t.startswith("npu-burst-") for t in passed), passed
    # Both bursts' threads ran steps, and (one channel, runs overlapping) some were the
    # other burst's: the two threads took turns.
    assert len(set(passed)) == 2
    plain = threads_that_ran(runtime_dir, state_dir, "normal")
    assert len(plain) == 12
    assert any(t.startswith("npu-gated-bg") for t in plain), plain


def test_only_a_step_whose_burst_waits_for_a_handback_is_passed() -> None:
    class Hb:
        pass

    ex = Execution(1, None, {}, {})
    step = RunStep(1, step=0, last=True, inline=False, background=True)
    assert not bg_pass.passable(None, step)
    assert not bg_pass.passable(ex, step)  # (no hand-back: not a burst's)
    ex.handback = Hb()  # type: ignore[assignment]
    assert not bg_pass.passable(ex, step)  # (its burst does not run steps itself)
    ex.bg_here = 1
    assert bg_pass.passable(ex, step)
    for other in (RunStep(1, step=0, last=True, inline=True, background=True),
                  RunStep(1, step=0, last=True, inline=False, background=False),
                  RunStep(1, step=0, last=True, inline=False, background=True, lane=0),
                  RunStep(1, step=0, last=True, inline=False, background=True,
                          yields=True)):
        assert not bg_pass.passable(ex, other), other
    bg_pass.keep(ex, step)
    assert bg_pass.take() == [(ex, step)]
    assert bg_pass.take() == []


@pytest.fixture(autouse=True)
def _nothing_kept() -> Any:
    yield
    assert bg_pass.take() == []
