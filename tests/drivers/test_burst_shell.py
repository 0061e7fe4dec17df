"""Bursts in the driver host's shell, in-process on a virtual clock: a burst execution
wakes only its own thread (never the event loop) while its uid's work stays inside a
debounce window, what it leaves for the loop is carried out in the state's order once
its reply is out, and BACKGROUND steps that go to the lowered workers are answered
from there. The app side is the real SDK (``nn``) on a thread, over the real socket."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from npumanager import nn
from npumanager.hal.types import EndReason

from .test_host_shell import Stack, X, run, settle, uid


def loop_handoffs(s: Stack) -> list[str]:
    """Record every callback the host hands to its loop from another thread (its
    wake-ups caused by bursts and workers), by name; the test's own threads' are not."""
    loop = s.host.loop
    seen: list[str] = []
    real = loop.call_soon_threadsafe
    host = (s.host, s.host.res)

    def spy(callback: Callable[..., object], *args: Any, **kw: Any) -> Any:
        if getattr(callback, "__self__", None) in host:
            seen.append(getattr(callback, "__name__", repr(callback)))
        return real(callback, *args, **kw)

    loop.call_soon_threadsafe = spy  # type: ignore[method-assign]
    return seen


def test_a_stream_inside_its_debounce_window_never_wakes_the_event_loop(
        runtime_dir: Path, state_dir: Path) -> None:
    async def body(s: Stack) -> None:
        await s.grant("g1", uid())
        handoffs = loop_handoffs(s)
        dev = await asyncio.to_thread(nn.device, "gated", runtime_dir)
        try:
            model = await asyncio.to_thread(dev.prepare_model, b"cheap", "g1")
            burst = await asyncio.to_thread(model.burst)

            def execute() -> Any:
                return burst.execute({"x": X})["y"]

            first = await asyncio.to_thread(execute)
            np.testing.assert_array_equal(first, X + 1)
            await settle()
            # The first execution of the stream reported requested/started: handed to
            # the loop once, after its reply, in one batch (with the debounce timer).
            assert handoffs == ["_carry_out_locked"], handoffs
            assert [m for m, _ in s.pushes] == ["requested", "started"], s.pushes
            for _ in range(6):  # the virtual clock stands still: one debounce window
                np.testing.assert_array_equal(await asyncio.to_thread(execute), X + 1)
            await settle()
            # Three BACKGROUND steps on the lowered workers (answered from there), then
            # inline on the burst's own thread once measured cheap: no loop hand-off.
            threads = s.driver.models[0].threads
            assert all(t.startswith("npu-gated-bg") for t in threads[:3]), threads
            assert {t.split("-")[1] for t in threads[3:]} == {"burst"}, threads
            assert handoffs == ["_carry_out_locked"], handoffs
            assert s.ends() == [], "the window is still open"
            s.clock.advance(0.051)
            await settle()
            assert s.ends() == [int(EndReason.COMPLETED)], s.pushes
            await asyncio.to_thread(burst.close)
        finally:
            await asyncio.to_thread(dev.close)

    run(runtime_dir, state_dir, body)


def test_what_a_burst_left_for_the_loop_goes_first_and_once(
        runtime_dir: Path, state_dir: Path) -> None:
    async def body(s: Stack) -> None:
        await s.grant("g1", uid())
        loop = s.host.loop
        withheld: list[tuple[Callable[..., object], tuple[Any, ...]]] = []
        real = loop.call_soon_threadsafe

        def withhold(callback: Callable[..., object], *args: Any, **kw: Any) -> Any:
            if getattr(callback, "__name__", "") == "_carry_out_locked":
                withheld.append((callback, args))  # the burst's hand-off is late
                return None
            return real(callback, *args, **kw)

        loop.call_soon_threadsafe = withhold  # type: ignore[method-assign]
        dev = await asyncio.to_thread(nn.device, "gated", runtime_dir)
        try:
            model = await asyncio.to_thread(dev.prepare_model, b"cheap", "g1")
            burst = await asyncio.to_thread(model.burst)
            await asyncio.to_thread(burst.execute, {"x": X})
            await settle()
            assert len(withheld) == 1 and s.pushes == [], (withheld, s.pushes)
            # The loop's next own carrying out (a plain execute of the same uid, inside
            # the window: it reports nothing itself) first does what the burst left.
            await asyncio.to_thread(model.execute, {"x": X})
            await settle()
            (burst_work,) = {w for _, (w, _) in s.pushes}
            assert [m for m, _ in s.pushes] == ["requested", "started"], s.pushes
            callback, args = withheld.pop()
            callback(*args)  # the late hand-off finds nothing left: nothing twice
            s.clock.advance(0.051)
            await settle()
            assert [m for m, _ in s.pushes] == ["requested", "started", "ended"], s.pushes
            assert s.pushes[0][1][0] == burst_work
            await asyncio.to_thread(burst.close)
        finally:
            await asyncio.to_thread(dev.close)

    run(runtime_dir, state_dir, body)
