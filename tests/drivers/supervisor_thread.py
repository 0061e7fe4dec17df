"""A DriverSupervisor served on its own event loop in a thread, for blocking tests."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator

from npumanager.service.supervisor import DriverSupervisor


@contextlib.contextmanager
def supervisor_on_a_thread(sup: DriverSupervisor) -> Iterator[asyncio.AbstractEventLoop]:
    """Start ``sup`` on a fresh loop in a daemon thread; yield the loop; stop it all."""
    loop = asyncio.new_event_loop()
    started = threading.Event()

    def run() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(sup.start())
        started.set()
        loop.run_forever()

    th = threading.Thread(target=run, daemon=True)
    th.start()
    assert started.wait(60)
    try:
        yield loop
    finally:
        asyncio.run_coroutine_threadsafe(sup.stop(), loop).result(60)
        loop.call_soon_threadsafe(loop.stop)
        th.join(30)
        loop.close()
