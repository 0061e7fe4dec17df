"""Bursts: executions of one model at a stream's own pace, one wake-up each way.

NNAPI's ``ANeuralNetworksBurst``::

    with model.burst() as b:
        for frame in camera:
            out = b.execute({"x": frame})

Opening a burst sets up, once, a shared-memory channel with the driver: a
sealed memfd (header, request area, response area, tensors; layout in
:mod:`npumanager.tensorio.burst`) sent with ``SCM_RIGHTS`` on the model's
connection, and a doorbell socket the driver sends back. Each execution writes
its request and tensors into the memfd, rings once, and blocks until the
driver's burst thread rings back: no frame through the RPC socket, no event
loop or worker hand-off in the driver. The driver still decides when the work
runs (priority, preemption, thermal hold-back, revocation) exactly as for
``model.execute``.

``spin_us`` (default 0: never) polls the response for that long before blocking
(yielding the CPU at each look, so that the driver's thread woken onto this CPU runs): on
a machine with a core to spare it saves the client's own wake-up for a model that answers
within the spin, at the price of that CPU (bench/execute_overhead.py measures both).
``spin_us=None`` is adaptive: it spins only while the stream runs back to back and its
spun answers come sooner than its blocked ones, bounded by its recent answer times
(:mod:`.burst_spin`); an opt-in (bench/README.md "Bursts: a stream at its own pace" has
what it measured). One execution at a time per burst; open one burst per thread.

``slice_us`` (default 0: the kernel's) sets the EEVDF slice of the thread that executes
(hal/sched_slice.py, Linux 6.12+; 100-100000 µs): a thread with a short slice woken by
the answer may preempt the one running on its CPU at once instead of waiting for that
one's slice to end or the next tick. It is the app's own thread (any uid may shorten its
own threads' slices; a slice is not more CPU), set at its first execution; ``sliced``
says whether the kernel took it, and a close on that thread gives it the kernel's slice
back. bench/README.md "foreground_slice_us" has what it measured.

``realtime`` (default False) asks npud, once per executing thread, to put that thread at
SCHED_FIFO for the burst's life (:mod:`npumanager.nn.realtime`: FOREGROUND apps, and
VISIBLE ones where npud's ``app_rt_importance`` says so, as foreground protection does;
bounded by npud's watchdog); ``realtime_granted`` says whether it did and
``realtime_error`` why not; a refusal is logged once and the burst goes on without it.
bench/README.md "Real-time app threads".

A model whose grant moves to its device's other host (nn/model_move.py) takes its open
bursts with it while they stream: each switches to a channel opened beside its own on
the new host between two executions (:mod:`.burst_handover`). The burst object stays the
same and open; its ``burst_id`` becomes the new host's.

Inputs in the model's ``input_buffers()`` (memory registered once, NNAPI's
``ANeuralNetworksMemory``) are not copied: the request names them where they
lie, so a stream that fills them in place (a camera frame) sends no tensor bytes
at all. Other large inputs are copied into the burst's own memory. A stream
that repeats its request only rewrites its inputs' slots and the sequence
number (:mod:`.burst_repeat`).
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from npumanager import tensorio
from npumanager.errors import (
    DeviceUnavailable,
    InvalidArgument,
    LimitExceeded,
    NpuError,
    error_from_wire,
)
from npumanager.hal.sched_slice import check_slice_us, set_slice, set_this_thread
from npumanager.nn.burst_channel import RING_WAIT, Channel, open_channel
from npumanager.nn.burst_repeat import FixedLayout
from npumanager.nn.burst_spin import Spin
from npumanager.nn.realtime import RealtimeLink
from npumanager.proto.v1 import driver_pb2 as pb
from npumanager.tensorio import burst as layout

if TYPE_CHECKING:
    from npumanager.nn.model import Model

#: Numeric tensors up to this size travel inside the request; larger ones in the data area.
_INLINE = 1024
_MIN_DATA = 64 * 1024
_MIN_AREA = 64 * 1024
#: Tries of one execution whose outputs outgrew the shared memory (each grows it).
_GROW_TRIES = 4
_put_seq = struct.Struct("<Q").pack_into
_put_stamps = struct.Struct("<QQ").pack_into
#: The client's clock for the header's stamps (CLOCK_MONOTONIC, as the driver's).
_now_ns = time.monotonic_ns


class _Grow(Exception):
    def __init__(self, req: int = 0, resp: int = 0, data: int = 0) -> None:
        super().__init__("grow")
        self.req, self.resp, self.data = req, resp, data


class Burst:
    """A burst of executions of one model; see the module docstring."""

    def __init__(self, model: Model, *, spin_us: float | None = 0.0, slice_us: int = 0,
                 realtime: bool = False) -> None:
        if spin_us is not None and not spin_us >= 0:
            raise InvalidArgument(f"spin_us must be >= 0 (or None: adaptive), got {spin_us}")
        self.model = model
        #: How long each execution polls for its answer (.burst_spin).
        self.spin = Spin(spin_us)
        #: The EEVDF slice asked for the executing thread (0: none), and that thread's
        #: id once tried; ``sliced``: whether the kernel took it.
        self.slice_us = check_slice_us(slice_us)
        self._sliced_tid = 0
        self.sliced = False
        #: npud's real-time grant (nn/realtime.py): the link, the thread asked for, and
        #: whether npud granted it.
        self._realtime: RealtimeLink | None = (
            RealtimeLink(getattr(model.device, "runtime_dir", None)) if realtime else None)
        self._rt_tid = 0
        self.realtime_granted = False
        self.closed = False
        self._lock = threading.Lock()
        self._seq = 0
        #: The channel it serves through (nn/burst_channel.py), whose fields the
        #: execution path reads from the attributes below (:meth:`_install`). A model
        #: that follows its grant to the other host installs another one between two
        #: executions (nn/burst_handover.py): ``burst_id`` then changes.
        self._channel: Channel | None = None
        self._pool: tensorio.ClientPool | None = None
        self._sock: socket.socket | None = None
        self.burst_id = 0
        self._ring_wait = RING_WAIT
        self._req, self._resp, self._data_start = 0, 0, 0
        self._fixed: FixedLayout | None = None
        #: Numeric tensors up to this size travel inside the request (0 once a request
        #: outgrew the largest request area: then all go in the data area, which grows).
        self._inline = _INLINE
        self._timeout = float(getattr(model._rpc, "call_timeout", 300.0))
        self._same_views: list[tuple[str, np.ndarray]] | None = None
        self._open(_MIN_AREA, _MIN_AREA, self._data_guess())

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        size = self._pool.size if self._pool is not None else 0
        return f"<Burst {self.burst_id} of model {self.model.model_id} {state}, {size} bytes>"

    # --- the channel ---------------------------------------------------------------

    def _data_guess(self) -> int:
        m = self.model
        ins = [s.static_nbytes() for s in m.inputs]
        # Every static tensor gets a slot of its own (the fixed request, below).
        in_need = sum(tensorio.align(n) for n in ins if n is not None)
        out_need = sum(tensorio.align(n) for s in m.outputs
                       if (n := s.static_nbytes()) is not None)
        dynamic = sum(s.static_nbytes() is None for s in m.outputs)
        return max(_MIN_DATA, in_need + out_need + dynamic * max(in_need, _MIN_DATA))

    def _open(self, req: int, resp: int, data: int) -> None:
        m = self.model
        ch = open_channel(m.device, m._rpc, m.model_id, m, req, resp, data, self._timeout)
        if ch.moved_lane is not None:  # its grant moved to the other host: Model.burst
            m._note_moved(ch.moved_lane, start=False)  # follows it
        self._install(ch)

    def _install(self, ch: Channel) -> Channel | None:
        """Serve through ``ch`` from the next execution on (its lock held, or the burst
        not yet shared); the channel it served through until now."""
        old = self._detach()
        self._channel = ch
        self._pool, self._sock, self.burst_id = ch.pool, ch.sock, ch.burst_id
        self._ring_wait = ch.ring_wait
        self._req, self._resp, self._data_start = ch.req, ch.resp, ch.data_start
        self._seq = 0
        self._fixed = ch.fixed
        return old

    def _detach(self) -> Channel | None:
        """No channel from now on (its lock held); the one it had."""
        # (its views of the memory first: a mapping with views stays)
        self._fixed = self._same_views = None
        ch, self._channel, self._pool, self._sock = self._channel, None, None, None
        return ch

    def _close_channel(self) -> None:
        ch = self._detach()
        if ch is not None:
            ch.close()

    def _drop(self) -> None:
        """The driver's end is gone: close ours (nothing to tell it)."""
        self.closed = True
        ch = self._detach()
        if ch is not None:
            ch.drop()

    def _grow(self, g: _Grow) -> None:
        assert self._pool is not None
        data = self._pool.size - self._data_start
        req = max(self._req, _area(g.req, layout.MAX_REQUEST_AREA))
        resp = max(self._resp, _area(g.resp))
        if g.data:
            data = max(2 * data, data + g.data)
        self._close_channel()
        self._open(req, resp, data)

    @property
    def realtime_error(self) -> NpuError | None:
        """Why npud refused ``realtime=True`` (the typed error it answered: not important
        enough, real-time threads off in its config, a uid over its bound or in its
        cooldown, ...), None where it granted it, was not asked, or nothing was executed
        yet."""
        return None if self._realtime is None or self.realtime_granted \
            else self._realtime.error

    def close(self) -> None:
        """End the burst (the driver's thread ends, the memory is unmapped); safe twice."""
        with self._lock:
            self.closed = True
            self._close_channel()
            if self.sliced and self._sliced_tid == threading.get_native_id():
                set_slice(0)  # (another thread's is left: its id may be reused by now)
                self.sliced = False
            if self._realtime is not None:
                self._realtime.close()  # npud demotes the thread it granted
                self.realtime_granted = False
        self.model._forget_burst(self)

    def __enter__(self) -> Burst:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- execute ---------------------------------------------------------------------

    def execute(
        self,
        inputs: Mapping[str, Any],
        job_priority: int = 0,
        feature_id: int | None = None,
        original_uid: int | None = None,
        steps: int = 1,
        feedback: Mapping[str, str] | None = None,
        *,
        group_id: bytes | None = None,
        copy_outputs: bool = True,
    ) -> dict[str, Any]:
        """As :meth:`Model.execute`, through the burst's channel. With
        ``copy_outputs=False`` large outputs are views of the burst's memory, valid
        until its next execution."""
        called = _now_ns()
        spin = self.spin
        spin.called(called / 1e9)
        try:
            return self._execute_once(inputs, job_priority, feature_id, original_uid, steps,
                                      feedback, group_id, copy_outputs, called)
        finally:
            spin.done(_now_ns() / 1e9)

    def _execute_once(self, inputs: Mapping[str, Any], job_priority: int,
                      feature_id: int | None, original_uid: int | None, steps: int,
                      feedback: Mapping[str, str] | None, group_id: bytes | None,
                      copy_outputs: bool, called: int) -> dict[str, Any]:
        if steps < 1:
            raise InvalidArgument(f"steps must be >= 1, got {steps}")
        if group_id is not None and len(group_id) != 16:
            raise InvalidArgument("group_id is a 16-byte UUID")
        with self._lock:
            if self.closed or self.model.released:
                raise InvalidArgument("this burst was closed" if self.closed
                                      else "this model was released")
            if self.slice_us and self._sliced_tid != threading.get_native_id():
                self._slice_this_thread()
            if self._realtime is not None and self._rt_tid != threading.get_native_id():
                self._rt_tid = threading.get_native_id()
                self.realtime_granted = self._realtime.ask()
            fixed = self._fixed
            if (fixed is not None and steps == 1 and not feedback and group_id is None
                    and fixed.put(inputs, (job_priority, feature_id, original_uid),
                                  self.model)):
                try:
                    return self._again(fixed, copy_outputs, called)
                except _Grow as g:
                    self._grow(g)
            for _ in range(_GROW_TRIES):
                try:
                    return self._execute(inputs, job_priority, feature_id, original_uid,
                                         steps, feedback, group_id, copy_outputs, called)
                except _Grow as g:
                    self._grow(g)
            raise LimitExceeded("the outputs kept outgrowing the burst's shared memory")

    def _slice_this_thread(self) -> None:
        """The executing thread to ``slice_us``, tried once per thread (a refusal: the
        kernel's slice stays, ``sliced`` False, logged once)."""
        self._sliced_tid = threading.get_native_id()
        self.sliced = set_this_thread(self.slice_us, "model.burst(slice_us)")

    def _execute(self, inputs: Mapping[str, Any], job_priority: int, feature_id: int | None,
                 original_uid: int | None, steps: int, feedback: Mapping[str, str] | None,
                 group_id: bytes | None, copy: bool, called: int = 0) -> dict[str, Any]:
        pool, sock = self._pool, self._sock
        if pool is None or sock is None:
            raise DeviceUnavailable("the burst's channel is gone")
        fixed = self._fixed
        if (fixed is not None and steps == 1 and not feedback and group_id is None
                and fixed.place(inputs, (job_priority, feature_id, original_uid),
                                self.model)):
            # The request in the memory is already the right one: ring.
            return self._round_trip(pool, sock, fixed, copy, called=called)
        msg = pb.Execute(
            model_id=self.model.model_id, job_priority=int(job_priority),
            has_feature_id=feature_id is not None, feature_id=feature_id or 0,
            has_original_uid=original_uid is not None, original_uid=original_uid or 0,
            steps=steps, feedback=dict(feedback or {}), group_id=group_id or b"",
        )
        staging = self.model._staging
        pos = self._place_inputs(msg, inputs, pool, staging)
        pos = tensorio.align(pos)
        if pool.size - pos < _MIN_DATA // 4:
            raise _Grow(data=pos - self._data_start + _MIN_DATA)
        msg.out_pool_id, msg.out_offset, msg.out_capacity = pool.pool_id, pos, pool.size - pos
        data = msg.SerializeToString()
        if len(data) > self._req:
            if len(data) <= layout.MAX_REQUEST_AREA:
                raise _Grow(req=len(data))
            if self._inline:
                # Too large for any request area (the driver parses it holding its GIL):
                # every numeric tensor into the data area, grown at once to hold them all.
                self._inline = 0
                need = sum(tensorio.align(a.nbytes) for v in inputs.values()
                           for a in tensorio.tensors_in(v) if a.dtype.kind not in "OUS")
                if need + _MIN_DATA > pool.size - self._data_start:
                    raise _Grow(data=need + _MIN_DATA)
                return self._execute(inputs, job_priority, feature_id, original_uid, steps,
                                     feedback, group_id, copy, called)
            # Strings and maps travel inline only: as a plain execute, which takes what
            # a frame to the driver holds.
            return self.model.execute(inputs, job_priority, feature_id, original_uid,
                                      steps, feedback, group_id=group_id,
                                      copy_outputs=copy)
        start = layout.HEADER
        pool.buf[start:start + len(data)] = data
        return self._round_trip(pool, sock, None, copy, len(data), called)

    def _again(self, fixed: FixedLayout, copy: bool, called: int) -> dict[str, Any]:
        """The fixed request again, its inputs in place (``FixedLayout.put``): the request
        and its length are in the memory already, so only the stamps (when the call began
        and now: the driver learns the stream's pace from them, drivers/anticipate.py)
        and the sequence number are new."""
        pool, sock = self._pool, self._sock
        assert pool is not None and sock is not None  # (the fixed layout goes with them)
        buf = pool.buf
        self._seq = seq = self._seq + 1
        _put_stamps(buf, layout.CALLED_AT, called, _now_ns())
        _put_seq(buf, layout.REQ_AT, seq)
        try:
            sock.send(b"\1")
        except OSError:
            raise self._gone() from None
        status, length = self._wait(seq, buf, sock)
        views = self._same_views
        if status == layout.SAME and views is not None:
            if copy:
                return {name: v.copy() for name, v in views}
            return dict(views)
        return self._answered(pool, fixed, copy, status, length)

    def _round_trip(self, pool: tensorio.ClientPool, sock: socket.socket,
                    fixed: FixedLayout | None, copy: bool, length: int = 0,
                    called: int = 0) -> dict[str, Any]:
        """Ring for the request in the memory (``fixed``'s, else ``length`` bytes) and
        read the answer."""
        buf = pool.buf
        self._seq += 1
        seq = self._seq
        if self._fixed is not None:
            # Whether the request area and its length hold the fixed request now.
            self._fixed.written = fixed is not None
        _put_stamps(buf, layout.CALLED_AT, called, _now_ns())
        layout.write_request_header(buf, seq, len(fixed.data) if fixed is not None else length)
        try:
            sock.send(b"\1")
        except OSError:
            raise self._gone() from None
        status, length = self._wait(seq, buf, sock)
        return self._answered(pool, fixed, copy, status, length)

    def _answered(self, pool: tensorio.ClientPool, fixed: FixedLayout | None, copy: bool,
                  status: int, length: int) -> dict[str, Any]:
        buf = pool.buf
        if status == layout.SAME:
            # The outputs lie where the last full answer (to this same request) said.
            views = self._same_views
            if views is None:
                raise DeviceUnavailable("the driver answered SAME to a request it never "
                                        "answered in full")
            return {name: v.copy() for name, v in views} if copy else dict(views)
        at = layout.HEADER + self._req
        if not 0 <= length <= self._resp:
            raise DeviceUnavailable(f"the driver answered {length} bytes into a "
                                    f"{self._resp}-byte response area")
        payload = bytes(buf[at:at + length])
        if status != layout.OK:
            err = pb.BurstError.FromString(payload)
            if err.need_bytes and err.type == "LimitExceeded":
                raise _Grow(resp=int(err.need_bytes) if "response" in err.message else 0,
                            data=int(err.need_bytes))
            raise error_from_wire(err.type, err.message)
        result = pb.ExecuteResult.FromString(payload)
        # The driver answers SAME to a repeat of the request it last answered in full, be
        # it the fixed one or not (the bytes of any request may repeat).
        self._same_views = views = _views_of(result, pool)
        if fixed is not None:
            fixed.out_views = views
        return self.model._outputs(result, pool, [], copy)

    def _place_inputs(self, msg: pb.Execute, inputs: Mapping[str, Any],
                      pool: tensorio.ClientPool, staging: tensorio.ClientPool | None) -> int:
        """Small tensors into the request, views of the model's input buffers
        (``staging``) named where they lie, other large ones into the data area; the
        data end."""
        pos = self._data_start
        staged_offset = self.model._staged_offset
        values: dict[str, Any] = {}
        value_inputs = self.model._value_inputs

        inline = self._inline

        def place(t: pb.Tensor, arr: np.ndarray) -> None:
            nonlocal pos
            if arr.nbytes <= inline or arr.dtype.kind in "OUS":
                tensorio.fill_inline(t, arr)
                return
            start = tensorio.align(pos)
            if start + arr.nbytes > pool.size:
                raise _Grow(data=start + arr.nbytes - self._data_start + _MIN_DATA)
            view = tensorio.view_in(pool.buf, start, arr.nbytes, t.dtype, arr.shape, t.name)
            np.copyto(view, arr)
            del view
            t.pool_id, t.offset, t.nbytes = pool.pool_id, start, arr.nbytes
            pos = start + arr.nbytes

        for name, a in inputs.items():
            if type(a) is not np.ndarray:
                if a is None or name in value_inputs or isinstance(a, dict):
                    values[name] = a
                    continue
                try:
                    a = tensorio.contiguous(np.asarray(a))
                except (ValueError, TypeError) as exc:
                    raise InvalidArgument(f"input {name!r}: {type(a).__name__} is not a "
                                          f"tensor: {exc}") from None
            elif not a.flags.c_contiguous:
                a = np.ascontiguousarray(a)
            if a.nbytes <= inline or a.dtype.kind in "OUS":
                tensorio.add_inline(msg.inputs, name, a)
            elif staging is not None and (off := staged_offset(staging, a)) is not None:
                msg.inputs.add(name=name, dtype=tensorio.dtype_name(a.dtype), shape=a.shape,
                               pool_id=staging.pool_id, offset=off, nbytes=a.nbytes)
            else:
                place(msg.inputs.add(name=name, dtype=tensorio.dtype_name(a.dtype),
                                     shape=a.shape), a)
        for name, value in values.items():
            tensorio.encode_value(msg.values.add(name=name), value, place)
        return pos

    def _wait(self, seq: int, buf: Any, sock: socket.socket) -> tuple[int, int]:
        """Until the driver answered ``seq``: (status, length)."""
        read = layout.read_response_header
        spin, clock = self.spin, time.perf_counter
        rang = clock()
        span = spin.window()
        if span > 0 and spin.spin(span, lambda: read(buf)[0] == seq):
            spin.answered(clock() - rang, True, True)
            self._take_rings(sock)
            _, status, length = read(buf)
            if status > layout.SAME:  # (the MOVED bits: the grant moved)
                status = self._moved(status)
            return status, length
        # Blocked in the ring's recv itself, the socket's receive timeout (RING_WAIT)
        # bounding each: one system call per answer where a poll and a recv were two, and
        # no clock read but the spin's two (measured cold, 30 Hz: 54 vs 69 µs).
        waited = 0.0
        while True:
            try:
                rung = sock.recv(16)
            except BlockingIOError:  # a RING_WAIT without a ring
                waited += self._ring_wait
                if waited >= self._timeout:
                    self._drop()
                    raise DeviceUnavailable(f"the driver did not answer a burst execution "
                                            f"within {self._timeout} s") from None
                continue
            except OSError:
                raise self._gone() from None
            # One ring per answer: draining until empty would cost an EAGAIN system call
            # per execution. A stale ring (a spun answer's) is taken here later.
            got, status, length = read(buf)
            if got == seq:
                spin.answered(clock() - rang, span > 0, False)
                if status > layout.SAME:  # (the MOVED bits: the grant moved)
                    status = self._moved(status)
                return status, length
            if not rung:
                raise self._gone()

    def _moved(self, status: int) -> int:
        """An answer said the model's grant moved to the device's other host: the model
        prepares there and hands its open bursts over to it once that is ready
        (nn/model_move.py, nn/burst_handover.py)."""
        self.model._note_moved(layout.moved_lane(status))
        return status & layout.STATUS_MASK

    def _take_rings(self, sock: socket.socket, most: int = 1 << 30) -> bool:
        """Take up to ``most`` rings of the doorbell; True when the driver's end hung up."""
        for _ in range(most):
            try:
                if not sock.recv(16, socket.MSG_DONTWAIT):
                    return True
            except BlockingIOError:
                return False
            except OSError:
                return True
        return False

    def _gone(self) -> NpuError:
        self._drop()
        return DeviceUnavailable(f"device {self.model.device.name}: the burst's driver end "
                                 "closed (the driver restarted or dropped the model)")


def _views_of(result: pb.ExecuteResult, pool: tensorio.ClientPool
              ) -> list[tuple[str, np.ndarray]] | None:
    """A full answer's output views, when every output lies in the burst's memory (the
    driver answers SAME after it only then)."""
    if result.values:
        return None
    views = []
    for t in result.outputs:
        if t.pool_id != pool.pool_id or t.in_reply_fd:
            return None
        views.append((t.name, tensorio.view_in(pool.buf, t.offset, t.nbytes, t.dtype,
                                               t.shape, t.name)))
    return views


def _area(n: int, most: int = layout.MAX_AREA) -> int:
    """An area size that holds ``n`` bytes with room to spare (at most ``most``)."""
    size = _MIN_AREA
    while size < 2 * n:
        size *= 2
    return min(size, most)
