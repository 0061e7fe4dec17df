"""A model's open bursts handed over to the host its grant moved to, without a stall.

Once the model's copy on the new host is ready (nn/model_move.py), :func:`hand_over`,
on the thread that prepared it:

1. opens a standby channel beside each open burst's (:mod:`.burst_channel`) on the
   copy's host, for the copy's model id, the same sizes, and registers the model's input
   buffers there, while the bursts keep serving on the old host;
2. switches: takes each burst's lock in turn (held for a whole execution, so this waits
   at most for each one's execution in progress), checks that nothing of the model is in
   flight outside its bursts and that the bursts open are the ones with standbys, then
   swaps the model to its copy (``Model._swap_to``) and installs each standby, pointer
   work only, and lets the locks go: a frame that comes meanwhile waits for that only;
3. then, off the streams' threads, closes the old channels and releases the old copy
   and its pools on the host it left.

A back-to-back stream (an embedder's batches, an LLM's decode loop), a pipeline's
bursts and a paced camera's move alike; the stream's own thread does nothing new per
execution. The app's burst objects stay the same objects; their ``burst_id`` is the new
host's. A standby refused (the new host's burst limits, the host gone, no fds left) or
a check that fails (a burst opened or closed meanwhile, an execute in flight, an
execution that outlasts ``_LOCK_WAIT_S``) closes the standbys and leaves the model
served where it is; the Follow tries again on a later answer's notice after its back-off
(1 s doubling to 60 s). Standbys are the app's own bursts on the new host: they count
against the same per-connection and per-uid burst limits there.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from npumanager.nn.burst_channel import Channel, open_channel
from npumanager.proto.v1 import driver_pb2 as pb

if TYPE_CHECKING:
    from npumanager.nn.burst import Burst
    from npumanager.nn.model import Model

#: How long the switch waits for one burst's execution in progress (its lock) before it
#: gives up and tries again later (an execution held back that long is no stream's).
_LOCK_WAIT_S = 2.0

#: How long the old host's teardown waits for the streams' first frames on the new one.
_FIRST_WAIT_S = 0.2

_Standbys = list[tuple["Burst", Channel]]


def hand_over(model: Model, new: Model) -> bool:
    """Move ``model``'s open bursts to ``new`` (its copy on the host its grant moved
    to) and swap the model to it. True: done; False: nothing open to hand over (the next
    execution or burst swaps), or the check failed: try again later. Raises what refused
    a standby (the model is served where it was)."""
    with model._lock:
        bursts = [b for b in model._bursts if not b.closed]
    if not bursts:
        return False
    staging = model._staging
    standbys: _Standbys = []
    staging_id = 0
    switched: Callable[[], None] | None = None
    try:
        for b in bursts:
            ch = b._channel
            if ch is None:
                return False  # (closing, or its host's end gone)
            sb = open_channel(new.device, new._rpc, new.model_id, model, *ch.sizes(),
                              b._timeout)
            standbys.append((b, sb))
            if sb.moved_lane is not None:  # the grant moved on (back): the copy is stale
                model._note_moved(sb.moved_lane, start=False)
                return False
        if staging is not None:
            staging_id = new._register(staging)
        switched = _switch(model, new, standbys, staging, staging_id)
    finally:
        if switched is None:
            for _, sb in standbys:
                sb.close()
            if staging_id:
                try:
                    new.device.call(new._rpc, "device.unregister_pool",
                                    pb.PoolId(pool_id=staging_id))
                except Exception:
                    pass  # the new host is gone: it forgot the pool with the connection
    if switched is None:
        return False
    switched()  # (the old host told, off the streams' threads)
    return True


def _first_frames(streams: _Standbys) -> None:
    """Until each burst of ``streams`` (those that ran on the old host) ran once through
    its new channel, or ``_FIRST_WAIT_S``: the old host's teardown (it frees the old
    copy's session: CPU) does not compete with the streams' first frames on the new
    host, their coldest (bench/move_stall.py, 2 vCPUs: the first back-to-back frame
    there took 1.6-3.5 ms with the teardown at once, 0.8-1.6 ms after it)."""
    deadline = time.monotonic() + _FIRST_WAIT_S
    while time.monotonic() < deadline and any(
            b._channel is sb and not b._seq and not b.closed for b, sb in streams):
        time.sleep(0.001)


def _switch(model: Model, new: Model, standbys: _Standbys, staging: object,
            staging_id: int) -> Callable[[], None] | None:
    """Under each burst's lock and the model's: swap and install the standbys if nothing
    changed (see the module docstring). Returns what tells the old host after (its
    channels closed, the old copy released), or None: nothing changed."""
    held: list[Burst] = []
    try:
        for b, _ in standbys:
            if not b._lock.acquire(timeout=_LOCK_WAIT_S):
                return None
            held.append(b)
        follow = model._follow
        with model._lock:
            live = {id(b) for b in model._bursts if not b.closed}
            if (model._inflight or model.released or model._staging is not staging
                    or live != {id(b) for b, _ in standbys} or follow is None
                    or any(b._channel is None or b._channel.sizes() != sb.sizes()
                           for b, sb in standbys)
                    or follow.take(new) is None):
                return None
            free_old = model._swap_to(new, staging_id)
            streams = [(b, sb) for b, sb in standbys if b._seq]  # (ran there: streaming)
            olds = [old for b, sb in standbys if (old := b._install(sb)) is not None]
    finally:
        for b in held:
            b._lock.release()

    def tell_old_host() -> None:
        _first_frames(streams)
        for ch in olds:
            ch.close()
        free_old()

    return tell_old_host
