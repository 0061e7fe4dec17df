"""The ``device.prepare_model``, ``device.prepare_model_from_cache`` and
``device.release`` calls of the driver host (:class:`~.host.DriverHost`).

A prepare is charged to the caller's uid for the bytes it will read (every fd by its
size) before anything is read, waits for npud's grant (:mod:`.npud_link`), compiles or
loads in :mod:`.prepare`, and hands the model to the state, which gives it an id; the
charge ends with the call, however it ends. A rejected cache entry is reported to npud
so its client falls back to a full compile.
"""

from __future__ import annotations

import itertools
import os
from typing import TYPE_CHECKING

from npumanager.drivers import events as ev
from npumanager.drivers.classes import ExecClass
from npumanager.drivers.messages import prepared_reply
from npumanager.errors import GeneralFailure, InvalidArgument
from npumanager.fds import close_fds
from npumanager.proto.v1 import driver_pb2 as pb
from npumanager.proto.v1.wire_pb2 import Empty

if TYPE_CHECKING:
    from npumanager.drivers.host import DriverHost
    from npumanager.drivers.prepare import Prepared
    from npumanager.wire.conn import CallContext


class PrepareCalls:
    """The host's prepare and release handlers."""

    def __init__(self, host: DriverHost) -> None:
        self.host = host
        self._ids = itertools.count(1)

    def _begin_prepare(self, ctx: CallContext, fds: list[int], inline_bytes: int) -> int:
        """Charge the bytes this prepare will read (every fd by its size, sparse or not) to
        the caller's uid; refused at a bound or while no manager is attached."""
        host = self.host
        nbytes = inline_bytes
        for fd in fds:
            try:
                nbytes += os.fstat(fd).st_size
            except OSError:
                pass
        client = host._clients.get(ctx.conn)
        if client is None:
            raise InvalidArgument("the connection closed")
        prepare_id = next(self._ids)
        host._submit(ev.PrepareBegun(stimulus_id=host._stimulus("prepare"), now=host.clock.now(),
                                     conn=client.cid, prepare_id=prepare_id, nbytes=nbytes))
        return prepare_id

    def _end_prepare(self, prepare_id: int) -> None:
        if prepare_id:
            host = self.host
            host._submit_quietly(ev.PrepareEnded(stimulus_id=host._stimulus("prepared"),
                                                 now=host.clock.now(), prepare_id=prepare_id))

    def _background(self, ctx: CallContext) -> bool:
        """Whether the caller's models are BACKGROUND (their compile and threads)."""
        return self.host.state.model_class(ctx.peer.uid) is ExecClass.BACKGROUND

    async def prepare_model(self, ctx: CallContext, payload: bytes) -> pb.PreparedModelMsg:
        preparer = self.host.preparer
        fds, ctx.fds = ctx.fds, []
        prepare_id = 0
        try:
            msg = pb.PrepareModel.FromString(payload)
            preparer.check_prepare(msg, fds)
            n_cache = msg.n_model_cache + msg.n_data_cache  # written, not read
            prepare_id = self._begin_prepare(ctx, fds[n_cache:], len(msg.onnx))
            grant = await self.host.npud.admit(ctx.peer.uid, msg.grant_id)
            done = await preparer.prepare_model(msg, fds, ctx.peer.uid,
                                                background=self._background(ctx))
            return self._model_ready(ctx, done, grant, prepare_id)
        finally:
            close_fds(fds)
            self._end_prepare(prepare_id)

    async def prepare_from_cache(self, ctx: CallContext, payload: bytes
                                 ) -> pb.PreparedModelMsg:
        preparer, npud = self.host.preparer, self.host.npud
        fds, ctx.fds = ctx.fds, []
        prepare_id = 0
        try:
            try:
                msg = pb.PrepareModelFromCache.FromString(payload)
                preparer.check_from_cache(msg, fds)
                prepare_id = self._begin_prepare(ctx, fds, 0)
                grant = await npud.admit(ctx.peer.uid, msg.grant_id)
                done = await preparer.prepare_from_cache(
                    msg, fds, ctx.peer.uid, background=self._background(ctx))
            except (GeneralFailure, InvalidArgument):
                npud.cache_result(b"rejected")  # the client falls back to a full compile
                raise
            finally:
                close_fds(fds)
            return self._model_ready(ctx, done, grant, prepare_id)
        finally:
            self._end_prepare(prepare_id)

    def _model_ready(self, ctx: CallContext, done: Prepared, grant: str | None,
                     prepare_id: int = 0) -> pb.PreparedModelMsg:
        host = self.host
        prepared = done.model
        client = host._clients.get(ctx.conn)
        try:
            if client is None:
                raise InvalidArgument("the connection closed while the model was prepared")
            with host.lock:
                out = host.state.handle(ev.ModelPrepared(
                    stimulus_id=host._stimulus("prepared"), now=host.clock.now(),
                    conn=client.cid, grant_id=grant, memory_bytes=prepared.memory_bytes,
                    inputs=frozenset(i.name for i in prepared.inputs),
                    outputs=frozenset(o.name for o in prepared.outputs),
                    input_specs=tuple(prepared.inputs), prepare_id=prepare_id))
                (model_id,) = [i.model_id for i in out if isinstance(i, ev.ModelReady)]
                host.res.prepared[model_id] = prepared
                host.res.carry_out(out)
        except BaseException:
            prepared.release()
            raise
        if done.from_cache or done.cache_written:  # a compile that filled the cache: a miss
            host.npud.cache_result(b"fleet" if done.from_fleet else b"hit" if done.from_cache
                                   else b"miss")
        return prepared_reply(model_id, done)

    def release(self, ctx: CallContext, payload: bytes) -> Empty:
        host = self.host
        msg = pb.Release.FromString(payload)
        client = host._clients.get(ctx.conn)
        if client is not None:
            host._submit(ev.ModelReleased(stimulus_id=host._stimulus("release"),
                                          now=host.clock.now(), conn=client.cid,
                                          model_id=msg.model_id))
        return Empty()
