"""Bursts in the driver host: a thread per (client, model) serving a shared-memory channel.

NNAPI's answer to streams at their own pace (``ANeuralNetworksBurst``, the
HAL's ``IBurst`` over fast message queues). A plain execute crosses several
wake-ups (client -> event loop -> worker thread -> event loop -> client); a
burst execution crosses one each way: the client writes its request into the
burst's memfd (:mod:`npumanager.tensorio.burst`) and rings; the burst's own
thread here wakes, submits the execution to :class:`DriverState` under the
host's lock exactly as a plain one (admission, effective priority, thermal
hold-back, revocation, debouncing; :mod:`.burst_exec`), runs the step itself
when the state starts it at once, writes the response and rings back (a short
repeat the state admits at once is run and answered first, the lock held, and
recorded after the ring: ``_run_first``). The
event loop is not woken on the way: what the state asks of it (lifecycle
reports, the debounce timer) is handed over once the reply is out, one wake-up
for the lot and none when there is nothing (a stream inside its debounce
window). Work the state queues instead (a busy device, more important work, a
thermal hold-back) runs where any job runs, and this thread waits for its end;
a BACKGROUND step runs on the lowered workers, which submit its end themselves.

The doorbell is a ``SOCK_SEQPACKET`` socketpair the driver creates (the client
gets one end in the reply), not an eventfd: an eventfd's counter and file
flags are shared with whoever holds it, so a client that fills the counter to
2**64-2 and clears ``O_NONBLOCK`` would block the driver's next ring forever.
The driver sends with ``MSG_DONTWAIT`` (a full buffer means it already rang),
and a hung-up end tells either side that the other is gone.

Trust: everything read from the memfd is checked (lengths against the areas,
the request copied out before it is parsed, tensors bounds-checked); any bad
request gets a typed error in the response area and the thread keeps serving.
Outputs never go into a burst's header or areas. A uid holds at most
``MAX_BURSTS_PER_UID`` bursts (threads) over all its connections; a burst whose
client hung up, or whose memory was unregistered as a pool, is forgotten with its
memory (tests/security/test_burst_*.py).
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import select
import socket
import struct
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from npumanager import tensorio
from npumanager.drivers import burst_counters as bc
from npumanager.drivers.anticipate import (
    PAUSE,
    Anticipate,
    Anticipation,
    await_request,
    low_timer_slack,
    warm,
)
from npumanager.drivers.burst_exec import BurstExecutions
from npumanager.drivers.burst_fixed import FixedRequest
from npumanager.drivers.follow import FollowOn, follow
from npumanager.drivers.load_place import LoadPlace, Placed
from npumanager.drivers.messages import ClientConn
from npumanager.drivers.poll_turns import FirstCome, PollTurns
from npumanager.drivers.rt_policy import RtPolicy
from npumanager.drivers.steps import Execution, Reply
from npumanager.errors import (
    GeneralFailure,
    InvalidArgument,
    LimitExceeded,
    NpuError,
    error_to_wire,
)
from npumanager.fds import close_fds
from npumanager.proto.v1 import driver_pb2 as pb
from npumanager.proto.v1.wire_pb2 import Empty
from npumanager.tensorio import burst as layout
from npumanager.wire.conn import CallContext

if TYPE_CHECKING:
    from npumanager.drivers.host import DriverHost

log = logging.getLogger("npumanager.drivers.burst")

#: Open bursts per connection (each is a thread and a mapping).
MAX_BURSTS_PER_CONN = 8
#: Open bursts per uid over all its connections (else 64 connections x 8 threads each).
MAX_BURSTS_PER_UID = 32
_yield = os.sched_yield
_read_stamps = struct.Struct("<QQ").unpack_from
#: Doorbell rings drained at once when a wake-up found no new request.
_DRAIN_MAX = 256


class BurstServer:
    """One burst: its mapped memfd, its doorbell and the thread that serves it."""

    def __init__(self, burst_id: int, client: ClientConn, model_id: int,
                 pool: tensorio.MappedPool, pool_id: int, req_size: int, resp_size: int,
                 execute: Callable[[BurstServer, bytes],
                                   tuple[Reply, FixedRequest | None] | None],
                 answered: Callable[[], None],
                 prepare_next: Callable[[BurstServer], None],
                 ended: Callable[[BurstServer], bool], anticipate: Anticipate | None = None,
                 place: LoadPlace | None = None, follow_us: int = 0) -> None:
        self.burst_id = burst_id
        self.client = client
        self.uid = client.conn.peer.uid
        self.model_id = model_id
        self.pool = pool
        self.pool_id = pool_id
        self.req_off = layout.HEADER
        self.req_size = req_size
        self.resp_off = layout.HEADER + req_size
        self.resp_size = resp_size
        self.data_start = layout.data_start(req_size, resp_size)
        self._execute = execute
        #: The last request parsed, kept while the stream repeats it (:mod:`.burst_fixed`;
        #: read and replaced under the host's lock).
        self.fixed: FixedRequest | None = None
        #: The fixed request whose full reply the client got last (then SAME answers).
        self.sent: FixedRequest | None = None
        #: The sequence number of the request being answered (0: none, or answered).
        self.serving = 0
        #: The next execution of the kept request, made once the last reply was out (off
        #: the client's wait): (the fixed request it is of, it, its end signal).
        self.spare: tuple[FixedRequest, Execution] | None = None
        self._prepare_next = prepare_next
        self.same_ok = bool(layout.read_client_flags(pool.buf) & layout.FLAG_SAME)
        #: Called once the reply is out: what the execution left for the loop goes there.
        self._answered = answered
        #: Called once the thread ended on its own (the host forgets the burst); False: the
        #: host's loop is gone.
        self._ended = ended
        self.closing = False
        #: The host ended it (close_burst, its connection or its memory gone, shutdown).
        self.stopped = False
        #: The execution this burst waits for, when the state queued it.
        self.waiting: Execution | None = None
        #: While anticipation is on (drivers/anticipate.py): the host's side and the
        #: stream's pace; whether the last step ran here as FOREGROUND, and for how long.
        self.anticipate = anticipate
        self.pace = (Anticipation(anticipate.window_s, pauses=anticipate.pauses)
                     if anticipate else None)
        self.foreground, self.run_us = False, 0.0
        #: The follow-on poll after a BACKGROUND answer (background_follow_us: .follow).
        self.follow = FollowOn(follow_us / 1e6) if follow_us > 0 else None
        #: Its thread has foreground_slice_us's slice (.burst_exec, ``_slice``).
        self.sliced = False
        #: Its thread's SCHED_FIFO state (foreground_rt_priority: .rt_threads), and what
        #: lowers it when the thread ends (None: off).
        self.rt = RtPolicy()
        self.rt_closed: Callable[[RtPolicy], None] | None = None
        #: Its CPUs while a background load runs (``load_cpus = "split"``: .load_place).
        self.placed = Placed(place)
        self.counters = bc.BurstCounters()
        #: The host's model id -> lane its grant moved to (DriverState.moved; read per
        #: answer without the lock: one lookup): its answers carry the MOVED bits then.
        self.moved_of: dict[int, str] = {}
        #: Where the request being served is (``time.perf_counter_ns`` per ``bc`` mark).
        self.marks = [0] * bc.MARKS
        self.answered_at = 0.0  # when the last answer was written (its ring just after)
        self.sock, peer = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.peer_fd = peer.detach()  # goes to the client with the reply, then closed here
        self._stop = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self.thread = threading.Thread(target=self._serve, daemon=True,
                                       name=f"npu-burst-{burst_id}")

    def __repr__(self) -> str:
        return (f"<BurstServer {self.burst_id} model {self.model_id} conn {self.client.cid}"
                f"{' closing' if self.closing else ''}>")

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        """Ask the thread to end (from any thread); it closes its fds on the way out."""
        self.stopped = True
        if self.closing:
            return
        self.closing = True
        ex = self.waiting
        if ex is not None and ex.done is not None:
            ex.done.set()
        try:
            os.eventfd_write(self._stop, 1)
        except OSError:
            pass  # already closed: the thread is gone

    # --- the thread ----------------------------------------------------------------

    def _serve(self) -> None:
        sock = self.sock
        poller = select.poll()
        poller.register(sock.fileno(), select.POLLIN)
        poller.register(self._stop, select.POLLIN)
        last = 0
        if self.pace is not None:
            low_timer_slack()  # (its timed sleep before the window: drivers/anticipate.py)
        try:
            pace, counters, ns = self.pace, self.counters, time.perf_counter_ns
            follow_on = self.follow
            placed = self.placed
            self.marks = marks = bc.new_marks()  # (on this thread: see bc.CpuMarks)
            while not self.closing:
                # The header first, then the wait: a drain below can take the ring of a
                # request written after the header was last read (a client that rang more
                # than once per request), and waiting for that ring would wait forever.
                seq, length = layout.read_request_header(self.pool.buf)
                how = bc.AHEAD
                if seq == last:
                    if placed.place is not None:  # (load_cpus = "split")
                        placed.update(self.foreground)
                    counters.waiting()
                    how = bc.RUNG
                    if pace is not None and self.foreground:
                        how = await_request(pace, (sock.fileno(), self._stop), self.pool.buf,
                                            last, self)
                    elif follow_on is not None and not self.foreground:
                        how = follow(follow_on, self.pool.buf, last, self)
                    if how == bc.RUNG or how == bc.LATE:
                        poller.poll()
                    if self.closing:
                        break
                    if self.peer_fd >= 0:  # the client has its end: a hang-up now means gone
                        os.close(self.peer_fd)
                        self.peer_fd = -1
                    seq, length = layout.read_request_header(self.pool.buf)
                if seq != last:
                    last = seq
                    marks[bc.M_SEEN] = seen_ns = ns()
                    seen = seen_ns / 1e9  # (perf_counter's clock)
                    # (read now: once answered, the client may stamp its next request)
                    called, rung = _read_stamps(self.pool.buf, layout.CALLED_AT)
                    if follow_on is not None:
                        follow_on.arrived(seen, rung / 1e9 if rung else None)
                    self._answer(seq, length)
                    if follow_on is not None:  # (a FOREGROUND answer is not followed)
                        follow_on.answered_at(0.0 if self.foreground else self.answered_at)
                    # The answer's ring wakes the client synchronously: it may be queued
                    # on this CPU (or spin here, yielding), behind what this thread does
                    # next (the loop's hand-over, the counters, the next request's
                    # preparation). It goes first (the host's lock is not held here).
                    _yield()
                    if pace is not None:
                        # (after the answer: only the next wait reads it)
                        pace.arrived(seen, rung / 1e9 if rung else None)
                    self._answered()
                    # Its ring is taken once the reply is out, off the client's wait (an
                    # honest client rings again only after reading this reply; if the ring
                    # taken is the next request's, the header read above the wait finds it).
                    gone = self._drain()
                    self._prepare_next(self)
                    marks[bc.M_DONE] = ns()
                    counters.served_one(how, seen, self.answered_at, self.run_us, seq, marks,
                                        (called / 1e9 if called else math.nan,
                                         rung / 1e9 if rung else math.nan))
                else:
                    gone = self._drain(_DRAIN_MAX)  # rings with no new request, a hang-up
                if gone:
                    break
        except Exception:
            if not self.closing:  # (a closing burst's memory may go away under it)
                log.exception("burst %d failed; closing it", self.burst_id)
        finally:
            self.closing = True
            try:  # (steps of other bursts this thread kept run now: drivers/bg_pass.py)
                self._answered()
            except Exception:
                log.exception("burst %d: handing over at its end failed", self.burst_id)
            if self.rt_closed is not None:
                self.rt_closed(self.rt)
            sock.close()
            os.close(self._stop)
            if self.peer_fd >= 0:
                os.close(self.peer_fd)
                self.peer_fd = -1
            # Its mapping too (the loop closes it again with the pool: harmless), so that
            # the line below means every fd of this burst is closed; its kept request's
            # views first (a mapping with views cannot close).
            self.fixed = self.sent = self.spare = None
            self.pool.close()
            if isinstance(self.marks, bc.CpuMarks):
                self.marks.close()
            # Its last act, once every fd of its own is closed (tests wait for this line);
            # a burst that ended on its own logs it once the loop forgot it too.
            if self.stopped or not self._ended(self):
                self.log_ended()

    def log_ended(self) -> None:
        log.info("burst %d of uid %d ended", self.burst_id, self.client.conn.peer.uid)

    def _drain(self, most: int = 1) -> bool:
        """Take up to ``most`` rings of the doorbell; True when the client's end hung up.
        One ring per request: draining until empty would add an EAGAIN system call to
        every execution. Rings left over wake the next ``poll`` at once, find no new
        request and are drained then (``_DRAIN_MAX`` at a time: a client that floods its
        doorbell gets its requests served, not an endless drain)."""
        for _ in range(most):
            try:
                if not self.sock.recv(16, socket.MSG_DONTWAIT):
                    return True
            except BlockingIOError:
                return False
            except OSError:
                return True
            if self.peer_fd >= 0:
                # A ring: the client has its end (it came with the open's reply). A thread
                # that started after the first request was written served it without the
                # wait below, which closes this otherwise; kept, the client's hang-up
                # would never come (tests/drivers/test_burst_shell.py).
                os.close(self.peer_fd)
                self.peer_fd = -1
        return False

    def _answer(self, seq: int, length: int) -> None:
        status, payload = layout.ERROR, b""
        self.serving = seq
        try:
            if not 0 < length <= self.req_size:
                raise InvalidArgument(f"burst request length {length} lies outside the "
                                      f"request area of {self.req_size} bytes")
            # Copied out first: the client may rewrite the memory while it is parsed.
            data = bytes(self.pool.buf[self.req_off:self.req_off + length])
            self.marks[bc.M_COPIED] = time.perf_counter_ns()
            done = self._execute(self, data)
            if done is None:
                return  # answered SAME as soon as the run was over (answer_same)
            (result, fds), fixed = done
            if fds:  # outputs that fit neither the response nor the data area
                need = sum(os.fstat(fd).st_size for fd in fds)
                close_fds(fds)
                raise _TooBig(need, "the outputs do not fit the burst's shared memory")
            if fixed is not None and self.sent is fixed:
                status = layout.SAME  # the outputs lie where the last reply said
            else:
                payload = result.SerializeToString()
                if len(payload) > self.resp_size:
                    raise _TooBig(len(payload), "the response does not fit the burst's "
                                                "response area")
                status = layout.OK
                self.sent = fixed if self.same_ok else None
        except _TooBig as exc:
            payload = pb.BurstError(type="LimitExceeded", message=str(exc),
                                    need_bytes=exc.need).SerializeToString()
        except NpuError as exc:
            kind, message = error_to_wire(exc)
            payload = pb.BurstError(type=kind, message=message).SerializeToString()
        except Exception as exc:
            log.exception("burst %d: an execution failed", self.burst_id)
            kind, message = error_to_wire(GeneralFailure(f"{type(exc).__name__}: {exc}"))
            payload = pb.BurstError(type=kind, message=message).SerializeToString()
        if not self.serving:
            return  # answered SAME already (answer_same): the client has its outputs
        if len(payload) > self.resp_size:  # an error message too long for the area
            payload = pb.BurstError(type="LimitExceeded",
                                    message="the response area is too small").SerializeToString()
            payload = payload[:self.resp_size]
        buf = self.pool.buf
        if payload:
            buf[self.resp_off:self.resp_off + len(payload)] = payload
        self.serving = 0
        moved = self.moved_of.get(self.model_id)
        if moved is not None:
            status |= layout.moved_bits(moved)
        layout.write_response_header(buf, seq, status, len(payload))
        # (before the ring: the client may run first; perf_counter's clock, one read)
        self.marks[bc.M_ANSWERED] = at = time.perf_counter_ns()
        self.answered_at = at / 1e9
        self._ring()
        self.marks[bc.M_RUNG] = time.perf_counter_ns()

    def answer_same(self) -> None:
        """Answer the request being served SAME (its outputs lie where the last full
        answer said), before its end is recorded: the host's lock held from the check
        that the end will be COMPLETED (``DriverState.completes``) to its recording."""
        seq, self.serving = self.serving, 0
        moved = self.moved_of.get(self.model_id)
        layout.write_response_header(self.pool.buf, seq, layout.SAME if moved is None
                                     else layout.SAME | layout.moved_bits(moved), 0)
        self.marks[bc.M_ANSWERED] = at = time.perf_counter_ns()
        self.answered_at = at / 1e9
        self._ring()
        self.marks[bc.M_RUNG] = time.perf_counter_ns()

    def _ring(self) -> None:
        try:
            self.sock.send(b"\1", socket.MSG_DONTWAIT)
        except BlockingIOError:
            pass  # the client has not read the last ring yet: it is rung already
        except OSError:
            self.closing = True  # the client is gone


class _TooBig(LimitExceeded):
    def __init__(self, need: int, message: str) -> None:
        super().__init__(f"{message} ({need} bytes more needed)")
        self.need = need


class Bursts(BurstExecutions):
    """The host's open bursts: open and close calls, and burst executions through the
    host's state (on the burst's thread, under the host's lock)."""

    def __init__(self, host: DriverHost) -> None:
        self.host = host
        self._servers: dict[int, BurstServer] = {}
        us = host.hc.burst_anticipate_us
        self._anticipate = (Anticipate(us / 1e6, threading.Lock(), lambda s: warm(host, s),
                                       turns=PollTurns() if host.hc.burst_poll_turns
                                       else FirstCome(),
                                       pauses=PAUSE if host.hc.burst_anticipate_pauses
                                       else 0.0)
                            if us > 0 else None)
        self._ids = itertools.count(1)

    def __len__(self) -> int:
        return len(self._servers)

    def stats(self, recent: bool) -> list[dict[str, Any]]:
        """Each open burst's counters (:mod:`.burst_counters`; ``recent``: with its last
        requests' times), for ``device.stats``."""
        return [{"burst_id": s.burst_id, "uid": s.client.conn.peer.uid,
                 "model_id": s.model_id, "foreground": s.foreground,
                 **s.counters.snapshot(recent)} for s in list(self._servers.values())]

    # --- device.open_burst / device.close_burst (on the event loop) -----------------

    def open(self, ctx: CallContext, payload: bytes) -> tuple[pb.BurstOpened, list[int]]:
        host = self.host
        fds, ctx.fds = ctx.fds, []
        try:
            msg = pb.OpenBurst.FromString(payload)
            if len(fds) != 1:
                raise InvalidArgument(f"open_burst takes one memfd, got {len(fds)} fds")
            req, resp = msg.req_size, msg.resp_size
            for what, n, most in (("request", req, layout.MAX_REQUEST_AREA),
                                  ("response", resp, layout.MAX_AREA)):
                if n < layout.MIN_AREA:
                    raise InvalidArgument(f"a burst's {what} area is at least "
                                          f"{layout.MIN_AREA} bytes, not {n}")
                if n > most:
                    raise LimitExceeded(f"a burst's {what} area is at most {most} bytes, "
                                        f"not {n}")
            if msg.size < layout.data_start(req, resp):
                raise InvalidArgument(f"a burst of {msg.size} bytes cannot hold its "
                                      f"{req}+{resp}-byte areas")
            client = host._clients.get(ctx.conn)
            if client is None:
                raise InvalidArgument("the connection closed")
            mine = [s for s in self._servers.values() if s.client is client]
            if len(mine) >= MAX_BURSTS_PER_CONN:
                raise LimitExceeded(f"a connection may hold {MAX_BURSTS_PER_CONN} bursts")
            uid = ctx.peer.uid
            theirs = sum(s.client.conn.peer.uid == uid for s in self._servers.values())
            if theirs >= MAX_BURSTS_PER_UID:
                raise LimitExceeded(f"uid {uid} holds {theirs} bursts on this driver, the "
                                    "most a uid may")
            with host.lock:  # (as an execute of it would be refused: GrantRevoked if revoked)
                host.state.check_owns_model(client.cid, msg.model_id)
            pool = tensorio.MappedPool(fds[0], msg.size)
            size = os.fstat(fds[0]).st_size
        finally:
            close_fds(fds)
        try:
            pool_id = host.register_pool(client, pool, size)
        except BaseException:
            pool.close()
            raise
        layout.init_header(pool.buf)
        burst_id = next(self._ids)
        client.bursts[pool_id] = burst_id  # (no plain execute names this memory)
        server = BurstServer(burst_id, client, msg.model_id, pool, pool_id, req, resp,
                             self.execute, host.res.wake_loop, self.prepare_next,
                             self._ended, self._anticipate, host.preparer.place,
                             host.hc.background_follow_us)
        server.moved_of = host.state.moved
        self._servers[burst_id] = server
        if host.rt is not None:
            server.rt_closed = host.rt.closed
        server.start()
        peer = server.peer_fd
        # The reply carries the client's end; the host closes it once sent.
        opened = pb.BurstOpened(burst_id=burst_id, pool_id=pool_id)
        moved = host.state.moved.get(msg.model_id)
        if moved is not None:  # served here all the same; its app may follow the grant
            opened.moved, opened.moved_lane = True, moved
        return opened, [peer]

    def close(self, ctx: CallContext, payload: bytes) -> Empty:
        msg = pb.BurstId.FromString(payload)
        server = self._servers.get(msg.burst_id)
        client = self.host._clients.get(ctx.conn)
        if server is None or server.client is not client:
            raise InvalidArgument(f"no burst {msg.burst_id} on this connection")
        self._end(server)
        self.host.unregister_pool(client, server.pool_id)
        return Empty()

    def client_gone(self, client: ClientConn) -> None:
        """The connection closed: its bursts end (their pools close with the client)."""
        for server in [s for s in self._servers.values() if s.client is client]:
            self._end(server)

    def close_all(self, timeout: float = 5.0) -> None:
        servers = list(self._servers.values())
        for server in servers:
            self._end(server)
        deadline = time.monotonic() + timeout
        for server in servers:
            server.thread.join(max(0.0, deadline - time.monotonic()))

    def _end(self, server: BurstServer) -> None:
        self._servers.pop(server.burst_id, None)
        server.stop()

    # --- a burst that ended on its own, memory that goes ------------------------------

    def _ended(self, server: BurstServer) -> bool:
        """From a burst's thread that ended on its own (its client hung up, a failure): the
        loop forgets it and unregisters its memory, as close_burst does. False: the loop
        is gone."""
        try:
            self.host.loop.call_soon_threadsafe(self._forget, server)
        except RuntimeError:
            return False  # the host is going away
        return True

    def _forget(self, server: BurstServer) -> None:
        try:
            if self._servers.get(server.burst_id) is server:  # (else closed meanwhile)
                del self._servers[server.burst_id]
                client = server.client
                if self.host._clients.get(client.conn) is client:
                    self.host.unregister_pool(client, server.pool_id)
        finally:
            server.log_ended()

    def forget_pool(self, pool_id: int) -> None:
        """A pool is about to close (the loop, the lock held): kept requests with views
        into it go, so its mapping can close now. A burst's own memory unregistered as a
        pool ends the burst: it is no longer counted against the uid."""
        for server in list(self._servers.values()):
            if server.pool_id == pool_id:
                self._end(server)
                continue
            fixed = server.fixed
            if fixed is not None and fixed.uses_pool(pool_id):
                server.fixed = None
            spare = server.spare
            if spare is not None and spare[0].uses_pool(pool_id):
                server.spare = None
