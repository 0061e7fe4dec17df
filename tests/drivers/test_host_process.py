"""service.host_process: npud's handle on a driver host, on asyncio's loop and on
uvloop's, with a pidfd and with the polling fallback where none can be had. The case the
old private-attribute disown() guarded: a disowned host outlives its handle, the loop and
a garbage collection (asyncio's subprocess transport killed such a child on close)."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from npumanager.service import host_process
from npumanager.service.host_process import HostProcess
from npumanager.testing.daemon import process_running

CHILD = [sys.executable, "-c",
         "import sys, time; print('child ready', flush=True); time.sleep(120)"]


def _loops() -> list[Any]:
    factories: list[Any] = [pytest.param(asyncio.new_event_loop, id="asyncio")]
    try:
        import uvloop

        factories.append(pytest.param(uvloop.new_event_loop, id="uvloop"))
    except ImportError:
        factories.append(pytest.param(None, id="uvloop", marks=pytest.mark.skip(
            reason="uvloop is not installed")))
    return factories


@pytest.fixture(params=["pidfd", "polling"])
def watch(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "polling":
        def refused(pid: int, flags: int = 0) -> int:
            raise PermissionError(1, "pidfd_open refused (seccomp)")
        monkeypatch.setattr(host_process.os, "pidfd_open", refused)
    return str(request.param)


@pytest.fixture(params=_loops())
def loop_factory(request: pytest.FixtureRequest) -> Callable[[], asyncio.AbstractEventLoop]:
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
def stray() -> Iterator[list[int]]:
    """Pids a test leaves running on purpose: killed at the end."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _run(loop_factory: Callable[[], asyncio.AbstractEventLoop], coro: Any) -> Any:
    loop = loop_factory()
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.close()


def test_ready_line_terminate_and_exit_status(
        watch: str, loop_factory: Callable[[], asyncio.AbstractEventLoop]) -> None:
    async def main() -> tuple[bytes, int, int | None]:
        proc = await HostProcess.spawn(CHILD)
        line = await proc.stdout.readline()
        proc.terminate()
        code = await proc.wait()
        proc.kill()  # exited: a no-op, never a signal to a reused pid
        proc.close_stdout()  # the owner's part (the supervisor's _stop_process)
        return line, code, proc.returncode

    assert _run(loop_factory, main()) == (b"child ready\n", -signal.SIGTERM, -signal.SIGTERM)


def test_an_exit_of_its_own_is_seen_and_the_pipe_ends(
        watch: str, loop_factory: Callable[[], asyncio.AbstractEventLoop]) -> None:
    async def main() -> tuple[bytes, int]:
        proc = await HostProcess.spawn([sys.executable, "-c", "raise SystemExit(3)"])
        code = await proc.wait()
        out = await proc.stdout.read()
        proc.close_stdout()
        return out, code

    assert _run(loop_factory, main()) == (b"", 3)


def test_a_disowned_host_outlives_its_handle_the_loop_and_a_collection(
        watch: str, loop_factory: Callable[[], asyncio.AbstractEventLoop],
        stray: list[int]) -> None:
    async def main() -> int:
        proc = await HostProcess.spawn(CHILD)
        stray.append(proc.pid)
        assert await proc.stdout.readline() == b"child ready\n"
        proc.disown()
        return proc.pid

    pid = _run(loop_factory, main())
    gc.collect()
    assert process_running(pid)
