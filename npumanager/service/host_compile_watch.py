"""npud's watch of a driver host's compile that runs in the host process itself, where the
host may not raise it (bench/README.md: ``compile_raise``; drivers/compile_watch.py).

Why npud and not the host: a compile on a lowered host thread (an ONNX Runtime session
built at SCHED_IDLE, torch's tracing) holds the host's GIL while it waits for the CPU, and
every other Python thread of the host waits with it, the host's own watch included:
measured, a session built on a lowered thread pinned beside two busy loops took about
220 s with the host's watch (it decided 16 raises in that time, not one per two bounds).
npud is another process: it samples the tree from /proc and raises it through
service/host_raise.py, whatever the host's GIL is doing.

The host asks (``hal.watch_compile``, hal/raise_wire.py: the tree ``(pid, tid)``, on or
off) from the compiling thread before the compile starts and after it ends. npud checks
the tree as for a raise (the host's thread or a process descending from it, of its uid)
and keeps at most ``MAX_WATCHED`` per host; each sample (every half bound while any is
watched) is the same decision as the host's (hal/starve_bound.py), and each raise goes
through :meth:`HostRaises.raise_tree` with its checks and rate bound; a raise is answered
to the host (``hal.raise_applied``) so that its ``device.stats`` count it. A watch whose
tree is gone, or whose host exited, is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass

from npumanager.clock import LoopClock
from npumanager.errors import LimitExceeded, NpuError, PermissionDenied
from npumanager.fds import close_fds
from npumanager.hal import proc_tree, raise_wire
from npumanager.hal.proc_tree import TreeProgress
from npumanager.hal.starve_bound import CompileStarve
from npumanager.service.host_raise import HostRaises, host_of
from npumanager.wire.conn import CallContext, RpcConnection

log = logging.getLogger("npumanager.service.host_compile_watch")

#: Compiles watched at once per host (its compile pool's threads and load threads).
MAX_WATCHED = 8


@dataclass
class _Watch:
    host: int
    pid: int
    tid: int  # as asked: negative, the thread alone
    bound_s: float
    guard: CompileStarve
    tree: TreeProgress
    conn: RpcConnection | None


class HostCompileWatch:
    """The in-host compiles npud watches, per host."""

    def __init__(self, clock: LoopClock, raises: HostRaises) -> None:
        self._clock = clock
        self.raises = raises
        self._watched: dict[tuple[int, int, int], _Watch] = {}
        self._task: asyncio.Task[None] | None = None
        self.watches = self.refused = 0

    def watch(self, host: int | str | None, pid: int, tid: int, on: bool, bound_s: float,
              conn: RpcConnection | None = None) -> None:
        """Start (``on``) or end watching the tree ``(pid, tid)`` of host ``host``. Typed
        errors as :meth:`HostRaises.raise_tree`'s checks."""
        key = (host if isinstance(host, int) else 0, pid, tid)
        if not on:
            w = self._watched.pop(key, None)
            if w is not None and w.guard.end():
                self._lower(w)
            return
        try:
            if bound_s <= 0:
                raise PermissionDenied("the compile starvation bound is off for this driver")
            host = host_of(host)
            self.raises.check(host, pid, tid)
            if key not in self._watched and sum(
                    k[0] == host for k in self._watched) >= MAX_WATCHED:
                raise LimitExceeded(f"driver host {host} has {MAX_WATCHED} compiles "
                                    f"watched already")
        except NpuError:
            self.refused += 1
            raise
        tree = TreeProgress(pid, abs(tid), children=tid > 0)
        w = _Watch(host, pid, tid, bound_s, CompileStarve(bound_s), tree, conn)
        now = self._clock.now()
        w.guard.begin(now, tree.sample(now) or 0.0)
        self._watched[key] = w
        self.watches += 1
        self._ensure_task()

    def tick(self) -> None:
        """One sample of every watched tree, its decision carried out."""
        now = self._clock.now()
        for key, w in list(self._watched.items()):
            progress = w.tree.sample(now)
            if progress is None or proc_tree.proc_info(w.host) is None:
                self._watched.pop(key, None)
                continue
            move = w.guard.tick(now, progress)
            if move is True:
                try:
                    self.raises.raise_tree(w.host, w.pid, w.tid, w.bound_s)
                    ok, why = True, ""
                except NpuError as e:  # (the rate bound, mostly: another compile's raise)
                    ok, why = False, f"{type(e).__name__}: {e}"
                if w.conn is not None and not w.conn.closed:
                    w.conn.push(raise_wire.APPLIED,
                                raise_wire.encode_applied(w.pid, w.tid, ok, why))
            elif move is False:
                self._lower(w)

    @staticmethod
    def _lower(w: _Watch) -> None:
        threads = (proc_tree.tree(w.pid, w.tid) if w.tid >= 0 else [(w.pid, -w.tid)])
        proc_tree.lower_to_idle(threads)

    def watched(self) -> int:
        return len(self._watched)

    def _ensure_task(self) -> None:
        if self._task is None or self._task.done():
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                return  # (off any loop, as a test is: :meth:`tick` by hand)
            self._task = loop.create_task(self._run())

    async def _run(self) -> None:
        while self._watched:
            await self._clock.sleep(min(w.bound_s for w in self._watched.values()) / 2)
            try:
                self.tick()
            except Exception:
                log.exception("npud's watch of driver hosts' compiles failed")

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    def handler(self, pid_of: Callable[[], int | str | None], bound_s: float
                ) -> Callable[[CallContext, bytes], None]:
        """The ``hal.watch_compile`` handler of one driver's link."""

        def on_request(ctx: CallContext, payload: bytes) -> None:
            close_fds(ctx.fds)
            try:
                pid, tid, on = raise_wire.decode_watch(payload)
            except ValueError as e:
                log.warning("driver host sent a bad %s: %s", raise_wire.WATCH, e)
                return
            with contextlib.suppress(NpuError):
                try:
                    self.watch(pid_of(), pid, tid, on, bound_s, ctx.conn)
                except NpuError as e:
                    if not ctx.conn.closed:
                        ctx.conn.push(raise_wire.APPLIED, raise_wire.encode_applied(
                            pid, tid, False, f"{type(e).__name__}: {e}"))
                    raise

        return on_request
