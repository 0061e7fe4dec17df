"""An in-process npud on its own thread and loop, for client tests (fast: no subprocess)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from npumanager.config import Config
from npumanager.service.daemon import Daemon
from npumanager.service.state import ManagerState, RequestState

Watch = tuple[Callable[[ManagerState], bool], threading.Event]


class DaemonThread:
    def __init__(self, runtime_dir: Path, **manager: Any) -> None:
        self.runtime_dir = runtime_dir
        cfg = Config.load(overrides={"manager": {"drivers": False, **manager}})
        self.ready = threading.Event()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.daemon: Daemon | None = None
        self._stop: asyncio.Event | None = None
        self._watches: list[Watch] = []
        self.thread = threading.Thread(target=self._run, args=(cfg,), daemon=True)
        self.thread.start()
        assert self.ready.wait(10), "in-process npud did not start"

    def _run(self, cfg: Config) -> None:
        async def main() -> None:
            self.loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            self.daemon = d = Daemon(cfg, self.runtime_dir, use_drivers=False)
            submit = d.submit

            def watched_submit(event: Any) -> Any:
                try:
                    return submit(event)
                finally:
                    self._check_watches()

            d.submit = watched_submit  # type: ignore[method-assign]  # before start(): handlers
            await d.start()
            self.ready.set()
            await self._stop.wait()
            await self.daemon.stop("test over")

        asyncio.run(main())

    def _check_watches(self) -> None:
        assert self.daemon is not None
        state = self.daemon.state
        for watch in list(self._watches):
            if watch[0](state):
                self._watches.remove(watch)
                watch[1].set()

    def wait_for(self, pred: Callable[[ManagerState], bool], what: str,
                 timeout: float = 5.0) -> None:
        """Block until ``pred(npud's state)`` holds: checked on npud's loop after every event
        (never a poll), bounded by ``timeout``."""
        assert self.loop is not None
        watch = (pred, threading.Event())

        def add() -> None:
            self._watches.append(watch)
            self._check_watches()

        self.loop.call_soon_threadsafe(add)
        if not watch[1].wait(timeout):
            raise AssertionError(f"npud did not get to: {what} (within {timeout} s)")

    async def wait_for_async(self, pred: Callable[[ManagerState], bool], what: str,
                             timeout: float = 5.0) -> None:
        await asyncio.to_thread(self.wait_for, pred, what, timeout)

    def stop(self) -> None:
        if self.thread.is_alive():
            assert self.loop is not None and self._stop is not None
            self.loop.call_soon_threadsafe(self._stop.set)
            self.thread.join(10)


@pytest.fixture
def npud(runtime_dir: Path) -> Iterator[DaemonThread]:
    d = DaemonThread(runtime_dir)
    yield d
    d.stop()


def in_state(uid: int, rid: int, state: RequestState) -> Callable[[ManagerState], bool]:
    return lambda s: s.request_state(uid, rid) is state


def ended(uid: int, rid: int, how: str) -> Callable[[ManagerState], bool]:
    """The request's last incarnation ended ``how`` ("cancelled", "dropped (client gone)")."""

    def check(s: ManagerState) -> bool:
        story = s.story(uid, rid)
        return s.request_state(uid, rid) is None and bool(story) and story[-1].what == how

    return check
