"""A prepared model on a device: execute with inline tensors or shared memory.

Tensors up to the driver's inline limit travel inside the request frame.
Larger ones are written into a sealed memfd pool the client registered with
the driver once (fd over SCM_RIGHTS); afterwards only (pool, offset, size)
travel, and the driver writes large outputs back into the same pool.
"""

from __future__ import annotations

import itertools
import mmap
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from npumanager import tensorio
from npumanager.errors import InvalidArgument, ServiceUnavailable
from npumanager.fds import close_fds
from npumanager.proto.v1 import driver_pb2 as pb
from npumanager.tensorio import TensorSpec

if TYPE_CHECKING:
    from npumanager.nn.burst import Burst
    from npumanager.nn.device import Device
    from npumanager.nn.model_move import Follow, Recipe
    from npumanager.nn.pipeline import Pipeline
    from npumanager.wire.client import SyncRpcClient


_MIN_POOL = 1 << 20
_exec_ids = itertools.count(1)


def _numeric_tensor(spec: TensorSpec) -> bool:
    if not spec.is_tensor or not spec.dtype:
        return spec.is_tensor  # a tensor of unknown type may be numeric
    try:
        return tensorio.is_numeric(tensorio.check_dtype(spec.dtype))
    except InvalidArgument:
        return False


def _takes_value(spec: TensorSpec) -> bool:
    """Whether an input takes a sequence or map (possibly optional), not a tensor."""
    vt = spec.value_type
    while vt.kind == "optional" and vt.elem is not None:
        vt = vt.elem
    return vt.kind in ("sequence", "map")


def _as_tensor(name: str, value: Any) -> np.ndarray:
    """A numpy scalar, Python number or nested list given for a tensor input, as the
    tensor it stands for (0-d for a scalar)."""
    try:
        return tensorio.contiguous(np.asarray(value))
    except (ValueError, TypeError) as exc:
        raise InvalidArgument(f"input {name!r}: {type(value).__name__} is not a tensor: "
                              f"{exc}") from None


def _pool_size(n: int) -> int:
    size = _MIN_POOL
    while size < n:
        size *= 2
    return size


class Model:
    """A model prepared on a device. Safe to execute from several threads at once."""

    def __init__(self, device: Device, rpc: SyncRpcClient, msg: pb.PreparedModelMsg) -> None:
        self.device = device
        self._rpc = rpc
        self.model_id = msg.model_id
        self.memory_bytes = msg.memory_bytes
        self.loaded_from_cache = msg.from_cache
        #: The local cache missed and the driver loaded a signed fleet artifact instead.
        self.loaded_from_fleet = msg.from_fleet
        self.cache_written = msg.cache_written
        #: Inputs and outputs with their ONNX types (``spec.type``: element type, shape with
        #: symbolic dims, sequence/map/optional nesting).
        self.inputs = [tensorio.spec_from_msg(t) for t in msg.inputs]
        self.outputs = [tensorio.spec_from_msg(t) for t in msg.outputs]
        # Inputs whose values are not tensors (sequences, maps), even when given as lists.
        self._value_inputs = frozenset(s.name for s in self.inputs if _takes_value(s))
        self._output_order = [s.name for s in self.outputs]
        self.released = False
        self._inline_limit = device.capabilities.inline_limit
        sizes = [spec.static_nbytes() for spec in self.outputs]
        # Numeric tensors of a size known only once run (strings travel inline; tensors in
        # sequences go to the reply's memfd when the pool has no room left).
        self._dynamic_outputs = sum(n is None and _numeric_tensor(spec)
                                    for n, spec in zip(sizes, self.outputs, strict=True))
        self._static_out_need = sum(tensorio.align(n) for n in sizes
                                    if n is not None and n > self._inline_limit)
        self._lock = threading.Lock()
        self._free_pools: list[tensorio.ClientPool] = []
        self._staging: tensorio.ClientPool | None = None
        self._staging_end = 0
        self._staging_lock = threading.Lock()
        self._all_pools: list[tensorio.ClientPool] = []
        self._bursts: list[Burst] = []
        #: Its executions in flight (a move swaps hosts only between executions).
        self._inflight = 0
        #: Following its grant to the device's other host (nn/model_move.py); None until
        #: a host says the grant moved.
        self._follow: Follow | None = None
        #: How it was prepared (what it is prepared again with on the other host); set by
        #: Device.prepare_here.
        self.recipe: Recipe | None = None

    def __repr__(self) -> str:
        state = "released" if self.released else "prepared"
        origin = "from cache" if self.loaded_from_cache else "compiled"
        where = f" ({self.device.lane_name} lane)" if self.device.lane_name else ""
        return (f"<Model {self.model_id} on {self.device.name}{where} {state}, {origin}, "
                f"{self.memory_bytes} bytes>")

    # --- following its grant (nn/model_move.py) -------------------------------------

    @property
    def lane(self) -> str:
        """The host of its device it runs on now: "" the main one, "background" the
        background lane (it changes when the model follows its grant)."""
        return self.device.lane_name

    @property
    def moves(self) -> int:
        """How many times it moved to the other host of its device."""
        return self._follow.moves if self._follow is not None else 0

    def _note_moved(self, lane: str | None, *, start: bool = True) -> None:
        """An answer said the grant moved to ``lane``'s host (None: it is valid here);
        ``start``: prepare the copy there on a thread now (else when asked)."""
        follow = self._follow
        if follow is None:
            if lane is None or self.recipe is None or self.released:
                return
            from npumanager.nn.model_move import Follow

            with self._lock:
                if self._follow is None:
                    self._follow = Follow(self.recipe, self._copy_ready)
                follow = self._follow
        follow.noted(lane, self.device.lane_name, start=start)

    def _copy_ready(self) -> bool:
        """The copy on the host the grant moved to is ready (on the thread that prepared
        it, or that tries again): the model's open bursts are handed over to it
        (nn/burst_handover.py); with none open, the swap comes before its next execution
        or burst. False: try again later."""
        from npumanager.nn.burst_handover import hand_over

        follow = self._follow
        new = follow.ready if follow is not None else None
        return new is None or hand_over(self, new)

    def _idle(self) -> bool:
        """Nothing of the model in flight or open on its host (its lock held): a burst
        whose host's end went (closed, not yet closed by the app) holds nothing there."""
        return (not self._inflight and not self.released
                and all(b.closed for b in self._bursts))

    def _swap(self) -> bool:
        """Swap to the copy prepared on the host the grant moved to, if one is ready and
        nothing of this model is in flight or open on the old host; the old copy is
        released there. True when it moved."""
        follow = self._follow
        if follow is None or follow.ready is None:
            return False
        with self._lock:
            if not self._idle():
                return False
            new = follow.take()
            if new is None:
                return False
            staging = self._staging
            staging_id = 0
            if staging is not None:
                try:  # the app's input_buffers stay valid: the new host maps the same memory
                    staging_id = new._register(staging)
                except Exception:
                    new.release()
                    return False
            old = self._swap_to(new, staging_id)
        old()
        return True

    def _register(self, pool: tensorio.ClientPool) -> int:
        """Register ``pool`` (the input buffers of the model it becomes) on its host: the id."""
        payload, _ = self.device.call(self._rpc, "device.register_pool",
                                      pb.RegisterPool(size=pool.size), fds=[pool.fd])
        return int(pb.PoolId.FromString(payload).pool_id)

    def _swap_to(self, new: Model, staging_id: int) -> Callable[[], None]:
        """Become ``new`` (its lock held; nothing of it in flight, and its open bursts
        switch channels with it): pointer work only. The calls to the old host are the
        returned function's, called with no lock held: it releases the old copy and its
        pools there. ``staging_id``: the input buffers' id on the new host."""
        dev, rpc, model_id, staging = self.device, self._rpc, self.model_id, self._staging
        pools = [(p, p.pool_id) for p in self._all_pools]
        self.device, self._rpc, self.model_id = new.device, new._rpc, new.model_id
        self.memory_bytes = new.memory_bytes
        self.loaded_from_cache = new.loaded_from_cache
        self.loaded_from_fleet = new.loaded_from_fleet
        self._inline_limit = new._inline_limit
        self._free_pools, self._all_pools = [], []
        if staging is not None:
            staging.pool_id = staging_id
            self._all_pools.append(staging)
        new.released = True  # (its model is this one's now)
        if self._follow is not None:
            self._follow.arrived()

        def free_old() -> None:
            try:
                if not rpc.closed:
                    dev.call(rpc, "device.release", pb.Release(model_id=model_id))
                    for _, pool_id in pools:
                        dev.call(rpc, "device.unregister_pool", pb.PoolId(pool_id=pool_id))
            except Exception:
                pass  # the old host is gone: it released everything with the connection
            finally:
                for pool, _ in pools:
                    if pool is not staging:  # (the app's input buffers: still its own)
                        pool.close()

        return free_old

    # --- pools ----------------------------------------------------------------------

    def _take_pool(self, need: int) -> tensorio.ClientPool:
        with self._lock:
            for i, pool in enumerate(self._free_pools):
                if pool.size >= need:
                    return self._free_pools.pop(i)
        pool = tensorio.ClientPool(_pool_size(need))
        try:
            payload, _ = self.device.call(
                self._rpc, "device.register_pool", pb.RegisterPool(size=pool.size), fds=[pool.fd]
            )
        except BaseException:
            pool.close()
            raise
        pool.pool_id = pb.PoolId.FromString(payload).pool_id
        with self._lock:
            self._all_pools.append(pool)
        return pool

    def _give_pool(self, pool: tensorio.ClientPool) -> None:
        with self._lock:
            if self.released:
                pool.close()
            else:
                self._free_pools.append(pool)

    # --- zero-copy staging ----------------------------------------------------------

    def input_buffers(self, shapes: Mapping[str, tuple[int, ...]] | None = None
                      ) -> dict[str, np.ndarray]:
        """Arrays in shared memory for this model's inputs (NNAPI's ANeuralNetworksMemory):
        fill them in place and pass them to ``execute``; they travel without a copy.
        ``shapes`` gives the shape of inputs with dynamic dimensions. Calling this again
        replaces the previous buffers."""
        shapes = dict(shapes or {})
        layout: list[tuple[str, str, tuple[int, ...], int]] = []
        pos = 0
        for spec in self.inputs:
            if not spec.dtype or not _numeric_tensor(spec):
                continue  # strings, sequences, maps, optionals: passed as they are
            shape = tuple(shapes.get(spec.name, spec.shape))
            if any(d < 0 for d in shape):
                raise InvalidArgument(f"input {spec.name!r} has dynamic shape {spec.shape}; "
                                      "give its shape")
            nbytes = int(np.prod(shape, dtype=np.int64)) * tensorio.check_dtype(spec.dtype).itemsize
            layout.append((spec.name, spec.dtype, shape, pos))
            pos = tensorio.align(pos + nbytes)
        out_need = self._static_out_need + self._dynamic_outputs * pos
        with self._lock:
            old, self._staging = self._staging, None
        if old is not None:
            self._give_pool(old)
        pool = self._take_pool(pos + out_need)
        views = {name: tensorio.view_in(pool.buf, off, int(np.prod(shape, dtype=np.int64))
                                       * tensorio.check_dtype(dt).itemsize, dt, shape, name)
                 for name, dt, shape, off in layout}
        with self._lock:
            self._staging = pool
            self._staging_end = pos
        return views

    def _staged_offset(self, pool: tensorio.ClientPool, arr: np.ndarray) -> int | None:
        """Where ``arr`` lies in ``pool`` if it is one of its views, else None."""
        base = np.frombuffer(pool.buf, np.uint8, count=1).ctypes.data
        addr = arr.ctypes.data
        if base <= addr and addr + arr.nbytes <= base + pool.size:
            return int(addr - base)
        return None

    # --- execute -------------------------------------------------------------------

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
        """Run the model (``steps`` times, feeding ``feedback`` outputs into inputs).

        Inputs and outputs are ONNX values as ONNX Runtime's Python API has them: numpy
        arrays for tensors (any element type, 0-d included; object arrays of str for
        strings), lists for sequences, dicts for maps, None for an absent optional.
        With ``copy_outputs=False`` large outputs are returned as views of shared memory,
        valid until the next execute of this model (saves a copy of big tensors)."""
        if self.released:
            raise InvalidArgument("this model was released")
        if self._follow is not None and self._follow.ready is not None:
            self._swap()  # its grant moved and the copy on the new host is ready
        if steps < 1:
            raise InvalidArgument(f"steps must be >= 1, got {steps}")
        if group_id is not None and len(group_id) != 16:
            raise InvalidArgument("group_id is a 16-byte UUID")
        arrays: dict[str, np.ndarray] = {}
        values: dict[str, Any] | None = None
        for name, a in inputs.items():
            if type(a) is np.ndarray:
                arrays[name] = a if a.flags.c_contiguous else np.ascontiguousarray(a)
            elif a is None or name in self._value_inputs or isinstance(a, dict):
                if values is None:
                    values = {}
                values[name] = a
            else:
                arrays[name] = _as_tensor(name, a)
        msg = pb.Execute(
            model_id=self.model_id, job_priority=int(job_priority),
            has_feature_id=feature_id is not None, feature_id=feature_id or 0,
            has_original_uid=original_uid is not None, original_uid=original_uid or 0,
            steps=steps, feedback=dict(feedback or {}), exec_id=next(_exec_ids),
            group_id=group_id or b"",
        )
        with self._lock:
            self._inflight += 1
        try:
            return self._execute(msg, arrays, values, copy_outputs)
        finally:
            with self._lock:
                self._inflight -= 1

    def _execute(self, msg: pb.Execute, arrays: dict[str, np.ndarray],
                 values: dict[str, Any] | None, copy_outputs: bool) -> dict[str, Any]:
        msg.model_id = self.model_id  # (after a move: the copy on the new host)
        staging = self._staging
        staged: dict[str, int] = {}
        if staging is not None:
            for name, arr in arrays.items():
                off = self._staged_offset(staging, arr)
                if off is not None:
                    staged[name] = off
        limit = self._inline_limit
        if staged:
            assert staging is not None
            self._staging_lock.acquire()
            pool: tensorio.ClientPool | None = staging
            pos = self._staging_end
        else:
            big = [a for a in arrays.values() if a.nbytes > limit and a.dtype.kind not in "OUS"]
            if values:
                big += [a for v in values.values() for a in tensorio.tensors_in(v)
                        if a.nbytes > limit and a.dtype.kind not in "OUS"]
            out_need = self._static_out_need
            if self._dynamic_outputs:
                # Unknown until it runs: guess each is as large as the largest input.
                nb = max((a.nbytes for a in arrays.values()), default=0)
                if nb > limit:
                    out_need += self._dynamic_outputs * tensorio.align(nb)
            in_need = sum(tensorio.align(a.nbytes) for a in big)
            pool = self._take_pool(in_need + out_need) if (big or out_need) else None
            pos = 0
        try:
            for name, arr in arrays.items():
                dt = tensorio.dtype_name(arr.dtype)
                if name in staged:
                    assert pool is not None
                    msg.inputs.add(name=name, dtype=dt, shape=arr.shape, pool_id=pool.pool_id,
                                   offset=staged[name], nbytes=arr.nbytes)
                elif pool is not None and arr.nbytes > limit and arr.dtype.kind not in "OUS":
                    start = tensorio.align(pos)
                    view = tensorio.view_in(pool.buf, start, arr.nbytes, dt, arr.shape, name)
                    np.copyto(view, arr)
                    del view
                    msg.inputs.add(name=name, dtype=dt, shape=arr.shape, pool_id=pool.pool_id,
                                   offset=start, nbytes=arr.nbytes)
                    pos = start + arr.nbytes
                else:
                    tensorio.add_inline(msg.inputs, name, arr)
            if values:
                pos = self._encode_values(msg, values, pool, pos)
            if pool is not None:
                pos = tensorio.align(pos)
                msg.out_pool_id = pool.pool_id
                msg.out_offset = pos
                msg.out_capacity = pool.size - pos
            payload, fds = self.device.call(self._rpc, "device.execute", msg)
            try:
                res = pb.ExecuteResult.FromString(payload)
                if res.moved or self._follow is not None:
                    self._note_moved(res.moved_lane if res.moved else None)
                return self._outputs(res, pool, fds, copy_outputs)
            finally:
                close_fds(fds)
        finally:
            if staged:
                self._staging_lock.release()
            elif pool is not None:
                self._give_pool(pool)

    def _encode_values(self, msg: pb.Execute, values: dict[str, Any],
                       pool: tensorio.ClientPool | None, pos: int) -> int:
        """Sequences, maps and optionals into ``msg.values``; their large numeric tensors
        into ``pool`` from ``pos`` on (the space was counted). Returns the new end."""
        limit = self._inline_limit

        def place(t: pb.Tensor, arr: np.ndarray) -> None:
            nonlocal pos
            if pool is None or arr.nbytes <= limit:
                tensorio.fill_inline(t, arr)
                return
            start = tensorio.align(pos)
            view = tensorio.view_in(pool.buf, start, arr.nbytes, t.dtype, arr.shape, t.name)
            np.copyto(view, arr)
            del view
            t.pool_id, t.offset, t.nbytes = pool.pool_id, start, arr.nbytes
            pos = start + arr.nbytes

        for name, value in values.items():
            tensorio.encode_value(msg.values.add(name=name), value, place)
        return pos

    def _outputs(self, res: pb.ExecuteResult, pool: tensorio.ClientPool | None, fds: list[int],
                 copy: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {}
        reply_map: mmap.mmap | None = None

        def resolve(t: pb.Tensor) -> np.ndarray:
            nonlocal reply_map
            if t.in_reply_fd:
                if reply_map is None:
                    if not fds:
                        raise ServiceUnavailable("the driver's output memfd did not arrive")
                    reply_map = mmap.mmap(fds[0], 0, mmap.MAP_SHARED, mmap.PROT_READ)
                return tensorio.view_in(reply_map, t.offset, t.nbytes, t.dtype, t.shape,
                                        t.name).copy()
            if t.pool_id:
                if pool is None or t.pool_id != pool.pool_id:
                    raise ServiceUnavailable("the driver named a pool this call did not use")
                view = tensorio.view_in(pool.buf, t.offset, t.nbytes, t.dtype, t.shape, t.name)
                return view.copy() if copy else view
            arr = tensorio.inline_array(t)
            return arr.copy() if arr.dtype.kind not in "OUS" else arr

        try:
            for t in res.outputs:
                out[t.name] = resolve(t)
            if res.values:
                for v in res.values:
                    out[v.name] = tensorio.decode_value(v, resolve)
                # In the model's order, as ONNX Runtime lists them.
                out = {n: out[n] for n in self._output_order if n in out} | out
        finally:
            if reply_map is not None:
                reply_map.close()
        return out

    # --- bursts ------------------------------------------------------------------------

    def burst(self, *, spin_us: float | None = 0.0, slice_us: int = 0,
              realtime: bool = False) -> Burst:
        """A burst of executions at a stream's own pace (NNAPI's ANeuralNetworksBurst):
        ``with model.burst() as b: b.execute(...)``. Sets up a shared-memory channel with
        the driver once; each execution is then one wake-up each way. ``spin_us``: poll
        for the answer that long first (0: never; None: adaptive, only while the stream
        runs back to back and it pays, bounded: :mod:`npumanager.nn.burst_spin`);
        ``slice_us``: the executing
        thread's EEVDF slice (0: the kernel's); ``realtime``: ask npud to put the
        executing thread at SCHED_FIFO (:mod:`npumanager.nn.realtime`). See
        :mod:`npumanager.nn.burst`."""
        from npumanager.nn.burst import Burst

        if self.released:
            raise InvalidArgument("this model was released")
        b = self._open_burst(Burst, spin_us, slice_us, realtime)
        follow = self._follow
        if (follow is not None and follow.target is not None
                and follow.target != self.device.lane_name and self._bursts == [b]):
            # Its grant moved (this open's answer, or an earlier one, said so): follow
            # now, before the stream starts, the burst handed over to the copy there
            # (nn/model_move.py, nn/burst_handover.py).
            follow.prepare_now(follow.target)
        return b

    def _open_burst(self, burst: type[Burst], spin_us: float | None, slice_us: int,
                    realtime: bool) -> Burst:
        if self._follow is not None and self._follow.ready is not None:
            self._swap()
        with self._lock:
            self._inflight += 1  # (no swap or hand-over while it opens on this host)
        try:
            b = burst(self, spin_us=spin_us, slice_us=slice_us, realtime=realtime)
            with self._lock:
                self._bursts.append(b)  # (counted open before it stops counting in flight)
            return b
        finally:
            with self._lock:
                self._inflight -= 1

    def pipeline(self, *, depth: int = 2, job_priority: int = 0) -> Pipeline:
        """Independent executions kept ``depth`` in flight (an embedder's batches):
        ``with model.pipeline() as p: for out in p.map(batches): ...``. The driver has
        the next one queued when one ends, instead of waiting for its round trip. See
        :mod:`npumanager.nn.pipeline`."""
        from npumanager.nn.pipeline import Pipeline

        if self.released:
            raise InvalidArgument("this model was released")
        return Pipeline(self, depth=depth, job_priority=job_priority)

    def _forget_burst(self, b: Burst) -> None:
        with self._lock:
            if b in self._bursts:
                self._bursts.remove(b)

    def cancel(self) -> None:
        """Cancel this model's queued and running executions (from another thread)."""
        if not self.released:
            self.device.call(self._rpc, "device.cancel", pb.Cancel(model_id=self.model_id))

    def release(self) -> None:
        """Free the model in the driver; safe to call twice."""
        if self._follow is not None:
            self._follow.close()
        with self._lock:
            bursts = list(self._bursts)
        for b in bursts:
            b.close()
        with self._lock:
            if self.released:
                return
            self.released = True
            pools, self._all_pools, self._free_pools = self._all_pools, [], []
        try:
            if not self._rpc.closed:
                self.device.call(self._rpc, "device.release", pb.Release(model_id=self.model_id))
                for pool in pools:
                    self.device.call(self._rpc, "device.unregister_pool",
                                     pb.PoolId(pool_id=pool.pool_id))
        except Exception:
            pass  # the driver is gone: it released everything with the connection
        finally:
            for pool in pools:
                pool.close()

    def __enter__(self) -> Model:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
