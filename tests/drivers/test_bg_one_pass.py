"""``background_one_pass`` in the host's shell (drivers/state_repeat.py): a BACKGROUND
burst's repeats take the one-pass admission, with the same records as without it (the
state-level twin test holds the one pass to the fast path event for event)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from npumanager.drivers.state import DriverState

from .test_bg_handback import records
from .test_burst_shell import burst_served
from .test_host_shell import Stack, run


def test_a_background_bursts_repeats_take_the_one_pass_with_the_same_records(
        runtime_dir: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """BACKGROUND burst executions (the test's uid is below the foreground threshold),
    their steps on the burst's thread (background_burst_here = "normal"): with the key
    the repeats are admitted in one pass, each a background step; without it none; the
    state's decisions, counts, jobs, ledger and the reports to npud are the same."""
    n = 6
    real = DriverState.repeat_begin

    def served_with(one_pass: bool) -> tuple[int, Any]:
        taken: list[bool] = []

        def counting(self: DriverState, *args: Any) -> Any:
            step = real(self, *args)
            if step is not None:
                taken.append(step.background)
            return step

        monkeypatch.setattr(DriverState, "repeat_begin", counting)
        got: list[Any] = []

        async def body(s: Stack) -> None:
            async with burst_served(s, runtime_dir, n):
                got.append(records(s))

        run(runtime_dir, state_dir, body, inline_run_us=0, background_burst_here="normal",
            background_one_pass=one_pass)
        assert all(taken), taken
        return len(taken), got[0]

    taken_on, with_it = served_with(True)
    taken_off, without = served_with(False)
    assert taken_on > 0 and taken_off == 0
    assert with_it == without
