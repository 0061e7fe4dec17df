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
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from npumanager.drivers import tensors
from npumanager.errors import InvalidArgument, ServiceUnavailable
from npumanager.proto.v1 import driver_pb2 as pb
from npumanager.wire.conn import close_fds

if TYPE_CHECKING:
    from npumanager.nn.device import Device
    from npumanager.wire.client import SyncRpcClient

_MIN_POOL = 1 << 20
_exec_ids = itertools.count(1)


@dataclass(frozen=True)
class TensorSpec:
    """A model input or output as the driver reports it (-1 = dynamic dimension)."""

    name: str
    dtype: str
    shape: tuple[int, ...]

    def static_nbytes(self) -> int | None:
        if any(d < 0 for d in self.shape):
            return None
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


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
        self.cache_written = msg.cache_written
        self.inputs = [TensorSpec(t.name, t.dtype, tuple(t.shape)) for t in msg.inputs]
        self.outputs = [TensorSpec(t.name, t.dtype, tuple(t.shape)) for t in msg.outputs]
        self.released = False
        self._inline_limit = device.capabilities.inline_limit
        self._lock = threading.Lock()
        self._free_pools: list[tensors.ClientPool] = []
        self._all_pools: list[tensors.ClientPool] = []

    def __repr__(self) -> str:
        state = "released" if self.released else "prepared"
        origin = "from cache" if self.loaded_from_cache else "compiled"
        return (f"<Model {self.model_id} on {self.device.name} {state}, {origin}, "
                f"{self.memory_bytes} bytes>")

    # --- pools ----------------------------------------------------------------------

    def _take_pool(self, need: int) -> tensors.ClientPool:
        with self._lock:
            for i, pool in enumerate(self._free_pools):
                if pool.size >= need:
                    return self._free_pools.pop(i)
        pool = tensors.ClientPool(_pool_size(need))
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

    def _give_pool(self, pool: tensors.ClientPool) -> None:
        with self._lock:
            if self.released:
                pool.close()
            else:
                self._free_pools.append(pool)

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
    ) -> dict[str, np.ndarray]:
        """Run the model (``steps`` times, feeding ``feedback`` outputs into inputs)."""
        if self.released:
            raise InvalidArgument("this model was released")
        if steps < 1:
            raise InvalidArgument(f"steps must be >= 1, got {steps}")
        if group_id is not None and len(group_id) != 16:
            raise InvalidArgument("group_id is a 16-byte UUID")
        arrays = {name: np.ascontiguousarray(a) for name, a in inputs.items()}
        msg = pb.Execute(
            model_id=self.model_id, job_priority=int(job_priority),
            has_feature_id=feature_id is not None, feature_id=feature_id or 0,
            has_original_uid=original_uid is not None, original_uid=original_uid or 0,
            steps=steps, feedback=dict(feedback or {}), exec_id=next(_exec_ids),
            group_id=group_id or b"",
        )
        big = [(n, a) for n, a in arrays.items() if a.nbytes > self._inline_limit]
        out_need = 0
        for spec in self.outputs:
            nb = spec.static_nbytes()
            if nb is None:
                # Unknown until it runs: guess it is as large as the largest input.
                nb = max((a.nbytes for a in arrays.values()), default=0)
            if nb > self._inline_limit:
                out_need += tensors.align(nb)
        in_need = sum(tensors.align(a.nbytes) for _, a in big)
        pool = self._take_pool(in_need + out_need) if (big or out_need) else None
        try:
            pos = 0
            for name, arr in arrays.items():
                if pool is not None and arr.nbytes > self._inline_limit:
                    view = tensors.view_in(pool.buf, pos, arr.nbytes, arr.dtype.name, arr.shape,
                                           name)
                    np.copyto(view, arr)
                    del view
                    msg.inputs.append(pb.Tensor(
                        name=name, dtype=arr.dtype.name, shape=arr.shape, pool_id=pool.pool_id,
                        offset=pos, nbytes=arr.nbytes))
                    pos = tensors.align(pos + arr.nbytes)
                else:
                    msg.inputs.append(tensors.inline_msg(name, arr))
            if pool is not None:
                msg.out_pool_id = pool.pool_id
                msg.out_offset = pos
                msg.out_capacity = pool.size - pos
            payload, fds = self.device.call(self._rpc, "device.execute", msg)
            try:
                return self._outputs(pb.ExecuteResult.FromString(payload), pool, fds)
            finally:
                close_fds(fds)
        finally:
            if pool is not None:
                self._give_pool(pool)

    def _outputs(self, res: pb.ExecuteResult, pool: tensors.ClientPool | None, fds: list[int]
                 ) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        reply_map: mmap.mmap | None = None
        try:
            for t in res.outputs:
                if t.in_reply_fd:
                    if reply_map is None:
                        if not fds:
                            raise ServiceUnavailable("the driver's output memfd did not arrive")
                        reply_map = mmap.mmap(fds[0], 0, mmap.MAP_SHARED, mmap.PROT_READ)
                    out[t.name] = tensors.view_in(reply_map, t.offset, t.nbytes, t.dtype,
                                                  t.shape, t.name).copy()
                elif t.pool_id:
                    if pool is None or t.pool_id != pool.pool_id:
                        raise ServiceUnavailable("the driver named a pool this call did not use")
                    out[t.name] = tensors.view_in(pool.buf, t.offset, t.nbytes, t.dtype,
                                                  t.shape, t.name).copy()
                else:
                    out[t.name] = tensors.inline_array(t).copy()
        finally:
            if reply_map is not None:
                reply_map.close()
        return out

    def cancel(self) -> None:
        """Cancel this model's queued and running executions (from another thread)."""
        if not self.released:
            self.device.call(self._rpc, "device.cancel", pb.Cancel(model_id=self.model_id))

    def release(self) -> None:
        """Free the model in the driver; safe to call twice."""
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
