"""A burst's fixed request: parsed, decoded and bound once, reused while it repeats.

A stream sends the same request every time: the same model, priority and
attribution, its inputs where they lie in registered memory (the model's input
buffers or the burst's own slots) and its outputs into the same slots of the
burst's memory. Only the bytes *in* those slots change. So the burst's thread
keeps, for the last request it parsed, everything derived from its bytes alone:
the parsed message, the input views, the output views and a backend run bound to
both (ONNX Runtime's IO binding: one call, no allocation, no per-run checks).

A later request is served from that only when its bytes equal the kept copy (the
driver's own copy: what the client writes into shared memory meanwhile cannot
change it) and every pool it named is still the same mapped pool of the
connection, and the prepared model is the same; anything else is parsed and
decoded afresh. Admission is not cached here: every execution is still submitted
to the driver's state (priority, thermal hold-back, revocation, debouncing).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from npumanager import tensorio
from npumanager.drivers.base import PreparedModel
from npumanager.drivers.state_fast import FastKey
from npumanager.drivers.steps import Done, Execution
from npumanager.proto.v1 import driver_pb2 as pb

#: The element kinds a bound run takes (numeric tensors; strings, sequences, maps and
#: optionals are decoded afresh each time).
_BINDABLE = "biuf"
#: A single step feeds nothing back (shared by every execution of a fixed request).
_NO_FEEDBACK: dict[str, str] = {}


@dataclass(eq=False, slots=True)
class FixedRequest:
    """What one request's bytes decode to, kept while the stream repeats them."""

    data: bytes
    msg: pb.Execute
    inputs: dict[str, Any]
    prepared: PreparedModel
    #: (pool id, the mapped pool) of every pool the views lie in.
    pools: tuple[tuple[int, tensorio.MappedPool], ...]
    out_pool: tensorio.MappedPool
    out_pool_id: int
    out_offset: int
    out_capacity: int
    #: Output name -> (its view in the output pool, offset): every output, bound.
    bound: dict[str, tuple[np.ndarray, int]]
    #: The reply while every output lands in its view (its work id filled per run).
    result: pb.ExecuteResult
    #: The backend's run bound to ``inputs`` and the output views (None: run_into).
    run: Callable[[], dict[str, Any]] | None
    #: What the state's full admission of this request found (:mod:`.state_fast`), and
    #: the uid and feature id its executions are attributed to (set with it).
    fast: FastKey | None = None
    uid: int = 0
    feature_id: int | None = None
    #: The bound run into outputs of its own, made at the first warm-up (drivers/burst.py).
    warm_run: Callable[[], dict[str, Any]] | None = None

    def execution(self, ticket: int, t0: float, done: Done) -> Execution:
        """An execution of this request as ``ticket``, built in one call (a stream makes
        one per execution: no field set twice, nothing read from the message again)."""
        return Execution(ticket, self.prepared, self.inputs, _NO_FEEDBACK, self.uid,
                         self.feature_id, t0, self.out_pool, self.out_offset,
                         self.out_capacity, self.out_pool_id, done=done, bound=self.bound,
                         bound_run=self.run, fixed_result=self.result)

    def still_valid(self, pools: dict[int, tensorio.MappedPool],
                    prepared: PreparedModel | None) -> bool:
        """Whether every pool named is still mapped as it was, and the model the same."""
        if prepared is not self.prepared:
            return False
        return all(pools.get(pool_id) is pool for pool_id, pool in self.pools)

    def uses_pool(self, pool_id: int) -> bool:
        return any(p == pool_id for p, _ in self.pools)


def fixed_request(data: bytes, msg: pb.Execute, inputs: dict[str, Any],
                  prepared: PreparedModel | None, pools: dict[int, tensorio.MappedPool],
                  out: tuple[tensorio.MappedPool, int, int, int]) -> FixedRequest | None:
    """The fixed form of a decoded request, or None where it does not repeat cheaply: more
    than one step, feedback, values, a non-numeric input, an output of unknown size or
    one that does not fit the output area. ``out``: (pool, pool id, offset, capacity)."""
    if prepared is None or msg.steps > 1 or msg.feedback or msg.values:
        return None
    for a in inputs.values():
        if type(a) is not np.ndarray or a.dtype.kind not in _BINDABLE:
            return None
    out_pool, out_pool_id, offset, capacity = out
    end = offset + capacity
    bound: dict[str, tuple[np.ndarray, int]] = {}
    result = pb.ExecuteResult()
    for spec in prepared.outputs:
        nbytes = spec.static_nbytes()
        if nbytes is None:
            return None
        start = tensorio.align(offset)
        if start + nbytes > end:
            return None
        view = tensorio.view_in(out_pool.buf, start, nbytes, spec.dtype, spec.shape, spec.name)
        bound[spec.name] = (view, start)
        result.outputs.add(name=spec.name, dtype=spec.dtype, shape=view.shape,
                           pool_id=out_pool_id, offset=start, nbytes=nbytes)
        offset = start + nbytes
    used = {t.pool_id for t in msg.inputs if t.pool_id} | {out_pool_id}
    named = tuple((pid, pools[pid]) for pid in sorted(used) if pid in pools)
    if len(named) != len(used):
        return None
    bind = getattr(prepared, "bind", None)
    run = None
    if bind is not None:
        run = bind(inputs, {n: v for n, (v, _) in bound.items()})
    return FixedRequest(data, msg, inputs, prepared, named, out_pool, out_pool_id, out[2],
                        capacity, bound, result, run)
