"""The driver host's device.* messages, to and from what the shell keeps.

Decoding an execute's tensors (inline, or views into the caller's registered
pools, every offset bounds-checked), its output area, the reply to a prepare,
and the error a finished job answers with. Plain functions: the host calls
them, they hold nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from npumanager import tensorio
from npumanager.drivers import events as ev
from npumanager.drivers.bg_threads import LANE_CHOICES, lane_cpus
from npumanager.drivers.bounds import Limits
from npumanager.drivers.prepare import Prepared
from npumanager.drivers.records import DriverParams
from npumanager.drivers.steps import Execution
from npumanager.errors import (
    ExecutionFailed,
    GrantRevoked,
    InvalidArgument,
    NpuError,
    WorkCancelled,
)
from npumanager.hal.host_config import HostConfig
from npumanager.hal.types import EndReason
from npumanager.proto.v1 import driver_pb2 as pb
from npumanager.wire.conn import RpcConnection


@dataclass(eq=False, slots=True)
class ClientConn:
    """The shell's side of one client connection: its number and its mapped pools."""

    cid: int
    conn: RpcConnection
    pools: dict[int, tensorio.MappedPool] = field(default_factory=dict)
    #: The pools that are a burst's memory (pool id -> burst id): only the burst's own
    #: requests name them, never a plain execute (its outputs would go over the burst's
    #: header, request and response areas, which the burst's thread reads and writes).
    bursts: dict[int, int] = field(default_factory=dict)


def plain_pools(msg: pb.Execute, client: ClientConn) -> dict[int, tensorio.MappedPool]:
    """The pools a plain execute may name: the connection's, but its bursts' memory.
    A tensor or output area of ``msg`` in a burst's memory is refused by name; one nested in
    a value finds no such pool."""
    bursts = client.bursts
    if not bursts:
        return client.pools
    for what, pool_id in [*((f"input {t.name!r}", t.pool_id) for t in msg.inputs),
                          ("the output area", msg.out_pool_id)]:
        burst_id = bursts.get(pool_id)
        if burst_id is not None:
            raise InvalidArgument(f"{what} lies in pool {pool_id}, burst {burst_id}'s "
                                  "memory: only that burst's requests name it")
    return {k: v for k, v in client.pools.items() if k not in bursts}


def params_from(hc: HostConfig) -> DriverParams:
    return DriverParams(name=hc.name, channels=hc.channels, device_number=hc.device_number,
                        thermal_cutoff=hc.thermal_cutoff,
                        inline_run_us=hc.inline_run_us,
                        inline_idle_run_us=hc.inline_idle_run_us,
                        enforce_admission=hc.enforce_admission,
                        limits=Limits(**hc.limits), orphan_grace_s=hc.orphan_grace_s,
                        foreground_priority=hc.foreground_priority,
                        reserved_channels=hc.reserved_channels,
                        background_threads=hc.background_sched != "normal",
                        quiet_window_us=hc.quiet_window_us, hold_loads=hc.hold_loads,
                        quiet_tail_us=hc.quiet_tail_us,
                        background_share=hc.background_sched == "share",
                        background_lanes=len(lane_cpus())
                        if hc.background_cpus in LANE_CHOICES else 0,
                        lanes_except_loads=hc.background_cpus == "lanes-except-loads",
                        background_one_pass=hc.background_one_pass)


def decode_tensor(t: pb.Tensor, pools: dict[int, tensorio.MappedPool]) -> Any:
    """One tensor of a request: inline, or a view into one of the caller's pools."""
    if t.pool_id == 0:
        return tensorio.inline_array(t)
    pool = pools.get(t.pool_id)
    if pool is None:
        raise InvalidArgument(f"input {t.name!r} names unknown pool {t.pool_id}")
    return tensorio.view_in(pool.buf, t.offset, t.nbytes, t.dtype, t.shape, t.name)


def decode_inputs(msg: pb.Execute, pools: dict[int, tensorio.MappedPool]) -> dict[str, Any]:
    inputs: dict[str, Any] = {}
    for t in msg.inputs:
        if t.pool_id == 0:
            inputs[t.name] = tensorio.inline_array(t)
            continue
        pool = pools.get(t.pool_id)
        if pool is None:
            raise InvalidArgument(f"input {t.name!r} names unknown pool {t.pool_id}")
        inputs[t.name] = tensorio.view_in(pool.buf, t.offset, t.nbytes, t.dtype, t.shape,
                                          t.name)
    if msg.values:  # sequences, maps, optionals
        def resolve(t: pb.Tensor) -> Any:
            return decode_tensor(t, pools)

        for v in msg.values:
            if v.name in inputs:
                raise InvalidArgument(f"input {v.name!r} is given twice")
            inputs[v.name] = tensorio.decode_value(v, resolve)
    return inputs


def set_output_area(ex: Execution, msg: pb.Execute,
                    pools: dict[int, tensorio.MappedPool]) -> None:
    """Where the outputs may go in the caller's pool (``msg.out_pool_id`` is set)."""
    out_pool = pools.get(msg.out_pool_id)
    if out_pool is None or msg.out_offset + msg.out_capacity > out_pool.size:
        raise InvalidArgument("the output area lies outside a registered pool")
    ex.out_pool, ex.out_offset = out_pool, msg.out_offset
    ex.out_capacity, ex.out_pool_id = msg.out_capacity, msg.out_pool_id


def prepared_reply(model_id: int, done: Prepared) -> pb.PreparedModelMsg:
    prepared = done.model
    return pb.PreparedModelMsg(
        model_id=model_id, memory_bytes=prepared.memory_bytes,
        inputs=[tensorio.spec_to_msg(i) for i in prepared.inputs],
        outputs=[tensorio.spec_to_msg(o) for o in prepared.outputs],
        from_cache=done.from_cache, cache_written=done.cache_written,
        from_fleet=done.from_fleet,
    )


def job_error(ins: ev.FinishJob) -> NpuError:
    """What the execute call of a job that did not complete raises."""
    if ins.reason is EndReason.FAILED:
        return ExecutionFailed(ins.error or "the backend failed")
    if ins.revoked is not None:
        return GrantRevoked(ins.revoked)
    if ins.reason is EndReason.CANCELLED_SYSTEM:
        return WorkCancelled("the work was cancelled by the system")
    return WorkCancelled("the work was cancelled")
