"""An in-process npud on its own thread and loop, for client tests (fast: no subprocess)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from npumanager.config import Config
from npumanager.service.daemon import Daemon


class DaemonThread:
    def __init__(self, runtime_dir: Path, **manager: Any) -> None:
        self.runtime_dir = runtime_dir
        cfg = Config.load(overrides={"manager": {"drivers": False, **manager}})
        self.ready = threading.Event()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.daemon: Daemon | None = None
        self._stop: asyncio.Event | None = None
        self.thread = threading.Thread(target=self._run, args=(cfg,), daemon=True)
        self.thread.start()
        assert self.ready.wait(10), "in-process npud did not start"

    def _run(self, cfg: Config) -> None:
        async def main() -> None:
            self.loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            self.daemon = Daemon(cfg, self.runtime_dir, use_drivers=False)
            await self.daemon.start()
            self.ready.set()
            await self._stop.wait()
            await self.daemon.stop("test over")

        asyncio.run(main())

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
