"""npud as a process: `npu serve`'s event loop, its signals and its end.

:func:`run` is the blocking entry (uvloop when installed); :func:`serve` builds the
:class:`~.daemon.Daemon`, runs it until SIGTERM/SIGINT and stops it as a restart (its
drivers left for the next npud to adopt). Split out of daemon.py (579 lines, at the
module limit): the daemon carries out the state's instructions, this module owns the
process around it.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from npumanager.config import Config
from npumanager.paths import default_state_dir, ensure_runtime_dir, ensure_state_dir
from npumanager.service.admin_settings import persistent_state_dir
from npumanager.service.daemon import Daemon, drivers_enabled
from npumanager.service.observe import call as observe

log = logging.getLogger("npumanager.npud")


async def serve(cfg: Config, runtime_dir: Path, *, use_drivers: bool = True,
                ready: Callable[[Daemon], None] | None = None,
                observers: list[Any] | None = None, state_dir: Path | None = None,
                protection: str = "") -> int:
    """Run npud until SIGTERM/SIGINT; ``ready`` is called once clients can connect.
    ``observers`` (service/observe.py) are attached before npud starts; ``protection``:
    what foreground protection is in force (service/protection.py), for `npu status`."""
    import signal

    loop = asyncio.get_running_loop()
    ensure_runtime_dir(runtime_dir)
    persist = persistent_state_dir(runtime_dir, state_dir)
    if persist is not None or (use_drivers and drivers_enabled(cfg)):
        # The drivers keep their private state (cache maps, keys) under it, npud its admin
        # settings: refuse to start on one another user could write rather than have
        # each driver fail.
        ensure_state_dir(persist if persist is not None else default_state_dir())
    daemon = Daemon(cfg, runtime_dir, use_drivers=use_drivers, state_dir=persist,
                    driver_state_dir=state_dir)
    daemon.protection = protection
    daemon.observers.extend(observers or [])
    observe(daemon.observers, "attach", daemon)
    stop = asyncio.Event()
    why: list[str] = []

    def on_signal(sig: signal.Signals) -> None:
        why.append(sig.name)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        await daemon.start()
        # Everything allocated so far lives as long as npud: keep the collector off it, and
        # collect young objects less often (the state frees by refcount; a full collection
        # over a big decision log is a multi-millisecond pause on the grant path).
        gc.collect()
        gc.freeze()
        gc.set_threshold(20_000, 20, 100)
        if ready is not None:
            ready(daemon)
        observe(daemon.observers, "on_ready", daemon)
        await stop.wait()
        log.info("npud stopping (%s)", why[0] if why else "asked")
    finally:
        reason = f"npud is shutting down ({why[0] if why else 'stopped'})"
        observe(daemon.observers, "on_stopping", reason)
        # A signal is a restart as far as clients and drivers can tell (see Daemon.stop):
        # systemd sends the same SIGTERM for `restart` and `stop`, and drivers of an npud
        # that does not come back release everything after their grace anyway.
        await daemon.stop(reason, detach=bool(why))
        observe(daemon.observers, "close")
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
            # npud is exiting cleanly: a second SIGTERM/SIGINT (a supervisor repeating
            # itself) must not kill it with the default action in its last moments.
            signal.signal(sig, signal.SIG_IGN)
    return 0


def run(cfg: Config, runtime_dir: Path, *, use_drivers: bool = True,
        ready: Callable[[Daemon], None] | None = None,
        observers: list[Any] | None = None, state_dir: Path | None = None,
        protection: str = "") -> int:
    """The blocking entry of `npu serve`: uvloop when installed, else asyncio."""
    try:
        import uvloop

        factory: Callable[[], asyncio.AbstractEventLoop] | None = uvloop.new_event_loop
    except ImportError:
        factory = None
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(serve(cfg, runtime_dir, use_drivers=use_drivers, ready=ready,
                                observers=observers, state_dir=state_dir,
                                protection=protection))
