"""A burst execution through the host's state, on the burst's own thread.

:class:`BurstExecutions` is the part of :class:`npumanager.drivers.burst.Bursts` that
serves one request: the kept request's checks (:mod:`.burst_fixed`), admission through
:class:`DriverState` under the host's lock exactly as ``device.execute`` (the fast path
of :mod:`.state_fast` for a repeat the state admitted before), the step run here when
the state starts it at once, its end recorded, and the ``SAME`` answer given before the
bookkeeping when the state says the end is COMPLETED. Work the state queues instead
runs where any job runs, and the burst's thread waits for its end. (The channel, the
thread's loop and the open and close calls are :mod:`.burst`'s.)
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

from google.protobuf.message import DecodeError

from npumanager import tensorio
from npumanager.drivers import burst_counters as bc
from npumanager.drivers import events as ev
from npumanager.drivers.base import PreparedModel
from npumanager.drivers.bg_handback import Handback, Ran
from npumanager.drivers.bg_here import this_thread, unlowered
from npumanager.drivers.burst_fixed import FixedRequest, fixed_request
from npumanager.drivers.lowering import RunLowering
from npumanager.drivers.messages import ClientConn, decode_inputs, set_output_area
from npumanager.drivers.state_fast import FastKey
from npumanager.drivers.steps import Done, Execution, Reply
from npumanager.errors import DeviceUnavailable, InvalidArgument
from npumanager.hal.sched_slice import set_slice, set_this_thread
from npumanager.proto.v1 import driver_pb2 as pb
from npumanager.tensorio import burst as layout

if TYPE_CHECKING:
    from npumanager.drivers.burst import BurstServer
    from npumanager.drivers.host import DriverHost

#: The longest run (µs, the stream's last) ``_run_first`` holds the host's lock for.
RUN_FIRST_MAX_US = 500.0
#: A waiting burst execution re-checks whether its burst closed this often.
_WAIT_TICK_S = 1.0


class BurstExecutions:
    """Executions of the host's bursts (a base of :class:`~.burst.Bursts`, which owns
    ``host`` and the open bursts)."""

    host: DriverHost
    _servers: dict[int, BurstServer]

    def prepare_next(self, server: BurstServer) -> None:
        """Once a reply is out: the next execution of the kept request, made now rather
        than when the client is waiting for it (under the lock: a pool closing drops it
        with the kept request, ``forget_pool``)."""
        with self.host.lock:
            fixed = server.fixed
            if fixed is not None and fixed.fast is not None and not server.closing:
                server.spare = fixed, fixed.execution(next(self.host._tickets), 0.0, Done())

    def _slice(self, server: BurstServer, fg: bool) -> None:
        """The burst's thread (the caller) to ``foreground_slice_us`` once its steps run
        here as FOREGROUND, back to the kernel's slice once one runs as BACKGROUND (a
        queued step changes nothing). Tried once per change, so a kernel that refuses it
        costs no syscalls per frame."""
        server.sliced = fg
        if fg:
            set_this_thread(self.host.hc.foreground_slice_us, "foreground_slice_us")
        else:
            set_slice(0)

    def execute(self, server: BurstServer, data: bytes
                ) -> tuple[Reply, FixedRequest | None] | None:
        """Submit the request ``data`` as an execution of the burst's model, exactly as
        device.execute does; run its steps here while the state starts them at once, else
        wait. A request that repeats the kept one is not parsed or decoded again. None:
        answered SAME already, as soon as its run was over and before its end was recorded
        (the state said that end is COMPLETED, and nothing can change that while the lock
        is held): the client does not wait for the bookkeeping."""
        host = self.host
        t0 = time.perf_counter()
        client = server.client
        spare, server.spare = server.spare, None
        kept = server.fixed
        early = None
        if kept is None or kept.data != data:
            # Parsed and decoded before the host's lock, which every uid's executions take:
            # a request area of a million tiny values takes seconds to decode.
            try:
                early = self._decode(server, data, dict(client.pools))
            except ValueError:
                pass  # a pool closed under it: decoded again under the lock
        marks, ns = server.marks, time.perf_counter_ns
        with host.lock:
            marks[bc.M_LOCKED] = ns()
            if server.closing or client.conn.closed:
                raise DeviceUnavailable("the burst is closed")
            prepared = host.res.prepared.get(server.model_id)
            fixed = server.fixed
            if fixed is not None and (fixed.data != data
                                      or not fixed.still_valid(client.pools, prepared)):
                fixed = server.fixed = None
            key = fixed.fast if fixed is not None else None
            if fixed is not None and key is not None:
                # A repeat the state admitted before: admitted with what it found then,
                # while nothing it checked has changed (drivers/state_fast.py).
                if spare is not None and spare[0] is fixed:
                    ex = spare[1]  # made when the last reply was out
                    ex.t0 = t0
                else:
                    ex = fixed.execution(next(host._tickets), t0, Done())
                self._hand_back(ex)
                first = self._run_first(server, fixed, ex, key)
                if first is not None:
                    marks[bc.M_ENDED] = ns()
                    if first:
                        return None  # answered SAME
                    return self._outcome(ex, fixed)
                admitted, step = self._submit_repeat(ex, key)
                if not admitted:
                    key = fixed.fast = None
            if key is None:
                ex, step = self._submit_full(server, data, fixed, prepared, t0, Done(),
                                             early)
                fixed = server.fixed  # (a new one: its next repeat is answered SAME)
        marks[bc.M_ADMITTED] = ns()
        answered = False
        # Anticipation serves FOREGROUND streams only: those whose steps run here.
        server.foreground = fg = step is not None and not step.background
        if host.hc.foreground_slice_us and (fg or step is not None) and fg != server.sliced:
            self._slice(server, fg)
        rt = host.rt
        if (rt is not None and (fg or step is not None) and fg != server.rt.want
                and not rt.refused):
            # SCHED_FIFO while it serves FOREGROUND steps (.rt_threads: asked of npud once
            # per change; while backing off after a long run, each call finds nothing to do).
            rt.serve(server.rt, fg)
        hb = ex.handback
        here = self._lowering() if ex.bg_here else None
        ran: Ran | None = None
        while True:
            while step is not None or ran is not None:
                if ran is None:
                    assert step is not None
                    marks[bc.M_RUN0] = ns()
                    if step.background and not step.inline and here is not None:
                        error, run_us = host.runner.run_here(ex, step, here)  # (.bg_here)
                    else:
                        error, run_us = host.runner.run(ex, step)
                    marks[bc.M_RUN1] = ns()
                    server.run_us = run_us
                    if rt is not None and server.rt.want:
                        rt.ran(server.rt, run_us)  # (a long run at FIFO lowers it)
                else:
                    # (a lowered worker ran it, .bg_handback: RUN0..RUN1 is the wait for it)
                    (error, run_us), ran = ran, None
                    server.run_us = run_us
                with host.lock:
                    marks[bc.M_LOCKED2] = ns()
                    # (read before the answer: the end is recorded as of when the run was
                    # over, whenever the client goes on)
                    now = host.clock.now()
                    ticket = ex.ticket
                    if error is None and host.state.completes(ticket):
                        if (fixed is not None and server.sent is fixed
                                and ex.result is not None and ex.result[0] is fixed.result):
                            server.answer_same()
                            answered = True
                        # (its end in one call: drivers/state_repeat.py, one pass)
                        out = host.state.repeat_end(ticket, run_us, f"step-{ticket}", now)
                        assert out is not None  # (completes: the lock held since)
                        step = host.res.carry_out_here(out, ex)
                    else:
                        step = host.submit_here(ex, ev.StepFinished(
                            stimulus_id=host._stimulus("step"), now=now, ticket=ticket,
                            run_us=run_us, error=error))
            if answered or ex.outcome is not None:
                break
            # Queued, paused or running on a lowered worker: another thread runs it; its
            # end sets ``done`` (or, .bg_handback, the run's result comes back here). What
            # the loop is to do (reports, timers, other work's inline steps) goes first.
            host.res.wake_loop()
            marks[bc.M_RUN0] = ns()
            server.waiting = ex
            try:
                ran = self._await(server, ex, hb)
            finally:
                server.waiting = None
            if ran is None:
                break
            marks[bc.M_RUN1] = ns()
        marks[bc.M_ENDED] = ns()
        if answered:
            return None
        return self._outcome(ex, fixed)

    def _hand_back(self, ex: Execution) -> None:
        """Before ``ex`` is submitted: its steps that run on lowered workers hand their
        results back to this thread (.bg_handback), where the host does that; or, with
        ``background_burst_here``, this thread runs them itself, lowered (.bg_here)."""
        hc = self.host.hc
        fallback = self.host.res.burst_step_done
        if hc.background_handback and fallback is not None:
            ex.handback = Handback(fallback)
        if hc.background_burst_here != "off" and self._lowering() is not None:
            ex.bg_here = threading.get_ident()

    def _lowering(self) -> RunLowering | None:
        """This thread's lowering for its BACKGROUND runs (.bg_here; None: they go to the
        workers)."""
        hc = self.host.hc
        mode = hc.background_burst_here
        if mode in ("normal", "normal-pass"):
            return unlowered()
        if mode not in ("lowered", "nice"):
            return None
        return this_thread(hc.background_sched if mode == "lowered" else "nice",
                           hc.background_nice)

    @staticmethod
    def _await(server: BurstServer, ex: Execution, hb: Handback | None) -> Ran | None:
        """Wait for the execution's end (None: ``ex.outcome`` is set, or the burst closed
        and nothing is being handed back) or, with ``hb``, for the result of its step that
        a lowered worker ran (``done`` then set again for the next wake-up)."""
        while True:
            if hb is not None:
                ran = hb.take()
                if ran is not None:
                    ex.done = Done()
                    return ran
            if ex.outcome is not None:
                return None
            if server.closing:
                if hb is None or hb.left or hb.leave():
                    return None
                # A run is being handed over (its worker holds the claim): its result
                # comes at once. (stop() set ``done``: armed again so as not to spin.)
                ex.done = Done()
                ran = hb.take()
                if ran is not None:
                    return ran
            done = ex.done
            assert done is not None
            done.wait(_WAIT_TICK_S)

    @staticmethod
    def _outcome(ex: Execution, fixed: FixedRequest | None
                 ) -> tuple[Reply, FixedRequest | None]:
        outcome = ex.outcome
        if outcome is None:
            raise DeviceUnavailable("the burst closed while its execution waited")
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome, fixed if outcome[0] is ex.fixed_result else None

    def _run_first(self, server: BurstServer, fixed: FixedRequest, ex: Execution,
                   key: FastKey) -> bool | None:
        """The lock held: a repeat the one pass admits, of a short run whose answer will be
        SAME, run *before* its admission and end are recorded, the lock held throughout,
        and answered as soon as the run is over; then both recorded as the one pass
        records them (``repeat_begin`` as of the check, ``repeat_end`` as of the run's
        end), with nothing between: no other event can come while the lock is held, so
        the state sees exactly the events, in the order and at the times, of the one pass
        with its run between them. The client waits for the check and the run, not for
        ~50-90 µs of a cold admission's bookkeeping (measured: bench/burst_stages.py).
        The price: the host's lock is held for the run (``RUN_FIRST_MAX_US`` at most, as
        the stream's last run took), so other work's events wait that much longer.

        None: not taken (a run too long or not bound, an answer that would not be SAME,
        a trace being recorded, a state the one pass would not take); nothing done. True:
        answered SAME and recorded. False: ran and recorded, not answered (the run
        failed, or its outputs did not land where the last reply said): ``ex.outcome``
        says what to answer."""
        host = self.host
        state = host.state
        ticket = ex.ticket
        if (server.sent is not fixed or fixed.run is None or not server.foreground
                or not 0 < server.run_us <= RUN_FIRST_MAX_US
                or host.runner.stats.trace_until or not state.repeat_check(key, ticket)):
            return None
        marks, ns, clock = server.marks, time.perf_counter_ns, host.clock
        begun = clock.now()
        marks[bc.M_ADMITTED] = ns()
        # (what the run reads of its step; the one pass makes the same but for the trace's
        # fields, unused while no trace is recorded)
        marks[bc.M_RUN0] = ns()
        error, run_us = host.runner.run(ex, ev.RunStep(ticket, step=0, last=True,
                                                        inline=False, priority=key.eff))
        marks[bc.M_RUN1] = marks[bc.M_LOCKED2] = ns()
        ended = clock.now()
        server.run_us = run_us
        rt = host.rt
        if rt is not None and server.rt.want:
            rt.ran(server.rt, run_us)  # (a long run at FIFO lowers it: .rt_threads)
        same = (error is None and ex.result is not None
                and ex.result[0] is fixed.result)
        if same:
            server.answer_same()
        res = host.res
        res.executions[ticket] = ex
        step = state.repeat_begin(key, ticket, f"execute-{ticket}", begun)
        assert step is not None  # (repeat_check said so, and the lock was held since)
        if error is None:
            out = state.repeat_end(ticket, run_us, f"step-{ticket}", ended)
            assert out is not None  # (nothing could cancel it: the lock was held)
            mine = res.carry_out_here(out, ex)
        else:
            mine = host.submit_here(ex, ev.StepFinished(
                stimulus_id=host._stimulus("step"), now=ended, ticket=ticket, run_us=run_us,
                error=error))
        assert mine is None  # (one step, over)
        return same

    def rehearse(self, server: BurstServer) -> bool:
        """The lock held, just before a paced stream's request is due (anticipation's
        warm-up, drivers/anticipate.py): walk the path ``execute`` takes for a repeat of
        the kept request, reading what it reads and writing nothing (the request area
        compared with the kept request, the kept request's checks, the state's one pass
        rehearsed, the execution made for it, the response header, the latency record),
        so that its memory is in the caches when the request comes. True: a repeat now
        would take the one pass."""
        fixed = server.fixed
        key = fixed.fast if fixed is not None else None
        if fixed is None or key is None or server.closing:
            return False
        host = self.host
        client = server.client
        buf = server.pool.buf
        _ = (bytes(buf[server.req_off:server.req_off + len(fixed.data)]) == fixed.data,
             client.conn.closed, layout.read_response_header(buf))
        if not fixed.still_valid(client.pools, host.res.prepared.get(server.model_id)):
            return False
        spare = server.spare
        if spare is not None:
            ex = spare[1]
            _ = (ex.ticket in host.res.executions, ex.done)
        host.res.stats.touch(fixed.uid)
        return host.state.rehearse(key, host.clock.now())

    def _submit_repeat(self, ex: Execution, key: FastKey) -> tuple[bool, ev.RunStep | None]:
        """The lock held: ``ex``, a repeat of the request ``key`` was made for, admitted in
        one pass where the state can (``repeat_begin``), else through the state's fast
        path (``execute_fast``: a BACKGROUND repeat without background_one_pass comes there
        every batch), registered once for both. (False, None): not admitted, the state
        wants the full path (nothing changed)."""
        host = self.host
        res = host.res
        state = host.state
        ticket = ex.ticket
        res.executions[ticket] = ex
        try:
            step = state.repeat_begin(key, ticket, f"execute-{ticket}", host.clock.now())
            if step is not None:
                return True, step
            out = state.execute_fast(key, ticket, f"execute-{ticket}", host.clock.now())
        except BaseException:
            del res.executions[ticket]
            raise
        if out is None:
            del res.executions[ticket]
            return False, None
        return True, res.carry_out_here(out, ex)

    @staticmethod
    def _decode(server: BurstServer, data: bytes, pools: dict[int, tensorio.MappedPool]
                ) -> tuple[pb.Execute, dict[str, Any], dict[int, tensorio.MappedPool]]:
        """``data`` parsed, its inputs decoded against ``pools``; and ``pools``."""
        try:
            msg = pb.Execute.FromString(data)
        except DecodeError:
            raise InvalidArgument("the burst request is not an Execute message") from None
        msg.model_id = server.model_id  # a burst executes its own model
        return msg, decode_inputs(msg, pools), pools

    def _submit_full(self, server: BurstServer, data: bytes, fixed: FixedRequest | None,
                     prepared: PreparedModel | None, t0: float, done: Done,
                     early: tuple[pb.Execute, dict[str, Any],
                                  dict[int, tensorio.MappedPool]] | None = None
                     ) -> tuple[Execution, ev.RunStep | None]:
        """The lock held: ``data`` submitted as an ExecuteRequested (decoded first unless it
        is the kept request); what it decodes to is kept for the next ones, bound once,
        whether the state admits it or not, and what the state's checks found once it
        does. ``early``: ``data`` decoded before the lock, used while the connection's pools
        are still those it was decoded against."""
        host = self.host
        client = server.client
        if fixed is not None:
            msg, inputs = fixed.msg, fixed.inputs
        elif early is not None and early[2] == client.pools:
            msg, inputs = early[0], early[1]
        else:
            msg, inputs, _ = self._decode(server, data, client.pools)
        ex, event = host.new_execution(client, msg, inputs, t0)
        ex.done = done
        self._hand_back(ex)
        if fixed is None:
            # Outputs: inline while they fit the response area, large ones into the
            # burst's data area unless the request named another area of its pools.
            ex.inline_budget = server.resp_size // 2
            if msg.out_pool_id:
                set_output_area(ex, msg, client.pools)
                self._check_output_area(client, msg)
            else:
                ex.out_pool, ex.out_pool_id = server.pool, server.pool_id
                ex.out_offset = server.data_start
                ex.out_capacity = server.pool.size - server.data_start
            assert ex.out_pool is not None
            fixed = fixed_request(data, msg, inputs, prepared, client.pools,
                                  (ex.out_pool, ex.out_pool_id, ex.out_offset,
                                   ex.out_capacity))
            server.fixed = fixed
        if fixed is not None:
            self._use_fixed(ex, fixed)
        step = host.submit_here(ex, event)
        if fixed is not None:
            fixed.fast = host.state.fast_key(event)
            fixed.uid, fixed.feature_id = ex.uid, ex.feature_id
        return ex, step

    def _check_output_area(self, client: ClientConn, msg: pb.Execute) -> None:
        """Outputs never go into a burst's header, request or response area: this host
        reads them (a sequence number written there is a request nobody rang). (A copy of
        the list: the loop opens and closes bursts meanwhile.)"""
        for s in list(self._servers.values()):
            if s.pool_id == msg.out_pool_id and s.client is client and \
                    msg.out_offset < s.data_start:
                raise InvalidArgument(f"the output area at {msg.out_offset} lies in burst "
                                      f"{s.burst_id}'s header and request and response "
                                      f"areas (tensors from {s.data_start})")

    @staticmethod
    def _use_fixed(ex: Execution, fixed: FixedRequest) -> None:
        ex.out_pool, ex.out_pool_id = fixed.out_pool, fixed.out_pool_id
        ex.out_offset, ex.out_capacity = fixed.out_offset, fixed.out_capacity
        ex.bound, ex.bound_run, ex.fixed_result = fixed.bound, fixed.run, fixed.result
