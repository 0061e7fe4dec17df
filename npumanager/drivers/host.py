"""The driver host process: the async shell around :class:`DriverState`.

The state decides; this module acts. It serves DIR/drivers/NAME.sock: every
call (``hal.*`` for npud and admins, ``device.*`` for any uid, decided per
call from its kernel-verified uid), every closed connection, finished step and
timer becomes an event with ``now`` from the host's clock; the state returns
instructions and :class:`~.resources.HostResources` carries them out in order.

The host is split by what each part owns:

- this module: the server, the client connections, the ``device.*`` calls,
  and turning each stimulus into an event for the state;
- :mod:`.npud_link`: the connections to npud, the ``hal.*`` calls, grant
  waits and the pushes npud hears;
- :mod:`.resources`: the things behind the state's ids (prepared models,
  mapped pools, executions, timers) and the instructions acting on them;
- :mod:`.burst`: bursts, each served by a thread of its own that submits to the
  state like a device.execute call;
- :mod:`.prepare_calls`: the ``device.*`` calls that prepare and release models;
- :mod:`.prepare` compiles and loads models, :mod:`.steps` runs them.

The event loop and burst threads both submit events: the state and what carries
out its decisions are used under one lock (``self.lock``), never from two
threads at once.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

from npumanager import tensorio
from npumanager.clock import LoopClock, MonotonicClock
from npumanager.drivers import events as ev
from npumanager.drivers.base import Driver
from npumanager.drivers.bg_ends import StepEnds
from npumanager.drivers.burst import Bursts
from npumanager.drivers.classes import step_policy
from npumanager.drivers.exec_stats import ExecStats
from npumanager.drivers.messages import (
    ClientConn,
    decode_inputs,
    params_from,
    plain_pools,
    set_output_area,
)
from npumanager.drivers.npud_link import NpudLink, admin
from npumanager.drivers.prepare import Preparer
from npumanager.drivers.prepare_calls import PrepareCalls
from npumanager.drivers.quiet_release import QuietReleases
from npumanager.drivers.resources import HostResources
from npumanager.drivers.rt_threads import RtThreads
from npumanager.drivers.state import DriverState
from npumanager.drivers.steps import Execution, Reply, StepRunner
from npumanager.errors import InvalidArgument, NpuError
from npumanager.fds import close_fds
from npumanager.hal.host_config import HostConfig
from npumanager.hal.types import HAL_VERSION
from npumanager.hal.wire import SERVICE
from npumanager.paths import ensure_drivers_dir
from npumanager.proto.v1 import driver_pb2 as pb
from npumanager.proto.v1.wire_pb2 import Empty
from npumanager.wire.conn import CallContext, Handler, RpcConnection
from npumanager.wire.server import RpcServer, resolve_group
from npumanager.words import plural

log = logging.getLogger("npumanager.drivers.host")


class DriverHost:
    def __init__(
        self,
        hc: HostConfig,
        driver: Driver,
        runtime_dir: Path,
        state_dir: Path,
        *,
        cache_counts: tuple[int, int] = (0, 0),
        clock: LoopClock | None = None,
        listen_sock: socket.socket | None = None,
        manager_uid: int | None = None,
    ) -> None:
        """``listen_sock``: the listening socket npud bound at the driver's path (None: the
        host binds it); ``manager_uid``: npud's uid, an admin of this host."""
        self.hc = hc
        self.driver = driver
        self.runtime_dir = runtime_dir
        self.cache_counts = cache_counts
        self.clock: LoopClock = clock or MonotonicClock()
        self.state = DriverState(params_from(hc))
        self.socket_path = runtime_dir / "drivers" / f"{hc.lane_name}.sock"
        self._listen_sock = listen_sock
        self._manager_uid = manager_uid
        self.preparer = Preparer(hc, driver, cache_counts, state_dir)
        self.exec_stats = ExecStats()
        sched, nice = step_policy(hc.background_sched, hc.background_nice,
                                  hc.background_step_nice)
        self.runner = StepRunner(hc.name, hc.channels, inline_limit=hc.inline_limit,
                                 max_frame=hc.max_frame, stats=self.exec_stats,
                                 background_sched=sched, background_nice=nice,
                                 background_cpus=hc.background_cpus,
                                 background_starve_ms=hc.background_starve_ms,
                                 idle_group=self.preparer.idle_group,
                                 background_lower=hc.background_lower,
                                 background_slice_us=hc.background_slice_us)
        self.server: RpcServer | None = None
        self._clients: dict[RpcConnection, ClientConn] = {}
        self._cids = itertools.count(1)
        self._tickets = itertools.count(1)
        self._stimuli = itertools.count(1)
        #: Held around the state and what carries out its decisions (see the docstring).
        self.lock = threading.RLock()
        self.npud = NpudLink(hc, driver, self.state, self.clock, self._submit, self._stimulus,
                             lambda: self.runner.busy_s, lock=self.lock)
        self.res = HostResources(self.runner, self.exec_stats, self.clock, self.npud,
                                 self._step_finished, self._on_timer, self.lock)
        #: The ends of BACKGROUND burst steps, submitted at normal priority (.bg_ends), or
        #: on the lowered worker that ran the step (``background_ends = "worker"``).
        self.bg_ends = StepEnds.for_host(hc.name, hc.background_ends, self._burst_step_end)
        self.res.pass_steps = hc.background_burst_here == "normal-pass"
        self.res.burst_step_done = (self._burst_step_end if self.bg_ends is None
                                    else self.bg_ends.put)
        if self.preparer.worker is not None:
            self.res.hold_loads = self.preparer.worker.hold
        if hc.quiet_release:
            self.res.releases = QuietReleases(self.clock, self._quiet_hold_end)
        #: Burst threads at SCHED_FIFO while they serve FOREGROUND work, applied by npud
        #: (``foreground_rt_priority``; None: off).
        self.rt: RtThreads | None = None
        if hc.foreground_rt_priority:
            self.rt = RtThreads(hc.foreground_rt_priority, hc.foreground_rt_max_run_us,
                                self.clock, lambda fn: self.loop.call_soon_threadsafe(fn),
                                self.npud.ask_rt)
            self.npud.on_rt_applied = self.rt.applied
            self.npud.on_manager_gone = self.rt.npud_gone
        # A starved background compile this host may not raise itself, npud raises
        # (drivers/compile_starve.py; service/host_raise.py checks and applies it).
        if self.preparer.via_npud:
            self.preparer.raiser.ask = self._ask_raise
            self.preparer.raiser.ask_watch = self._ask_watch
            self.npud.on_raise_applied = self.preparer.raiser.applied
        self.bursts = Bursts(self)
        self.prepares = PrepareCalls(self)
        self.res.pool_closing = self.bursts.forget_pool
        #: Set once npud went away and no manager attached again within the orphan grace
        #: (every model is released then; ``npu driver --exit-with-manager`` exits).
        self.orphan_expired = self.npud.orphan_expired

    def __repr__(self) -> str:
        return f"<DriverHost {self.hc.name}: {len(self._clients)} connections | {self.state!r}>"

    # --- lifecycle -----------------------------------------------------------------

    def handlers(self) -> dict[str, Handler]:
        return {
            **self.npud.handlers(),
            "device.capabilities": self._capabilities,
            "device.get_number_of_cache_files_needed": self._cache_files_needed,
            "device.prepare_model": self.prepares.prepare_model,
            "device.prepare_model_from_cache": self.prepares.prepare_from_cache,
            "device.register_pool": self._register_pool,
            "device.unregister_pool": self._unregister_pool,
            "device.execute": self._execute,
            "device.open_burst": self.bursts.open,
            "device.close_burst": self.bursts.close,
            "device.cancel": self._cancel,
            "device.release": self.prepares.release,
            # Other uids' execution rates: for npud and admins (`npu top`).
            "device.stats": admin(self._stats),
            "device.trace": admin(self._trace),
        }

    async def start(self) -> None:
        self.res.loop = asyncio.get_running_loop()
        if self._listen_sock is None:
            ensure_drivers_dir(self.runtime_dir)
        self.server = RpcServer(
            str(self.socket_path), SERVICE, self.handlers(), mode=self.hc.socket_mode,
            max_frame=self.hc.max_frame,
            admin_gid=resolve_group(self.hc.admin_group, warn=False),  # npud warned
            on_connect=self._connected, on_disconnect=self._disconnected,
            # Only these take fds: fds sent with any other call close the connection
            # (a handler that ignores them would pin them for good).
            fd_methods=frozenset({"device.prepare_model", "device.prepare_model_from_cache",
                                  "device.register_pool", "device.open_burst"}),
            listen_sock=self._listen_sock, owner_uid=self._manager_uid,
        )
        await self.server.start()

    async def close(self) -> None:
        if self.server is not None:
            # Every connection closes: its work is cancelled, its models released.
            await self.server.close(goodbye=f"driver {self.hc.name} is shutting down")
        self.bursts.close_all()
        self.runner.close()
        if self.bg_ends is not None:
            self.bg_ends.close()
        self.preparer.close()
        self.res.close()
        self.driver.close()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        assert self.res.loop is not None, "host not started"
        return self.res.loop

    # --- events in -------------------------------------------------------------------

    def _quiet_hold_end(self, now: float, run_s: float) -> float | None:
        with self.lock:
            return self.state.quiet_hold_end(now, run_s)

    def _stimulus(self, kind: str) -> str:
        return f"{kind}-{next(self._stimuli)}"

    def _submit(self, event: ev.Event) -> list[ev.Instruction]:
        """Feed the state; carry out what it decides. A refused event raises (the caller
        gets the error); nothing changed."""
        with self.lock:
            out = self.state.handle(event)
            self.res.carry_out(out)
        return out

    def _submit_quietly(self, event: ev.Event) -> None:
        """For stimuli nobody answers (steps, timers, disconnects): a failure is logged."""
        try:
            self._submit(event)
        except NpuError as exc:
            log.warning("%s (%s) refused: %s", type(event).__name__, event.stimulus_id, exc)
        except Exception:
            log.exception("the driver state failed on %s", event)

    def _connected(self, conn: RpcConnection) -> None:
        client = ClientConn(next(self._cids), conn)
        self._clients[conn] = client
        self._submit_quietly(ev.ClientConnected(
            stimulus_id=self._stimulus("connect"), now=self.clock.now(), conn=client.cid,
            uid=conn.peer.uid, pid=max(conn.peer.pid, 0)))

    def _disconnected(self, conn: RpcConnection, exc: BaseException | None) -> None:
        now = self.clock.now()
        was_manager = conn is self.npud.manager_conn
        for event in self.npud.disconnected(conn, now):
            self._submit_quietly(event)
        if was_manager:
            self.npud.wake_grant_waiters()  # refused now: no grant will come
        if was_manager and self.state.orphaned_at is not None:
            n = len(self.state.model_ids())
            log.warning("npud went away: loading nothing new; %s loaded %s "
                        "running for %g s unless a manager attaches again",
                        plural(n, "model"), "keeps" if n == 1 else "keep",
                        self.hc.orphan_grace_s)
        client = self._clients.pop(conn, None)
        if client is not None:
            self.bursts.client_gone(client)
            self._submit_quietly(ev.ClientGone(stimulus_id=self._stimulus("gone"), now=now,
                                               conn=client.cid))

    def launcher_gone(self) -> None:
        """The npud that started this host has exited (``npu driver --exit-with-manager``
        watches its pid): if no manager is attached and no grace runs, the orphan grace
        starts now (drivers/state_models.py ``_on_launcher_gone``)."""
        idle = self.state.orphaned_at is None and not self.state.manager_attached
        self._submit_quietly(ev.LauncherGone(stimulus_id=self._stimulus("launcher-gone"),
                                             now=self.clock.now()))
        self.npud.wake_grant_waiters()
        if idle and self.state.orphaned_at is not None:
            n = len(self.state.model_ids())
            log.warning("the npud that started this host is gone; %s loaded %s "
                        "running for at most %g s unless a manager attaches",
                        plural(n, "model"), "keeps" if n == 1 else "keep",
                        self.hc.orphan_grace_s)

    def _on_timer(self, key: str) -> None:
        self._submit_quietly(ev.TimerFired(stimulus_id=self._stimulus("timer"),
                                           now=self.clock.now(), key=key))

    def _step_finished(self, ticket: int, error: str | None, run_us: float) -> None:
        self._submit_quietly(ev.StepFinished(stimulus_id=self._stimulus("step"),
                                             now=self.clock.now(), ticket=ticket,
                                             run_us=run_us, error=error))

    # --- device.*: capabilities, stats, trace -------------------------------------------

    def capabilities_msg(self) -> pb.Capabilities:
        caps = self.driver.capabilities()
        return pb.Capabilities(
            name=self.hc.name, version=str(self.driver.version), backend=caps.backend,
            channels=self.hc.channels, memory_bytes=caps.memory_bytes,
            model_cache_files=self.cache_counts[0], data_cache_files=self.cache_counts[1],
            hal_version=HAL_VERSION, inline_limit=self.hc.inline_limit,
            enforce_admission=self.state.enforce_admission,
        )

    def _capabilities(self, ctx: CallContext, payload: bytes) -> pb.Capabilities:
        return self.capabilities_msg()

    def _ask_raise(self, pid: int, tid: int) -> bool:
        """(any thread) Ask npud to raise a starved compile, from the loop; False with no
        npud attached (or no loop yet)."""
        loop, link = self.res.loop, self.npud
        if loop is None or link.manager_conn is None or loop.is_closed():
            return False
        loop.call_soon_threadsafe(link.ask_raise, pid, tid)
        return True

    def _ask_watch(self, pid: int, tid: int, on: bool) -> bool:
        """(the compiling thread) Ask npud to watch a compile of this host; waits (at most
        1 s, the GIL released) until the loop has sent it, so that the request is out
        before the compile holds the GIL at SCHED_IDLE."""
        loop, link = self.res.loop, self.npud
        if loop is None or link.manager_conn is None or loop.is_closed():
            return False
        sent = threading.Event()

        def send() -> None:
            try:
                link.ask_watch(pid, tid, on)
            finally:
                sent.set()

        loop.call_soon_threadsafe(send)
        return sent.wait(1.0) if on else True

    def _stats(self, ctx: CallContext, payload: bytes) -> bytes:
        """JSON: channels busy, how long orphaned, per-uid executions/s and p50/p99
        latency (`npu top`), and what each burst's thread did (drivers/burst_counters.py)."""
        with self.lock:
            channels, busy, queued = self.state.load()
            grants = self.state.held_grants()
            moved = len(self.state.moved)
            orphaned = self.state.orphaned_at
            # The caller's own place in the scheduling table (only its own: another uid's
            # importance is not its business), so an app can see why it runs as it does.
            mine = self.state.config(ctx.peer.uid)
            lh = self.state.load_hold
            worker = self.preparer.worker
            # Background compiles stopped around foreground frames (.load_hold).
            hold = None if lh is None else {
                "stops": lh.stops, "stopped_s": round(lh.stopped_s, 4),
                "longest_ms": round(lh.longest_s * 1000, 3),
                "signalled": self.preparer.worker.stops if self.preparer.worker else 0}
            me = {"uid": ctx.peer.uid, "app_priority": mine.app_priority,
                  "class": self.state.model_class(ctx.peer.uid).value}
            # What each model's backend was told (OpenVINO: the priority variants made
            # for the jobs' bands, their knobs read back, their threads' nice value).
            backend: dict[str, dict[str, Any]] = {}
            for mid, p in self.res.prepared.items():
                st = p.backend_state() if hasattr(p, "backend_state") else {}
                if st:
                    backend[str(mid)] = st
        # The grants held and their models' memory: checked from outside by `npu chaos`.
        held = [{"grant": g[:8], "uid": uid, "request_id": rid, "bytes": nbytes,
                 "models": models}
                for g, uid, rid, nbytes, models in grants]
        return json.dumps({"channels": channels, "busy": busy, "queued": queued,
                           "held": held,
                           # Which of its device's host processes this is (a device with
                           # background_host has two: service/host_lanes.py).
                           "pid": os.getpid(), "lane": self.hc.lane,
                           # Models served here whose grant npud moved to the device's
                           # other host (their apps follow: service/grant_moves.py).
                           "moved": moved,
                           # Seconds since npud went away (None: attached, or never was).
                           "orphaned_s": None if orphaned is None
                           else round(self.clock.now() - orphaned, 3),
                           "backend": backend,
                           "caller": me, "load_hold": hold,
                           # b"recent": with each burst's last requests' times.
                           "bursts": self.bursts.stats(bytes(payload[:6]) == b"recent"),
                           # Background steps run at normal priority against starvation.
                           "background": self.runner.background_stats(),
                           # The compile child's starvation bound and how it is raised
                           # (compile_starve.py): by the host itself or by npud.
                           "compile_child": None if worker is None else {
                               **worker.starve.counts(), "via": self.preparer.raiser.via},
                           # The same bound for in-host compiles (compile_watch.py).
                           "compile_thread": None if self.preparer.watch is None
                           else self.preparer.watch.counts(),
                           # The raises of both, by the host itself or by npud.
                           "compile_raises": self.preparer.raiser.counts(),
                           # Burst threads at SCHED_FIFO (rt_threads.py; None: off).
                           "rt": None if self.rt is None else self.rt.counts(),
                           **self.exec_stats.snapshot()}).encode()

    def _trace(self, ctx: CallContext, payload: bytes) -> bytes:
        """JSON: execution steps after the cursor in the payload (`npu trace record`); each
        poll keeps step recording on for a few more seconds."""
        try:
            cursor = int(bytes(payload[:20]).decode() or 0)
        except ValueError:
            raise InvalidArgument("device.trace takes a cursor (a decimal number)") from None
        return json.dumps(self.exec_stats.steps_since(cursor)).encode()

    def _cache_files_needed(self, ctx: CallContext, payload: bytes) -> pb.CacheFilesNeeded:
        return pb.CacheFilesNeeded(n_model=self.cache_counts[0], n_data=self.cache_counts[1])

    # --- device.*: pools -------------------------------------------------------------

    def _register_pool(self, ctx: CallContext, payload: bytes) -> pb.PoolId:
        msg = pb.RegisterPool.FromString(payload)
        fds, ctx.fds = ctx.fds, []
        try:
            if len(fds) != 1:
                raise InvalidArgument(f"register_pool takes one memfd, got {len(fds)} fds")
            pool = tensorio.MappedPool(fds[0], msg.size)
            # Charged by the memfd's size, which sealing fixes: a sparse pool costs its
            # sender nothing but can make the driver touch every page of it.
            size = os.fstat(fds[0]).st_size
        finally:
            close_fds(fds)
        client = self._clients[ctx.conn]
        try:
            pool_id = self.register_pool(client, pool, size)
        except BaseException:
            pool.close()
            raise
        return pb.PoolId(pool_id=pool_id)

    def register_pool(self, client: ClientConn, pool: tensorio.MappedPool, size: int) -> int:
        """Count a mapped pool against the client (the state may refuse it); its id."""
        with self.lock:
            out = self.state.handle(ev.PoolRegistered(stimulus_id=self._stimulus("pool"),
                                                      now=self.clock.now(), conn=client.cid,
                                                      size=size))
            (pool_id,) = [i.pool_id for i in out if isinstance(i, ev.PoolReady)]
            client.pools[pool_id] = pool
            self.res.pools[pool_id] = (client, pool)
            self.res.carry_out(out)
        return pool_id

    def unregister_pool(self, client: ClientConn, pool_id: int) -> None:
        self._submit(ev.PoolUnregistered(stimulus_id=self._stimulus("pool-gone"),
                                         now=self.clock.now(), conn=client.cid,
                                         pool_id=pool_id))

    def _unregister_pool(self, ctx: CallContext, payload: bytes) -> Empty:
        msg = pb.PoolId.FromString(payload)
        self.unregister_pool(self._clients[ctx.conn], msg.pool_id)
        return Empty()

    # --- device.execute / device.cancel -------------------------------------------------

    def _execute(self, ctx: CallContext, payload: bytes) -> Reply | Awaitable[Reply]:
        """Answered at once when the job ran inline (a cheap model), else when the job's
        future resolves."""
        t0 = time.perf_counter()
        res = self.res
        if ctx.fds:
            close_fds(ctx.fds)
        msg = pb.Execute.FromString(payload)
        client = self._clients[ctx.conn]
        with self.lock:
            pools = plain_pools(msg, client)
            inputs = decode_inputs(msg, pools)
            ex, event = self.new_execution(client, msg, inputs, t0)
            ticket = ex.ticket
            if msg.out_pool_id:
                set_output_area(ex, msg, pools)
            res.executions[ticket] = ex
            try:
                out = self.state.handle(event)
            except BaseException:
                del res.executions[ticket]
                raise
            res.current = ticket
            res.carry_out(out)
            res.current = 0
            inline = res.take_inline()
        if inline is not None:
            # The fast path: a cheap model on a free channel runs right here, and the
            # reply leaves without a future, a task or a thread hand-off.
            error, run_us = self.runner.run(ex, inline)
            self._step_finished(ticket, error, run_us)
        moved = self.state.moved.get(msg.model_id)  # (one lookup: its grant moved away)
        outcome = ex.outcome
        if outcome is not None:
            if isinstance(outcome, BaseException):
                raise outcome
            return outcome if moved is None else _say_moved(outcome, moved)
        fut: asyncio.Future[Reply] = self.loop.create_future()
        ex.future = fut
        return fut if moved is None else _moved_when_done(fut, moved)

    def new_execution(self, client: ClientConn, msg: pb.Execute, inputs: dict[str, Any],
                      t0: float) -> tuple[Execution, ev.ExecuteRequested]:
        """The execution of an execute request and the event that submits it."""
        steps = max(1, msg.steps)
        feedback = tuple(msg.feedback.items()) if steps > 1 else ()
        ex = self.execution(client, msg, inputs, t0, dict(feedback))
        ticket = ex.ticket
        original_uid = msg.original_uid if msg.has_original_uid else None
        feature_id = msg.feature_id if msg.has_feature_id else None
        event = ev.ExecuteRequested(
            stimulus_id=f"execute-{ticket}", now=self.clock.now(), conn=client.cid,
            ticket=ticket, model_id=msg.model_id, inputs=tuple(inputs), values=inputs,
            steps=steps, feedback=feedback, job_priority=msg.job_priority,
            original_uid=original_uid, feature_id=feature_id, group_id=msg.group_id or None,
            exec_id=msg.exec_id,
        )
        return ex, event

    def execution(self, client: ClientConn, msg: pb.Execute, inputs: dict[str, Any],
                  t0: float, feedback: dict[str, str] | None = None) -> Execution:
        """A new ticket's execution of an execute request (no event for the state yet)."""
        return Execution(next(self._tickets), self.res.prepared.get(msg.model_id), inputs,
                         feedback or {}, msg.original_uid if msg.has_original_uid
                         else client.conn.peer.uid,
                         msg.feature_id if msg.has_feature_id else None, t0)

    def submit_here(self, ex: Execution, event: ev.Event) -> ev.RunStep | None:
        """From a burst thread, with the lock held: submit ``event`` about ``ex``; the
        step of ``ex`` the state started, which this thread runs itself (None: it waits)."""
        res = self.res
        if isinstance(event, ev.ExecuteRequested):
            res.executions[ex.ticket] = ex
        try:
            out = self.state.handle(event)
        except BaseException:
            if isinstance(event, ev.ExecuteRequested):
                del res.executions[ex.ticket]
            raise
        return res.carry_out_here(out, ex)

    def _burst_step_end(self, ex: Execution, error: str | None, run_us: float) -> None:
        """The end of a step of a burst execution that ran on a lowered worker (a
        BACKGROUND one), on the normal-priority thread of .bg_ends (never the lowered
        worker: a preempted SCHED_IDLE thread holding the lock would keep the foreground
        burst threads waiting): submit it as the burst's thread would, and run the next
        step the state starts here if it may run here (inline, or FOREGROUND now; a
        BACKGROUND one goes to the lowered workers); the job's end wakes the burst's
        thread directly."""
        try:
            while True:
                with self.lock:
                    step = self.submit_here(ex, ev.StepFinished(
                        stimulus_id=self._stimulus("step"), now=self.clock.now(),
                        ticket=ex.ticket, run_us=run_us, error=error))
                if step is None:
                    break
                error, run_us = self.runner.run(ex, step)
        except Exception:
            log.exception("the driver state failed on the end of a burst step")
        finally:
            self.res.wake_loop()

    def _cancel(self, ctx: CallContext, payload: bytes) -> Empty:
        msg = pb.Cancel.FromString(payload)
        client = self._clients[ctx.conn]
        self._submit(ev.CancelRequested(stimulus_id=self._stimulus("cancel"),
                                        now=self.clock.now(), conn=client.cid,
                                        model_id=msg.model_id, exec_id=msg.exec_id))
        return Empty()


def _say_moved(reply: Reply, lane: str) -> Reply:
    """``reply`` telling its app that the model's grant moved to ``lane``'s host (hal.
    grant_moved): the answer is right, the next ones should come from there."""
    reply[0].moved, reply[0].moved_lane = True, lane
    return reply


async def _moved_when_done(fut: asyncio.Future[Reply], lane: str) -> Reply:
    return _say_moved(await fut, lane)
