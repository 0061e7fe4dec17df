"""What the driver host holds for its state, and the instructions that act on it.

:class:`~npumanager.drivers.state.DriverState` hands out ids (models, pools,
tickets, timer keys) and decides; the things behind those ids have I/O or
memory behind them and live here: prepared models, mapped pools, executions
with their tensors and replies, armed timers. :meth:`HostResources.carry_out`
does the state's instructions in order: start a step on a worker thread or
inline, answer an execute, release a model, close a pool, arm or cancel a
timer; reports meant for npud go to :class:`~npumanager.drivers.npud_link.NpudLink`.

Events caused here (a step finished, a timer fired) go back to the host
through the two callbacks it passes in, never by calling into the state.

Burst threads (:mod:`.burst`) carry out instructions too, under the host's lock:
:meth:`HostResources.carry_out_here` does at once only what is safe off the event
loop and queues the rest for the loop, in order (:meth:`HostResources.wake_loop`
hands the queue over once the burst's reply is out, so a burst execution does not
wake the loop on its way: one wake-up each way).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from npumanager import tensorio
from npumanager.clock import LoopClock, Timer
from npumanager.drivers import bg_pass
from npumanager.drivers import events as ev
from npumanager.drivers.base import PreparedModel
from npumanager.drivers.bg_here import unlowered
from npumanager.drivers.exec_stats import ExecStats
from npumanager.drivers.messages import ClientConn, job_error
from npumanager.drivers.npud_link import NpudLink
from npumanager.drivers.quiet_release import QuietReleases
from npumanager.drivers.steps import Execution, Reply, StepRunner
from npumanager.fds import close_fds
from npumanager.hal.types import EndReason

log = logging.getLogger("npumanager.drivers.host")

_COMPLETED = EndReason.COMPLETED

#: (ticket, error or None, run µs): a step ended; the host feeds it to the state.
StepFinished = Callable[[int, "str | None", float], None]


class HostResources:
    def __init__(self, runner: StepRunner, stats: ExecStats, clock: LoopClock,
                 npud: NpudLink, step_finished: StepFinished,
                 timer_fired: Callable[[str], None],
                 lock: threading.RLock | None = None) -> None:
        self.runner = runner
        self.stats = stats
        self.clock = clock
        self.npud = npud
        self._step_finished = step_finished
        self._timer_fired = timer_fired
        #: The host's lock: what the loop is handed from a burst thread runs under it.
        self.lock = lock or threading.RLock()
        self.prepared: dict[int, PreparedModel] = {}  # model id -> prepared model
        self.pools: dict[int, tuple[ClientConn, tensorio.MappedPool]] = {}  # by pool id
        self.executions: dict[int, Execution] = {}  # ticket -> execution
        self.timers: dict[str, Timer] = {}
        #: The ticket whose execute call is being handled: its inline step is run by that
        #: call once the state has answered (``take_inline``), not from inside carry_out.
        self.current = 0
        self._inline_now: ev.RunStep | None = None
        self.loop: asyncio.AbstractEventLoop | None = None  # set when the host starts
        #: Instructions a burst thread left for the loop, in the state's order: carried
        #: out before anything the loop carries out itself (so order holds), at the latest
        #: once ``wake_loop`` has handed them over.
        self._deferred: list[ev.Instruction] = []
        self._wake_pending = False
        #: Called on the worker thread when a step of a burst execution ends there (the
        #: host submits it from that thread; None: through the loop like any step).
        self.burst_step_done: Callable[[Execution, str | None, float], None] | None = None
        #: ``background_burst_here = "normal-pass"`` (.bg_pass): a burst's thread runs the
        #: queued BACKGROUND steps of other burst executions the state starts at its end.
        self.pass_steps = False
        #: Stops (True) or continues the background compiles in flight (.load_hold; the
        #: host sets it when it has a compile worker). Safe from any thread.
        self.hold_loads: Callable[[bool], None] = lambda stop: None
        #: Where released models are freed at a quiet moment (.quiet_release; None: at
        #: once, as the state says).
        self.releases: QuietReleases | None = None
        #: Called (the lock held) right before a pool closes, with its id.
        self.pool_closing: Callable[[int], None] | None = None
        self._runners: dict[type, Callable[[Any], None]] = {
            ev.RunStep: self._run_step,
            ev.AbortStep: self._abort_step,
            ev.FinishJob: self._finish_job,
            ev.ReportWork: npud.report_work,
            ev.ReleaseModel: self._release_model,
            ev.ReportModelMemory: npud.report_memory,
            ev.ModelReady: lambda ins: None,  # read by the prepare call that caused it
            ev.PoolReady: lambda ins: None,  # read by the register call that caused it
            ev.ClosePool: self._close_pool,
            ev.ArmTimer: self._arm_timer,
            ev.CancelTimer: self._cancel_timer,
            ev.HoldLoads: lambda ins: self.hold_loads(ins.stop),
            ev.GraceExpired: npud.grace_expired,
        }

    def close(self) -> None:
        for timer in self.timers.values():
            timer.cancel()
        self.timers.clear()
        for prepared in self.prepared.values():
            prepared.release()
        self.prepared.clear()
        if self.releases is not None:
            self.releases.close()

    def carry_out(self, out: list[ev.Instruction]) -> None:
        """On the loop, the lock held: what burst threads left first, then ``out``."""
        if self._deferred:
            self._carry_out_deferred()
        self._carry(out)

    def _carry(self, out: list[ev.Instruction]) -> None:
        runners = self._runners
        for ins in out:
            try:
                runners[type(ins)](ins)
            except Exception:
                log.exception("carrying out %r failed; continuing with the rest", ins)

    def carry_out_here(self, out: list[ev.Instruction], here: Execution) -> ev.RunStep | None:
        """Off the loop (a burst's thread, or a worker that ran a burst's step; the lock
        held): carry out what is safe here, queue the rest for the loop in order (handed
        over by :meth:`wake_loop`). Returns the step of ``here`` the state started, which
        this thread runs itself: a FOREGROUND step, or an inline one (the loop would run
        it at the same priority); a BACKGROUND step that is not inline goes to the
        lowered workers as for plain work, unless ``here`` is a burst execution whose
        thread, this one, runs them lowered (.bg_here; not one with a lane or one that
        yields: those need the workers' placement). Other work starts on worker threads; aborts
        and burst endings are thread-safe; reports, timers, releases, inline steps of
        other work and plain replies are the loop's."""
        mine: ev.RunStep | None = None
        now: list[ev.Instruction] = []
        later = self._deferred
        for ins in out:
            kind = type(ins)
            if kind is ev.RunStep:
                assert isinstance(ins, ev.RunStep)
                if ins.ticket == here.ticket and (
                        ins.inline or not ins.background
                        or (here.bg_here == threading.get_ident() and ins.lane is None
                            and not ins.yields)):
                    mine = ins  # (a BACKGROUND one: the burst's thread, lowered: .bg_here)
                    continue
                if not ins.inline:
                    if (self.pass_steps and here.bg_here == threading.get_ident()
                            and bg_pass.passable(self.executions.get(ins.ticket), ins)):
                        # (another burst's, whose thread waits: run here after the answer,
                        # .bg_pass)
                        bg_pass.keep(self.executions[ins.ticket], ins)
                        continue
                    now.append(ins)  # runner.start: a worker thread
                    continue
            elif kind is ev.AbortStep or kind is ev.HoldLoads:
                now.append(ins)  # (a continue of a stopped compile waits for no loop)
                continue
            elif kind is ev.FinishJob:
                assert isinstance(ins, ev.FinishJob)
                ex = self.executions.get(ins.ticket)
                if ex is None or ex.done is not None:
                    now.append(ins)
                    continue
            later.append(ins)
        self._carry(now)
        return mine

    def wake_loop(self) -> None:
        """From a burst's thread once its reply is out (or before it waits): hand what it
        left for the loop over, one wake-up for the lot; nothing when nothing is left.
        Then the BACKGROUND steps of other burst executions this thread kept (.bg_pass).
        Nothing left (a burst repeat's end carries out its FinishJob here): no lock taken,
        on the burst's thread once per batch (trim22). Read unlocked: what this thread
        left is seen; what another left, that thread hands over itself."""
        wake = False
        if self._deferred:
            with self.lock:
                wake = bool(self._deferred) and not self._wake_pending
                if wake:
                    self._wake_pending = True
        if wake:
            loop = self.loop
            assert loop is not None, "host not started"
            try:
                loop.call_soon_threadsafe(self._carry_out_locked)
            except RuntimeError:
                pass  # the loop is gone (shutdown)
        if self.pass_steps:
            self._run_passed()

    def _run_passed(self) -> None:
        """On a burst's thread, the lock not held: each step kept for it (.bg_pass) run
        here at its own (normal) priority, its result handed back as a worker's is."""
        for ex, step in bg_pass.take():
            try:
                error, run_us = self.runner.run_here(ex, step, unlowered())
            except Exception as exc:
                log.exception("a passed background step failed")
                error, run_us = f"{type(exc).__name__}: {exc}", 0.0
            hb = ex.handback
            assert hb is not None  # (bg_pass.passable)
            hb.ran(ex, error, run_us)

    def _carry_out_locked(self) -> None:
        with self.lock:
            self._carry_out_deferred()

    def _carry_out_deferred(self) -> None:
        self._wake_pending = False
        out, self._deferred = self._deferred, []
        self._carry(out)

    def take_inline(self) -> ev.RunStep | None:
        """The inline step the current execute call is to run itself, if the state chose one."""
        inline, self._inline_now = self._inline_now, None
        return inline

    def _from_worker(self, ticket: int) -> Callable[[str | None, float], None]:
        loop = self.loop
        assert loop is not None, "host not started"

        def done(error: str | None, run_us: float) -> None:
            try:
                loop.call_soon_threadsafe(self._step_finished, ticket, error, run_us)
            except RuntimeError:
                pass  # the loop is gone (shutdown): nobody waits for this step

        return done

    def _run_step(self, ins: ev.RunStep) -> None:
        ex = self.executions.get(ins.ticket)
        if ex is None:
            return
        if not ins.inline:
            burst_done = self.burst_step_done
            hb = ex.handback
            if hb is not None:
                # A burst execution whose thread waits for the run (.bg_handback).
                self.runner.start(ex, ins, lambda error, run_us: hb.ran(ex, error, run_us))
            elif ex.done is not None and burst_done is not None:
                # A burst execution: the worker submits its end itself (no loop wake-up).
                self.runner.start(ex, ins, lambda error, run_us: burst_done(ex, error, run_us))
            else:
                self.runner.start(ex, ins, self._from_worker(ins.ticket))
        elif ins.ticket == self.current:
            self._inline_now = ins  # the execute call runs it once the state has answered
        else:
            # Not from inside another call: after the replies already decided go out.
            assert self.loop is not None, "host not started"
            self.loop.call_soon(self._run_inline, ins)

    def _run_inline(self, ins: ev.RunStep) -> None:
        ex = self.executions.get(ins.ticket)
        if ex is not None:
            error, run_us = self.runner.run(ex, ins)
            self._step_finished(ins.ticket, error, run_us)

    def _abort_step(self, ins: ev.AbortStep) -> None:
        ex = self.executions.get(ins.ticket)
        if ex is not None and ex.prepared is not None:
            ex.prepared.abort()

    def _finish_job(self, ins: ev.FinishJob) -> None:
        ex = self.executions.pop(ins.ticket, None)
        if ex is None:
            return
        outcome: Reply | BaseException
        result = ex.result
        if ins.reason is _COMPLETED and result is not None:
            result[0].work_id = ins.work_id
            result[0].steps_run = ins.steps_run
            outcome = result
            self.stats.record(ex.uid, time.perf_counter() - ex.t0)
        else:
            if result is not None:
                close_fds(result[1])
            outcome = job_error(ins)
        fut = ex.future
        if ex.done is not None:  # a burst execution: its thread answers
            ex.outcome = outcome
            ex.done.set()
        elif fut is None:
            ex.outcome = outcome  # the execute call itself answers
        elif fut.done():  # its caller is gone
            if isinstance(outcome, tuple):
                close_fds(outcome[1])
        elif isinstance(outcome, BaseException):
            fut.set_exception(outcome)
        else:
            fut.set_result(outcome)

    def _release_model(self, ins: ev.ReleaseModel) -> None:
        prepared = self.prepared.pop(ins.model_id, None)
        if prepared is None:
            return
        if self.releases is not None:
            self.releases.add(prepared)  # (off the lock, where no paced frame is near)
        else:
            prepared.release()

    def _close_pool(self, ins: ev.ClosePool) -> None:
        owned = self.pools.pop(ins.pool_id, None)
        if owned is not None:
            client, pool = owned
            del client.pools[ins.pool_id]
            client.bursts.pop(ins.pool_id, None)
            if self.pool_closing is not None:
                self.pool_closing(ins.pool_id)  # bursts drop their views of it first
            pool.close()

    def _arm_timer(self, ins: ev.ArmTimer) -> None:
        self._cancel_timer(ev.CancelTimer(ins.key))
        key = ins.key
        self.timers[key] = self.clock.call_at(ins.at, lambda: self._on_timer(key))

    def _on_timer(self, key: str) -> None:
        self.timers.pop(key, None)
        self._timer_fired(key)

    def _cancel_timer(self, ins: ev.CancelTimer) -> None:
        timer = self.timers.pop(ins.key, None)
        if timer is not None:
            timer.cancel()
