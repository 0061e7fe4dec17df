"""A burst's channel with a driver host: its shared memory, its doorbell, its id there.

:class:`~npumanager.nn.burst.Burst` opens one when it opens (and again when its outputs
outgrow it); a model that follows its grant to the device's other host opens a second
one beside it there, a standby, while the first keeps serving, and the burst switches to
it between two executions (:mod:`npumanager.nn.burst_handover`). The burst copies the
channel's fields into its own attributes when it installs one, so that its execution
path reads them as it always did.
"""

from __future__ import annotations

import socket
import struct
from typing import TYPE_CHECKING

from npumanager import tensorio
from npumanager.errors import DeviceUnavailable, NpuError
from npumanager.fds import close_fds
from npumanager.nn.burst_repeat import FixedLayout
from npumanager.proto.v1 import driver_pb2 as pb
from npumanager.tensorio import burst as layout

if TYPE_CHECKING:
    from npumanager.nn.device import Device
    from npumanager.nn.model import Model
    from npumanager.wire.client import SyncRpcClient

#: How long one blocking wait for the driver's ring lasts (SO_RCVTIMEO) before the
#: execution's timeout is looked at again.
RING_WAIT = 1.0


class Channel:
    """One open burst channel: what :func:`open_channel` set up."""

    __slots__ = ("burst_id", "data_start", "device", "fixed", "moved_lane", "pool", "req",
                 "resp", "ring_wait", "rpc", "sock")

    def __init__(self, device: Device, rpc: SyncRpcClient, pool: tensorio.ClientPool,
                 sock: socket.socket, burst_id: int, req: int, resp: int,
                 fixed: FixedLayout | None, ring_wait: float, moved_lane: str | None) -> None:
        #: The host it was opened on (its connection: the burst id is that host's).
        self.device, self.rpc = device, rpc
        self.pool, self.sock, self.burst_id = pool, sock, burst_id
        self.req, self.resp = req, resp
        self.data_start = layout.data_start(req, resp)
        self.fixed = fixed
        self.ring_wait = ring_wait
        #: Where the host that opened it said the model's grant moved (None: it did not).
        self.moved_lane = moved_lane

    def sizes(self) -> tuple[int, int, int]:
        """(request area, response area, data area): what a channel like it opens with."""
        return self.req, self.resp, self.pool.size - self.data_start

    def close(self) -> None:
        """Tell the host it was opened on, and let go of it."""
        if not self.rpc.closed:
            try:
                self.device.call(self.rpc, "device.close_burst",
                                 pb.BurstId(burst_id=self.burst_id))
            except NpuError:
                pass  # the driver or the connection is gone: the burst went with it
        self.drop()

    def drop(self) -> None:
        """Let go of it, telling the host nothing (its end is gone)."""
        self.fixed = None  # (its views of the memory first: a mapping with views stays)
        self.sock.close()
        self.pool.close()


def open_channel(device: Device, rpc: SyncRpcClient, model_id: int, model: Model,
                 req: int, resp: int, data: int, timeout: float) -> Channel:
    """Open a burst of ``model_id`` on the host behind ``rpc``: a sealed memfd of the
    areas' sizes sent to it, its doorbell back. ``model`` gives the tensors' specs (the
    fixed request's slots: :mod:`.burst_repeat`)."""
    size = layout.data_start(req, resp) + tensorio.align(data)
    pool = tensorio.ClientPool(size)
    layout.write_client_flags(pool.buf, layout.FLAG_SAME)
    try:
        payload, fds = device.call(
            rpc, "device.open_burst",
            pb.OpenBurst(model_id=model_id, size=size, req_size=req, resp_size=resp),
            fds=[pool.fd])
    except BaseException:
        pool.close()
        raise
    if len(fds) != 1:
        close_fds(fds)
        pool.close()
        raise DeviceUnavailable("the driver sent no doorbell for the burst")
    msg = pb.BurstOpened.FromString(payload)
    pool.pool_id = msg.pool_id
    sock = socket.socket(fileno=fds[0])
    sock.setblocking(True)
    wait = min(RING_WAIT, timeout)
    sec = int(wait)
    usec = max(int((wait - sec) * 1e6), 0 if sec else 1)  # (0 and 0: no timeout at all)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("@ll", sec, usec))
    fixed = FixedLayout.of(model, pool, layout.data_start(req, resp), req)
    return Channel(device, rpc, pool, sock, msg.burst_id, req, resp, fixed, wait,
                   msg.moved_lane if msg.moved else None)


__all__ = ["RING_WAIT", "Channel", "open_channel"]
