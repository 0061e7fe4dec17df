"""Running the steps of executions: the backend call, feedback between steps, outputs.

:class:`Execution` is what the driver host keeps of one execute call (its
tensors, where its outputs go, its reply). :class:`StepRunner` runs one step
of it — on a worker thread, or inline on the event loop when the state says
the model is cheaper than a thread hand-off — and places the final outputs:
inline in the reply, in the client's pool (bound in place when the backend
can write there directly), or in one memfd sent with the reply.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from npumanager import tensorio
from npumanager.drivers.base import PreparedModel
from npumanager.drivers.bg_handback import Handback
from npumanager.drivers.bg_here import Unlowered, begin_runs, end_runs
from npumanager.drivers.bg_place import steer
from npumanager.drivers.bg_threads import (
    BACKGROUND_CPUS,
    LANE_CHOICES,
    background_pool,
    check_background,
    current_cpu,
    lane_cpus,
    spare_cpus,
)
from npumanager.drivers.events import RunStep
from npumanager.drivers.exec_stats import ExecStats
from npumanager.drivers.lowering import RunLowering, current, give_up
from npumanager.drivers.starve import StarveGuard
from npumanager.hal.idle_cgroup import BOOST, IdleGroup
from npumanager.proto.v1 import driver_pb2 as pb

Reply = tuple[pb.ExecuteResult, list[int]]


class Done:
    """A one-shot event: a lock held until ``set`` (threading.Event's condition costs a
    dozen Python calls per execution; a burst execution that runs on its own thread, as
    most do, sets it with nobody waiting)."""

    __slots__ = ("_lock",)

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()

    def set(self) -> None:
        try:
            self._lock.release()
        except RuntimeError:
            pass  # set already

    def wait(self, timeout: float) -> bool:
        """True once set (at once if it was), False after ``timeout`` seconds."""
        if self._lock.acquire(timeout=timeout):
            self._lock.release()
            return True
        return False


@dataclass(eq=False, slots=True)
class Execution:
    """One execute call, from its request to its reply."""

    ticket: int
    prepared: PreparedModel | None
    inputs: dict[str, Any]
    feedback: dict[str, str]
    #: The uid the work is attributed to, its feature id and when the call arrived
    #: (perf_counter): for the host's ExecStats.
    uid: int = 0
    feature_id: int | None = None
    t0: float = 0.0
    out_pool: tensorio.MappedPool | None = None
    out_offset: int = 0
    out_capacity: int = 0
    out_pool_id: int = 0
    #: The final outputs, placed by the last step.
    result: Reply | None = None
    #: Resolved with the reply when the call waits for it (steps on worker threads).
    future: asyncio.Future[Reply] | None = None
    #: The reply (or error) when the job ended before anyone waited: the inline path.
    outcome: Reply | BaseException | None = None
    #: A burst execution (:mod:`.burst`): set when it ends, with ``outcome`` filled in.
    done: Done | None = None
    #: Bytes of outputs the reply may carry inline (0: half the frame bound).
    inline_budget: int = 0
    #: A burst's fixed request (:mod:`.burst_fixed`): every output already bound to its
    #: view, the backend's run bound to the inputs and those views (None: run_into),
    #: and the reply while every output lands in its view.
    bound: dict[str, tuple[np.ndarray, int]] | None = None
    bound_run: Callable[[], dict[str, Any]] | None = None
    fixed_result: pb.ExecuteResult | None = None
    #: A burst execution whose lowered runs go back to the burst's thread (.bg_handback).
    handback: Handback | None = None
    #: A burst execution whose BACKGROUND steps the state starts at once run on the
    #: burst's thread, lowered for the run (.bg_here): that thread's ident (0: none).
    bg_here: int = 0


def _all_bound(outs: dict[str, Any], bound: dict[str, tuple[np.ndarray, int]]) -> bool:
    if len(outs) != len(bound):
        return False
    for name, arr in outs.items():
        placed = bound.get(name)
        if placed is None or arr is not placed[0]:
            return False
    return True


def error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


class StepRunner:
    """Runs steps on ``channels`` worker threads, or inline; counts the busy time.

    BACKGROUND steps (``RunStep.background``) run on their own threads, lowered once
    at start as ``background_sched`` says (:func:`.bg_threads.lower_this_thread`). Separate threads
    rather than one pool switching policy per step: an unprivileged thread may lower
    its priority but not raise it back (RLIMIT_NICE), and a switch per step would be
    two syscalls on every step.

    Steps on SCHED_IDLE threads can starve on a busy machine: :class:`~.starve.StarveGuard`
    decides which of them run on normal-priority threads instead (``background_starve_ms``).

    ``background_lower = "run"``: those threads are lowered only around the backend's run
    (.lowering), at normal priority while they hold the GIL; the privilege to return is
    checked once per thread (RLIMIT_NICE), and a thread without it stays lowered."""

    def __init__(self, name: str, channels: int, *, inline_limit: int, max_frame: int,
                 stats: ExecStats | None = None, background_sched: str = "normal",
                 background_nice: int = 19, background_cpus: str = "all",
                 background_starve_ms: int = 0, idle_group: IdleGroup | None = None,
                 background_lower: str = "thread", background_slice_us: int = 0) -> None:
        self.inline_limit = inline_limit
        self.max_frame = max_frame
        self.stats = stats if stats is not None else ExecStats()
        #: Seconds the backend spent running steps (the thermal model's utilization).
        self.busy_s = 0.0
        self._workers = ThreadPoolExecutor(channels, thread_name_prefix=f"npu-{name}-ch")
        self._bg_workers = self._workers
        if background_cpus not in BACKGROUND_CPUS:
            raise ValueError(f"background_cpus must be one of {', '.join(BACKGROUND_CPUS)}, "
                             f"not {background_cpus!r}")
        cpus = spare_cpus() if background_cpus == "spare" else None
        lanes = lane_cpus() if background_cpus in LANE_CHOICES else []
        #: "steer" (.bg_place): lanes with no pin; lane k's CPUs set as its step is handed
        #: over, off those the other lanes' steps run on (None: lanes are pinned, or none).
        self._steer: frozenset[int] | None = (frozenset(lanes) if background_cpus == "steer"
                                              and lanes else None)
        #: Per lane (steer): its thread's id once started, the CPUs it was last given, and
        #: the CPU its running step started on.
        self._lane_tid: dict[int, int] = {}
        self._lane_mask: dict[int, frozenset[int]] = {}
        self._lane_cpu: dict[int, int] = {}
        check_background(background_sched, background_lower)
        share = background_sched == "share"
        #: Background steps that yield (.share: a uid over its share) run here.
        self._bg_yield = self._workers
        if background_sched != "normal" or cpus:
            self._bg_workers = background_pool(channels, f"npu-{name}-bg",
                                               "nice" if share else background_sched,
                                               background_nice, cpus, idle_group,
                                               lower=background_lower,
                                               slice_us=background_slice_us)
            self._bg_yield = self._bg_workers
        if share:
            self._bg_yield = background_pool(channels, f"npu-{name}-bgy", "idle",
                                             background_nice, cpus, lower=background_lower,
                                             slice_us=background_slice_us)
        #: Background lanes (.runqueue, ``RunStep.lane``): lane k's steps on a thread of
        #: its own kept on the k-th CPU, lowered as the other background threads are.
        self._lanes = [background_pool(1, f"npu-{name}-bgl{k}",
                                       "nice" if share else background_sched,
                                       background_nice,
                                       None if self._steer is not None else {cpu},
                                       idle_group, lower=background_lower,
                                       slice_us=background_slice_us)
                       for k, cpu in enumerate(lanes)]
        #: The pools whose threads are SCHED_IDLE, and the normal-priority threads their
        #: starved steps move to (created on first use, as every pool's threads are).
        self._idle_pools = ({self._bg_workers, *self._lanes} if background_sched == "idle"
                            else set()) | ({self._bg_yield} if share else set())
        self._bg_boost = (background_pool(channels, f"npu-{name}-bgb", "normal",
                                          background_nice, cpus, idle_group, BOOST)
                          if self._idle_pools
                          else self._workers)
        self.guard = StarveGuard(background_starve_ms / 1e3)
        self._guard_lock = threading.Lock()
        self._tokens = itertools.count(1)
        #: Idle steps not started yet: token -> (execution, step, done, their future).
        self._unstarted: dict[int, list[Any]] = {}

    def close(self) -> None:
        self._workers.shutdown(wait=True, cancel_futures=True)
        for pool in {self._bg_workers, self._bg_yield, self._bg_boost,
                     *self._lanes} - {self._workers}:
            pool.shutdown(wait=True, cancel_futures=True)

    def start(self, ex: Execution, step: RunStep,
              done: Callable[[str | None, float], None]) -> None:
        """Run the step on a worker thread; ``done(error, run_us)`` is called there."""
        if self._unstarted:
            self._rescue()
        if step.background:
            lane = step.lane
            pool = (self._bg_yield if step.yields else self._lanes[lane]
                    if lane is not None and lane < len(self._lanes) else self._bg_workers)
            if self._steer is not None and lane is not None and pool is not self._bg_yield:
                self._steer_lane(lane)
            if pool in self._idle_pools:
                self._start_idle(pool, ex, step, done)
                return
        else:
            pool = self._workers
        fut = pool.submit(self.run, ex, step)
        fut.add_done_callback(lambda f: done(*f.result()))

    def _steer_lane(self, lane: int) -> None:
        """Before lane ``lane``'s step is handed over: its thread's CPUs (.bg_place)."""
        assert self._steer is not None
        mask = steer(self._steer, self._lane_cpu, lane)
        if self._lane_mask.get(lane) == mask:
            return
        tid = self._lane_tid.get(lane)
        if tid is None:
            return  # (its thread starts with this step: it has every CPU)
        try:
            os.sched_setaffinity(tid, mask)
        except OSError:
            return
        self._lane_mask[lane] = mask

    def background_stats(self) -> dict[str, float]:
        with self._guard_lock:
            return self.guard.counts()

    # --- background steps at SCHED_IDLE, with a bound on their wait (drivers/starve.py) ---

    def _start_idle(self, pool: ThreadPoolExecutor, ex: Execution, step: RunStep,
                    done: Callable[[str | None, float], None]) -> None:
        token = next(self._tokens)
        with self._guard_lock:
            boost = self.guard.route(token, time.monotonic())
            if not boost:
                entry: list[Any] = [ex, step, done, None]
                self._unstarted[token] = entry
        if boost:
            self._submit(self._bg_boost, ex, step, done)
            return
        fut = pool.submit(self._run_idle, token, ex, step)
        with self._guard_lock:
            entry[3] = fut  # (the worker may have started it already: then unused)
        fut.add_done_callback(lambda f: None if f.cancelled() else done(*f.result()))

    def _submit(self, pool: ThreadPoolExecutor, ex: Execution, step: RunStep,
                done: Callable[[str | None, float], None]) -> None:
        fut = pool.submit(self.run, ex, step)
        fut.add_done_callback(lambda f: done(*f.result()))

    def _run_idle(self, token: int, ex: Execution, step: RunStep) -> tuple[str | None, float]:
        with self._guard_lock:
            self._unstarted.pop(token, None)  # started: it can no longer be moved
        lane = step.lane if self._steer is not None else None
        if lane is not None and lane < len(self._lanes):
            self._lane_tid.setdefault(lane, threading.get_native_id())
            at = current_cpu()
            if at is not None:
                self._lane_cpu[lane] = at
        c0 = time.thread_time()
        try:
            return self.run(ex, step)
        finally:
            if lane is not None and lane < len(self._lanes):
                self._lane_cpu.pop(lane, None)
            cpu = time.thread_time() - c0
            with self._guard_lock:
                self.guard.ended(token, time.monotonic(), cpu)
            if self._unstarted:
                self._rescue()

    def _rescue(self) -> None:
        """Idle steps no SCHED_IDLE thread started within the bound run at normal priority."""
        now = time.monotonic()
        moved: list[list[Any]] = []
        with self._guard_lock:
            for token, entry in list(self._unstarted.items()):
                fut: Future[Any] | None = entry[3]
                if fut is not None and self.guard.overdue(token, now) and fut.cancel():
                    del self._unstarted[token]
                    self.guard.moved(token)
                    moved.append(entry)
        for ex, step, done, _fut in moved:
            self._submit(self._bg_boost, ex, step, done)

    def run_here(self, ex: Execution, step: RunStep, low: RunLowering
                 ) -> tuple[str | None, float]:
        """A BACKGROUND step on the calling normal-priority thread (a burst's: .bg_here),
        lowered by ``low`` around the backend's run only; at normal priority where the
        starvation bound says so, as a step of the lowered pools would be."""
        token = next(self._tokens)
        with self._guard_lock:
            boost = self.guard.route(token, time.monotonic())
        if boost:
            return self.run(ex, step)
        c0 = time.thread_time()
        try:
            if type(low) is Unlowered:
                # ("normal": a switch that switches nothing, not set around the run)
                return self.run(ex, step)
            begin_runs(low)
            try:
                return self.run(ex, step)
            finally:
                end_runs()
        finally:
            with self._guard_lock:
                self.guard.ended(token, time.monotonic(), time.thread_time() - c0)

    def run(self, ex: Execution, step: RunStep) -> tuple[str | None, float]:
        """One step: run, then feed outputs back (more steps follow) or place them for the
        reply. Returns (the error's text or None, the run's µs)."""
        prepared = ex.prepared
        assert prepared is not None
        last = step.last
        bound = ex.bound
        if bound is None:
            bound = self._bind_outputs(ex, prepared) if last and ex.out_pool is not None else {}
        bound_run = ex.bound_run
        #: A background thread lowered only around the run (.lowering), else None.
        low = current()
        t0 = time.perf_counter()
        try:
            # The job's priority reaches the backend's own knobs, where it has any (a
            # plugin's model need not subclass PreparedModel: the hook is optional).
            begin = getattr(prepared, "begin_step", None)
            if begin is not None:
                begin(step.priority, step.background)
            if low is not None:
                low.lower()
            if bound_run is not None:
                outs = bound_run()
            elif bound:
                outs = prepared.run_into(ex.inputs, {n: v for n, (v, _) in bound.items()})
            else:
                outs = prepared.run(ex.inputs)
        except BaseException as exc:  # the backend's error goes to the client
            return error_text(exc), (time.perf_counter() - t0) * 1e6
        finally:
            if low is not None:
                try:
                    low.restore()
                except OSError as exc:
                    give_up(low, exc)
            dt = time.perf_counter() - t0
            self.busy_s += dt
            stats = self.stats
            if stats.trace_until:  # someone records a trace (`npu trace record`)
                end = time.monotonic()
                if end < stats.trace_until:
                    stats.step(step.channel, end - dt, dt, ex.uid, ex.feature_id,
                               step.work_id, step.step)
                else:
                    stats.trace_until = 0.0
        try:
            if not last:
                fed = dict(ex.inputs)
                for out_name, in_name in ex.feedback.items():
                    fed[in_name] = outs[out_name]
                ex.inputs = fed
            elif ex.fixed_result is not None and _all_bound(outs, bound):
                ex.result = (ex.fixed_result, [])  # every output is where the reply says
            else:
                ex.result = self._place_outputs(ex, outs, bound)
        except BaseException as exc:
            return error_text(exc), dt * 1e6
        return None, dt * 1e6

    # --- outputs -------------------------------------------------------------------

    def _bind_outputs(self, ex: Execution, prepared: PreparedModel
                      ) -> dict[str, tuple[np.ndarray, int]]:
        """Views in the client's pool for large static-shape outputs, so the backend
        writes them in place (no copy on the way back)."""
        assert ex.out_pool is not None
        bound: dict[str, tuple[np.ndarray, int]] = {}
        offset = ex.out_offset
        end = ex.out_offset + ex.out_capacity
        for spec in prepared.outputs:
            nbytes = spec.static_nbytes()
            if nbytes is None or nbytes <= self.inline_limit:
                continue
            start = tensorio.align(offset)
            if start + nbytes > end:
                break
            bound[spec.name] = (tensorio.view_in(ex.out_pool.buf, start, nbytes, spec.dtype,
                                                 spec.shape, spec.name), start)
            offset = start + nbytes
        return bound

    def _place_outputs(self, ex: Execution, outs: dict[str, Any],
                       bound: dict[str, tuple[np.ndarray, int]]) -> Reply:
        result = pb.ExecuteResult()
        msgs = result.outputs
        #: Tensors that fit neither inline nor the client's pool: (message, array).
        big: list[tuple[pb.Tensor, np.ndarray]] = []
        offset = ex.out_offset
        for view, start in bound.values():
            offset = max(offset, start + view.nbytes)
        end = ex.out_offset + ex.out_capacity
        inline_budget = ex.inline_budget or self.max_frame // 2
        limit = self.inline_limit
        out_pool = ex.out_pool

        def place(msg: pb.Tensor, arr: np.ndarray) -> None:
            """A numeric tensor's payload: inline, in the client's pool, or (later) in
            the reply's memfd."""
            nonlocal offset, inline_budget
            nbytes = arr.nbytes
            if nbytes <= limit or out_pool is None:
                if nbytes <= inline_budget:
                    tensorio.fill_inline(msg, arr)
                    inline_budget -= nbytes
                    return
                big.append((msg, arr))
                return
            start = tensorio.align(offset)
            if start + nbytes <= end:
                view = tensorio.view_in(out_pool.buf, start, nbytes, msg.dtype, arr.shape,
                                        msg.name)
                np.copyto(view, arr)
                msg.pool_id, msg.offset, msg.nbytes = ex.out_pool_id, start, nbytes
                offset = start + nbytes
            else:
                big.append((msg, arr))

        for name, arr in outs.items():
            if type(arr) is not np.ndarray:
                # A sequence, map or optional (ONNX Runtime: a list, dict or None).
                tensorio.encode_value(result.values.add(name=name), arr, place)
                continue
            placed = bound.get(name)
            if placed is not None and arr is placed[0]:
                msgs.add(name=name, dtype=tensorio.dtype_name(arr.dtype), shape=arr.shape,
                         pool_id=ex.out_pool_id, offset=placed[1], nbytes=arr.nbytes)
                continue
            if not arr.flags.c_contiguous:
                arr = np.ascontiguousarray(arr)  # (only then: it would make a 0-d array 1-d)
            if arr.nbytes <= limit and arr.nbytes <= inline_budget:
                tensorio.add_inline(msgs, name, arr)  # the common case, built in place
                inline_budget -= arr.nbytes
                continue
            tensorio.encode_tensor(msgs.add(name=name), arr, place)
        if not big:
            return result, []
        # One memfd with the reply for everything that fit nowhere else.
        total = sum(tensorio.align(a.nbytes) for _, a in big)
        pool = tensorio.ClientPool(total)
        try:
            pos = 0
            for msg, arr in big:
                view = tensorio.view_in(pool.buf, pos, arr.nbytes, msg.dtype, arr.shape,
                                        msg.name)
                np.copyto(view, arr)
                del view
                msg.offset, msg.nbytes, msg.in_reply_fd = pos, arr.nbytes, True
                pos += tensorio.align(arr.nbytes)
            fd = os.dup(pool.fd)
        finally:
            pool.close()
        return result, [fd]
