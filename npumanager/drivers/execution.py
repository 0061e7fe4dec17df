"""Execution in the driver host: the scheduler's sink, worker threads, tensors in and out.

:class:`ExecutionMixin` is the half of :class:`~npumanager.drivers.host.DriverHost`
that runs work: ``device.execute``/``device.cancel``, starting steps on worker
threads (or inline on the event loop for models cheaper than a thread
hand-off), feeding outputs back between steps, and placing outputs inline, in
the client's pool (bound in place when the backend can) or in a reply memfd.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from npumanager import tensorio
from npumanager.drivers.base import PreparedModel
from npumanager.drivers.exec_stats import ExecStats
from npumanager.drivers.scheduler import Job, Scheduler
from npumanager.errors import ExecutionFailed, GrantRevoked, InvalidArgument, WorkCancelled
from npumanager.fds import close_fds
from npumanager.hal.types import EndReason
from npumanager.proto.v1 import driver_pb2 as pb
from npumanager.proto.v1.wire_pb2 import Empty
from npumanager.wire.conn import CallContext, RpcConnection

if TYPE_CHECKING:
    from npumanager.hal.host_config import HostConfig

@dataclass(eq=False)
class ModelEntry:
    model_id: int
    prepared: PreparedModel
    uid: int
    conn: RpcConnection
    grant_id: str | None
    jobs: set[Job] = field(default_factory=set)
    input_names: frozenset[str] = frozenset()
    output_names: frozenset[str] = frozenset()
    #: Median of the recent step times in microseconds (None until measured); a median,
    #: so one preempted run does not push a cheap model off the inline path.
    run_us: float | None = None
    runs: int = 0
    recent: list[float] = field(default_factory=list)

    def note_run(self, us: float) -> None:
        recent = self.recent
        recent.append(us)
        if len(recent) > 9:
            del recent[0]
        self.run_us = sorted(recent)[len(recent) // 2]
        self.runs += 1


@dataclass(eq=False)
class Execution:
    """What a job carries through the scheduler."""

    model: ModelEntry
    conn: RpcConnection
    exec_id: int
    inputs: dict[str, np.ndarray]
    feedback: dict[str, str]
    future: asyncio.Future[tuple[pb.ExecuteResult, list[int]]]
    out_pool: tensorio.MappedPool | None
    out_offset: int
    out_capacity: int
    out_pool_id: int = 0
    result: tuple[pb.ExecuteResult, list[int]] | None = None
    revoked: str | None = None
    t0: float = 0.0  # when the request arrived (perf_counter), for ExecStats


@dataclass(eq=False)
class ClientConn:
    """The driver host's state of one client connection."""

    models: set[int] = field(default_factory=set)
    pools: dict[int, tensorio.MappedPool] = field(default_factory=dict)
    jobs: set[Job] = field(default_factory=set)


class ExecutionMixin:
    """Runs work for :class:`DriverHost` (which provides the attributes declared here)."""

    hc: HostConfig
    scheduler: Scheduler
    _workers: ThreadPoolExecutor
    _busy_s: float
    _submitting: Any
    _inline_now: Job | None
    clients: dict[RpcConnection, ClientConn]
    exec_stats: ExecStats

    def _client(self, conn: RpcConnection) -> ClientConn:
        client = self.clients.get(conn)
        if client is None:
            client = self.clients[conn] = ClientConn()
        return client

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        raise NotImplementedError

    def _arm(self) -> None:
        raise NotImplementedError

    def model_for(self, ctx: CallContext, model_id: int) -> ModelEntry:
        raise NotImplementedError

    # --- SchedulerSink (work_event lives on the host) ----------------------------

    def run_step(self, job: Job, channel: int) -> None:
        ex: Execution = job.payload
        model = ex.model
        run_us = model.run_us
        inline = run_us is not None and model.runs >= 3 and (
            run_us < self.hc.inline_run_us
            # Alone on the device, a medium single-step job runs inline too: the loop is
            # blocked for that one run (work arriving meanwhile waits no longer than it
            # would for a busy channel). Never multi-step jobs: their steps must stay
            # preemptible by work that arrives while one runs.
            or (job.steps == 1 and run_us < self.hc.inline_idle_run_us
                and self.scheduler.alone(job))
        )
        if inline:
            # Cheaper than a thread hand-off; never re-enter the scheduler mid-dispatch.
            if self._submitting is job.payload:
                self._inline_now = job  # the execute handler runs it once submit returns
            else:
                self.loop.call_soon(self._run_inline, job)
            return
        fut = self._workers.submit(self._run_step, job)
        fut.add_done_callback(lambda f: self._from_worker(job, f.result()))

    def _from_worker(self, job: Job, error: BaseException | None) -> None:
        try:
            self.loop.call_soon_threadsafe(self._step_finished, job, error)
        except RuntimeError:
            pass  # the host's loop is gone (shutdown): nobody waits for this step

    def _run_inline(self, job: Job) -> None:
        self._step_finished(job, self._run_step(job))

    def _run_step(self, job: Job) -> BaseException | None:
        """One step, on a worker thread (or inline): run, feed back, place final outputs."""
        ex: Execution = job.payload
        prepared = ex.model.prepared
        last = job.step + 1 >= job.steps
        bound = self._bind_outputs(ex) if last and ex.out_pool is not None else {}
        t0 = time.perf_counter()
        try:
            if bound:
                outs = prepared.run_into(ex.inputs, {n: v for n, (v, _) in bound.items()})
            else:
                outs = prepared.run(ex.inputs)
        except BaseException as exc:  # the backend's error goes to the client
            return exc
        finally:
            dt = time.perf_counter() - t0
            self._busy_s += dt
            ex.model.note_run(dt * 1e6)
            stats = self.exec_stats
            if stats.trace_until:  # someone records a trace (`npu trace record`)
                end = time.monotonic()
                if end < stats.trace_until:
                    info = job.info
                    stats.step(job.channel or 0, end - dt, dt, info.original_uid,
                               info.debug_feature_id, info.id, job.step)
                else:
                    stats.trace_until = 0.0
        try:
            if not last:
                fed = dict(ex.inputs)
                for out_name, in_name in ex.feedback.items():
                    fed[in_name] = outs[out_name]
                ex.inputs = fed
            else:
                ex.result = self._place_outputs(ex, outs, bound)
        except BaseException as exc:
            return exc
        return None

    def _step_finished(self, job: Job, error: BaseException | None) -> None:
        self.scheduler.step_done(job, error)
        self._arm()

    def abort_step(self, job: Job) -> None:
        ex: Execution = job.payload
        ex.model.prepared.abort()

    def job_finished(self, job: Job) -> None:
        ex: Execution = job.payload
        ex.model.jobs.discard(job)
        self._client(ex.conn).jobs.discard(job)
        fut = ex.future
        if fut.done():
            if ex.result is not None:
                close_fds(ex.result[1])
            return
        reason = job.end_reason
        if reason == EndReason.COMPLETED and ex.result is not None:
            self.exec_stats.record(job.info.original_uid, time.perf_counter() - ex.t0)
            fut.set_result(ex.result)
            return
        if ex.result is not None:
            close_fds(ex.result[1])
        if reason == EndReason.FAILED:
            err = job.error
            fut.set_exception(ExecutionFailed(f"{type(err).__name__}: {err}"))
        elif ex.revoked is not None:
            fut.set_exception(GrantRevoked(ex.revoked))
        elif reason == EndReason.CANCELLED_SYSTEM:
            fut.set_exception(WorkCancelled("the work was cancelled by the system"))
        else:
            fut.set_exception(WorkCancelled("the work was cancelled"))

    # --- outputs -----------------------------------------------------------------

    def _bind_outputs(self, ex: Execution) -> dict[str, tuple[np.ndarray, int]]:
        """Views in the client's pool for large static-shape outputs, so the backend
        writes them in place (no copy on the way back)."""
        assert ex.out_pool is not None
        bound: dict[str, tuple[np.ndarray, int]] = {}
        offset = ex.out_offset
        end = ex.out_offset + ex.out_capacity
        for spec in ex.model.prepared.outputs:
            nbytes = spec.static_nbytes()
            if nbytes is None or nbytes <= self.hc.inline_limit:
                continue
            start = tensorio.align(offset)
            if start + nbytes > end:
                break
            bound[spec.name] = (tensorio.view_in(ex.out_pool.buf, start, nbytes, spec.dtype,
                                                spec.shape, spec.name), start)
            offset = start + nbytes
        return bound

    def _place_outputs(
        self, ex: Execution, outs: dict[str, np.ndarray],
        bound: dict[str, tuple[np.ndarray, int]],
    ) -> tuple[pb.ExecuteResult, list[int]]:
        # Tensors are built in place in the reply (appending ready ones would copy them).
        result = pb.ExecuteResult()
        msgs = result.outputs
        big: list[tuple[str, np.ndarray]] = []
        offset = ex.out_offset
        for view, start in bound.values():
            offset = max(offset, start + view.nbytes)
        end = ex.out_offset + ex.out_capacity
        inline_budget = self.hc.max_frame // 2
        for name, arr in outs.items():
            placed = bound.get(name)
            if placed is not None and arr is placed[0]:
                msgs.add(name=name, dtype=tensorio.dtype_name(arr.dtype), shape=arr.shape,
                         pool_id=ex.out_pool_id, offset=placed[1], nbytes=arr.nbytes)
                continue
            arr = np.ascontiguousarray(arr)
            if arr.nbytes <= self.hc.inline_limit or ex.out_pool is None:
                if arr.nbytes <= inline_budget:
                    tensorio.add_inline(msgs, name, arr)
                    inline_budget -= arr.nbytes
                    continue
                big.append((name, arr))
                continue
            start = tensorio.align(offset)
            if start + arr.nbytes <= end:
                dt = tensorio.dtype_name(arr.dtype)
                view = tensorio.view_in(ex.out_pool.buf, start, arr.nbytes, dt, arr.shape, name)
                np.copyto(view, arr)
                msgs.add(name=name, dtype=dt, shape=arr.shape, pool_id=ex.out_pool_id,
                         offset=start, nbytes=arr.nbytes)
                offset = start + arr.nbytes
            else:
                big.append((name, arr))
        if not big:
            return result, []
        # Outputs that fit neither inline nor the client's pool: one memfd with the reply.
        total = sum(tensorio.align(a.nbytes) for _, a in big)
        pool = tensorio.ClientPool(total)
        try:
            pos = 0
            for name, arr in big:
                dt = tensorio.dtype_name(arr.dtype)
                view = tensorio.view_in(pool.buf, pos, arr.nbytes, dt, arr.shape, name)
                np.copyto(view, arr)
                del view
                msgs.add(name=name, dtype=dt, shape=arr.shape, offset=pos, nbytes=arr.nbytes,
                         in_reply_fd=True)
                pos += tensorio.align(arr.nbytes)
            fd = os.dup(pool.fd)
        finally:
            pool.close()
        return result, [fd]

    # --- device.execute / device.cancel -------------------------------------------

    def _input(self, ctx: CallContext, t: pb.Tensor) -> np.ndarray:
        if t.pool_id == 0:
            return tensorio.inline_array(t)
        pool = self._client(ctx.conn).pools.get(t.pool_id)
        if pool is None:
            raise InvalidArgument(f"input {t.name!r} names unknown pool {t.pool_id}")
        return tensorio.view_in(pool.buf, t.offset, t.nbytes, t.dtype, t.shape, t.name)

    def _execute(
        self, ctx: CallContext, payload: bytes
    ) -> tuple[pb.ExecuteResult, list[int]] | Awaitable[tuple[pb.ExecuteResult, list[int]]]:
        """Answered at once when the job ran inline (a cheap model on an idle channel),
        else when its future resolves."""
        close_fds(ctx.fds)
        msg = pb.Execute.FromString(payload)
        entry = self.model_for(ctx, msg.model_id)
        inputs = {t.name: self._input(ctx, t) for t in msg.inputs}
        expected = entry.input_names
        if inputs.keys() != expected:
            raise InvalidArgument(
                f"model takes inputs {sorted(expected)}, got {sorted(inputs)}"
            )
        feedback = dict(msg.feedback) if msg.steps > 1 else {}
        for out_name, in_name in feedback.items():
            if out_name not in entry.output_names or in_name not in expected:
                raise InvalidArgument(f"feedback {out_name!r} -> {in_name!r} names no "
                                      f"output/input of this model")
        out_pool = None
        if msg.out_pool_id:
            out_pool = self._client(ctx.conn).pools.get(msg.out_pool_id)
            if out_pool is None or msg.out_offset + msg.out_capacity > out_pool.size:
                raise InvalidArgument("the output area lies outside a registered pool")
        ex = Execution(
            model=entry, conn=ctx.conn, exec_id=msg.exec_id, inputs=inputs, feedback=feedback,
            future=self.loop.create_future(), out_pool=out_pool,
            out_offset=msg.out_offset, out_capacity=msg.out_capacity if out_pool else 0,
            out_pool_id=msg.out_pool_id if out_pool else 0, t0=time.perf_counter(),
        )
        self._submitting = ex
        try:
            job = self.scheduler.submit(
                uid=ctx.peer.uid, pid=max(ctx.peer.pid, 0),
                original_uid=msg.original_uid if msg.has_original_uid else None,
                feature_id=msg.feature_id if msg.has_feature_id else None,
                job_priority=msg.job_priority, steps=max(1, msg.steps),
                group_id=msg.group_id or None, payload=ex,
            )
        finally:
            self._submitting = None
        if job.state != "done":
            entry.jobs.add(job)
            self._client(ctx.conn).jobs.add(job)
        inline, self._inline_now = self._inline_now, None
        if inline is job:
            self._step_finished(job, self._run_step(job))
        else:
            self._arm()
        fut = ex.future
        if fut.done():
            res, fds = fut.result()
            res.work_id = job.id
            res.steps_run = job.step
            return res, fds
        return self._finish_execute(job, fut)

    async def _finish_execute(
        self, job: Job, fut: asyncio.Future[tuple[pb.ExecuteResult, list[int]]]
    ) -> tuple[pb.ExecuteResult, list[int]]:
        res, fds = await fut
        res.work_id = job.id
        res.steps_run = job.step
        return res, fds

    def _cancel(self, ctx: CallContext, payload: bytes) -> Empty:
        msg = pb.Cancel.FromString(payload)
        for job in list(self._client(ctx.conn).jobs):
            ex: Execution = job.payload
            if ex.model.model_id == msg.model_id and msg.exec_id in (0, ex.exec_id):
                self.scheduler.cancel(job, EndReason.CANCELLED_USER)
        self._arm()
        return Empty()
