"""The burst thread's lost wake-up (fixed in 0a4ceb3), ordered deterministically.

The race: the burst's thread woke on a stale ring (a client that floods its doorbell),
read the request header and found no new request; the client then wrote its request and
rang; the thread's drain of the stale rings took that ring too, and the thread went back
to waiting for a ring that had already come: the request was never answered. The fix reads
the header at the top of every round and waits only when it holds no new request.

Here a :class:`BurstServer` test double holds its thread at that drain (a
``threading.Event`` hook in ``_drain``, the seam the fix is about) until the client has
written its request and rung: the interleaving that needed the client to run between two
instructions of the driver's thread, every time, with no sleep. Before 0a4ceb3 the
request is never answered (the thread sits in ``poll``); now it is.
"""

from __future__ import annotations

import os
import select
import socket
import threading
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from npumanager.drivers import burst as burst_module
from npumanager.drivers.burst import BurstServer
from npumanager.proto.v1 import driver_pb2 as pb
from npumanager.tensorio import burst as layout
from npumanager.tensorio.pools import ClientPool, MappedPool

AREA = layout.MIN_AREA
SIZE = layout.data_start(AREA, AREA) + AREA
#: Only a bound on a failure (the request never answered); a pass never waits for it.
ANSWER_WAIT_S = 30.0


class HeldAtDrain(BurstServer):
    """Holds its thread at the drain that follows a wake-up with no new request, until
    the test has let the client write and ring (then drains as the real one does)."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.at_drain = threading.Event()  # the thread is about to drain
        self.go = threading.Event()  # the client wrote and rang: drain now
        self.held = False

    def _drain(self, most: int = 1) -> bool:
        if most > 1 and not self.held:  # the drain of rings that brought no request
            self.held = True
            self.at_drain.set()
            if not self.go.wait(ANSWER_WAIT_S):
                raise AssertionError("the test never let the drain go on")
        return super()._drain(most)


def executed(server: BurstServer, data: bytes) -> tuple[Any, None]:
    return (pb.ExecuteResult(), []), None


@pytest.fixture
def burst() -> Iterator[tuple[HeldAtDrain, ClientPool, socket.socket]]:
    pool = ClientPool(SIZE)
    layout.init_header(pool.buf)
    client = SimpleNamespace(cid=1, conn=SimpleNamespace(peer=SimpleNamespace(uid=os.getuid())))
    server = HeldAtDrain(
        1, client, 1, MappedPool(pool.fd, SIZE), 1, AREA, AREA,
        executed, lambda: None, lambda s: None, lambda s: True)
    # The client's end of the doorbell (the server closes its copy once woken).
    bell = socket.socket(fileno=os.dup(server.peer_fd))
    try:
        yield server, pool, bell
    finally:
        server.stop()
        server.thread.join(ANSWER_WAIT_S)
        bell.close()
        pool.close()


def answered(pool: ClientPool, bell: socket.socket, seq: int) -> bool:
    """Wait for the driver's ring back and its answer to request ``seq``."""
    poller = select.poll()
    poller.register(bell.fileno(), select.POLLIN)
    while True:
        if not poller.poll(ANSWER_WAIT_S * 1000):
            return False  # no ring: the request was lost
        bell.recv(16)
        got, status, _n = layout.read_response_header(pool.buf)
        if got == seq:
            return status == layout.OK


def test_a_request_written_between_the_header_read_and_the_drain_is_answered(
        burst: tuple[HeldAtDrain, ClientPool, socket.socket]) -> None:
    server, pool, bell = burst
    server.start()
    bell.send(b"\1")  # a stale ring (a flooding client): it wakes the thread, no request
    assert server.at_drain.wait(ANSWER_WAIT_S), "the thread never drained"
    # The thread has read the header (nothing new) and is about to drain: now the client
    # writes its request and rings, and the drain below takes that ring with the stale one.
    layout.write_request_header(pool.buf, 1, 8)
    bell.send(b"\1")
    server.go.set()
    assert answered(pool, bell, 1), "request 1 was never answered: its ring was drained"
    # And the burst goes on serving.
    layout.write_request_header(pool.buf, 2, 8)
    bell.send(b"\1")
    assert answered(pool, bell, 2)


def test_the_double_holds_the_seam_it_names() -> None:
    """The hook is on the drain of rings that brought no request (``_DRAIN_MAX`` at once),
    which the test above relies on: if that drain changes, this says so first."""
    assert burst_module._DRAIN_MAX > 1
