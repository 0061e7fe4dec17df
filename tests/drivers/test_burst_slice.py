"""``foreground_slice_us`` and ``model.burst(slice_us=...)`` (hal/sched_slice.py): the
driver's burst thread gets the slice while it serves FOREGROUND steps, and the app's
executing thread gets the one it asked for; BACKGROUND streams and the defaults leave the
kernel's. In-process host on a virtual clock, the real SDK over the real socket."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from npumanager import nn
from npumanager.errors import InvalidArgument
from npumanager.hal import sched_slice as ss

from .test_host_shell import Stack, X, run, uid

DEFAULT = ss.slice_ns()
pytestmark = pytest.mark.skipif(not DEFAULT, reason="no per-task EEVDF slice (Linux < 6.12)")


def _stream(dev: nn.Device, slice_us: int) -> tuple[int | None, bool, int | None]:
    """On one thread: a burst executed three times; that thread's slice after them, the
    burst's ``sliced``, and the thread's slice once the burst closed."""
    model = dev.prepare_model(b"cheap", "g1")
    burst = model.burst(slice_us=slice_us)
    for _ in range(3):
        np.testing.assert_array_equal(burst.execute({"x": X})["y"], X + 1)
    during, sliced = ss.slice_ns(), burst.sliced
    burst.close()
    return during, sliced, ss.slice_ns()


@pytest.mark.parametrize(("foreground", "host_us", "app_us"),
                         [(True, 300, 0), (False, 300, 0), (True, 0, 200), (True, 150, 100)])
def test_the_burst_thread_and_the_app_thread_get_their_slices(
        runtime_dir: Path, state_dir: Path, foreground: bool, host_us: int,
        app_us: int) -> None:
    seen: dict[str, object] = {}

    async def body(s: Stack) -> None:
        await s.grant("g1", uid())
        dev = await asyncio.to_thread(nn.device, "gated", runtime_dir)
        try:
            # (the burst's thread is still serving when the client has its last answer:
            # its slice is read while the burst is open, from the client's thread)
            def stream_and_look() -> tuple[tuple[int | None, bool, int | None], int | None]:
                model = dev.prepare_model(b"cheap", "g1")
                with model.burst() as b:
                    for _ in range(3):
                        b.execute({"x": X})
                    server = next(iter(s.host.bursts._servers.values()))
                    tid = server.thread.native_id
                    assert tid is not None
                    burst_thread = ss.slice_ns(tid)
                model.release()
                return _stream(dev, app_us), burst_thread

            seen["app"], seen["host"] = await asyncio.to_thread(stream_and_look)
        finally:
            await asyncio.to_thread(dev.close)

    # (the test's uid has no scheduling config: its work is FOREGROUND only when the
    # foreground threshold takes in every priority)
    run(runtime_dir, state_dir, body, foreground_slice_us=host_us,
        foreground_priority=1000 if foreground else 200)
    want_host = host_us * 1000 if foreground and host_us else DEFAULT
    assert seen["host"] == want_host
    during, sliced, after = seen["app"]  # type: ignore[misc]
    assert (during, sliced) == ((app_us * 1000, True) if app_us else (DEFAULT, False))
    assert after == DEFAULT  # a close on the executing thread gives the kernel's back


@pytest.mark.parametrize("us", [-5, 50, 200_000])
def test_a_burst_refuses_a_slice_outside_the_kernels_range(
        runtime_dir: Path, state_dir: Path, us: int) -> None:
    async def body(s: Stack) -> None:
        await s.grant("g1", uid())
        dev = await asyncio.to_thread(nn.device, "gated", runtime_dir)
        try:
            model = await asyncio.to_thread(dev.prepare_model, b"cheap", "g1")
            with pytest.raises(InvalidArgument):
                model.burst(slice_us=us)
            assert not s.host.bursts._servers  # nothing was opened
        finally:
            await asyncio.to_thread(dev.close)

    run(runtime_dir, state_dir, body)
