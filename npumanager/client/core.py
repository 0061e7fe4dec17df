"""The client core: one connection's live requests, written once for both client APIs.

:class:`ClientCore` owns what :class:`~npumanager.client.manager.NpuManager`
(blocking) and :class:`~npumanager.client.aio.AsyncNpuManager` (asyncio) have
in common: the table of live requests (keyed by request id: a connection has
one uid, and npud keys by (uid, id)), the decoding of npud's pushes
(on_can_load_model, on_request_unload_model, on_model_load_request_complete),
each live request's state and grant, and what a lost connection means. It does
no I/O and starts nothing; an adapter gives it

* ``deliver(executor, fn, *args)``: run one app callback, in order (the blocking API:
  on its dispatch thread, then the app's executor; the async API: on the loop,
  scheduling a returned coroutine, or on the app's executor), and
* ``make_listener(request)``: the listener the app reports through,

then feeds it what the transport hears: :meth:`on_push`,
:meth:`connection_lost`, and :meth:`reported` after a loaded/unloaded call
succeeded. The core itself is single-threaded: the async API calls it from its
loop only, the blocking API (caller's thread, reader thread) under one lock of
its own. It starts nothing and takes no lock, so it can decide without I/O, as
the other cores do (a contract in ``pyproject.toml``).

Lost connection (npud crashed or was killed): the core keeps the live
requests and the adapter reconnects on the back-off :func:`reconnect_delays`
gives (50 ms doubling to 1 s) for up to ``reconnect_window_s``; on success
:meth:`reconnected` says what to re-register (``reclaim``: id, size, priority,
state, grant) and npud adopts them (ARCHITECTURE "Restart without losing the
world"): an adopted request sees no callback at all; one npud cannot adopt
ends ``REVOKED`` by the usual push. While reconnecting new requests and calls
raise ``ServiceUnavailable``. When the window passes, or npud said goodbye (a
final stop, which stops its drivers too; `npu serve` on SIGTERM/SIGINT says none:
that is a restart), or reconnecting is off, every live
request ends with ``on_model_load_request_complete(request, CANCELLED)``,
logged as a warning naming it. :meth:`close` drops them silently, as npud does.
"""

from __future__ import annotations

import enum
import functools
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from google.protobuf.message import DecodeError

from npumanager.constants import LoadStatus, RequestStatus, UnloadReason
from npumanager.errors import InvalidArgument, ProtocolError, ServiceUnavailable
from npumanager.fds import close_fds
from npumanager.proto.v1.manager_pb2 import CanLoad, Claim, Reclaim, RequestComplete, UnloadAsk

from .request import ModelLoadRequest, ModelLoadRequestCallback

log = logging.getLogger("npumanager.client")

#: A ``concurrent.futures.Executor`` (its ``submit``) or Android's ``Executor.execute``:
#: any callable taking a zero-argument function.
ExecutorLike = Executor | Callable[[Callable[[], None]], Any]


class Deliver(Protocol):
    """Run ``fn(*args)``, an app callback, after the ones delivered before it."""

    def __call__(self, executor: ExecutorLike | None, fn: Callable[..., object],
                 *args: Any) -> None: ...


#: The pushes npud sends a manager client (``goodbye`` is the transport's).
PUSHES = ("on_can_load_model", "on_request_unload_model", "on_model_load_request_complete")


class Listener(Protocol):
    """What the core needs of either API's listener."""

    request: ModelLoadRequest
    grant_id: str | None
    lane: str


class Phase(enum.Enum):
    CONNECTED = "connected"
    RECONNECTING = "reconnecting"  # the connection dropped: live requests kept, retrying
    LOST = "lost"  # the connection dropped under us: live requests ended CANCELLED
    CLOSED = "closed"  # the app closed it: requests dropped without callbacks


class LiveState(enum.Enum):
    """What this client knows of one live request (npud's view, as far as it told us)."""

    WAITING = "waiting"  # asked; no grant yet (or NOT_PRIORITIZED / WAIT_FOR_UNLOAD)
    GRANTED = "granted"  # CAN_LOAD_NOW with a grant id
    LOADED = "loaded"  # the app reported loaded
    UNLOAD_REQUESTED = "unload_requested"  # npud asked for the model back


L = TypeVar("L", bound=Listener)


class LiveRequest(Generic[L]):
    """One live request of this connection and the app's callback for it."""

    __slots__ = ("callback", "executor", "grant_id", "listener", "request", "state",
                 "unload_reason")

    def __init__(self, request: ModelLoadRequest, callback: ModelLoadRequestCallback,
                 executor: ExecutorLike | None, listener: L) -> None:
        self.request = request
        self.callback = callback
        self.executor = executor
        self.listener = listener
        self.state = LiveState.WAITING
        self.grant_id: str | None = None
        self.unload_reason: UnloadReason | None = None

    def __repr__(self) -> str:
        return f"<LiveRequest {self.request.id} {self.state.value} grant={self.grant_id}>"


@dataclass(frozen=True, slots=True)
class LiveView:
    """A snapshot of one live request: what a reconnect would re-register."""

    request: ModelLoadRequest
    state: LiveState
    grant_id: str | None


#: Reconnect back-off (API "Manager restart"): from 50 ms, doubling, to 1 s.
RECONNECT_FIRST_S = 0.05
RECONNECT_MAX_S = 1.0
#: How long a client keeps its live requests while npud is away (npud's driver hosts keep
#: loaded models for ``orphan_grace_s``, 10 s by default; this outlasts it a little).
RECONNECT_WINDOW_S = 15.0


def reconnect_delays() -> Iterator[float]:
    """Seconds to wait before each reconnect attempt."""
    delay = RECONNECT_FIRST_S
    while True:
        yield delay
        delay = min(delay * 2, RECONNECT_MAX_S)


def run_callback(fn: Callable[..., object], *args: Any) -> object:
    """Run one app callback; an exception is logged and delivery goes on with the next."""
    try:
        return fn(*args)
    except Exception:
        log.exception("an app callback raised; npumanager keeps delivering the next ones")
        return None


def _run_on_executor(fn: Callable[..., object], *args: Any) -> None:
    run_callback(fn, *args)


def hand_to_executor(executor: ExecutorLike, fn: Callable[..., object], *args: Any) -> None:
    """Give ``fn(*args)`` to the app's executor (its ``submit``, or the callable itself)."""
    job = functools.partial(_run_on_executor, fn, *args)
    if isinstance(executor, Executor):
        executor.submit(job)
    else:
        executor(job)


E = TypeVar("E", bound=enum.IntEnum)


def _table(cls: type[E]) -> Mapping[int, E]:
    return {int(m): m for m in cls}


# Wire numbers to members by dict: an Enum call is ~0.7 µs on every push. Zero is a
# real value (CAN_LOAD_NOW, PREEMPTED): a miss is ``None``, never a falsy member.
_LOAD_STATUS = _table(LoadStatus)
_UNLOAD_REASON = _table(UnloadReason)
_REQUEST_STATUS = _table(RequestStatus)


def _unknown(what: str, value: int) -> ProtocolError:
    return ProtocolError(f"npud sent {what} {value}, which this SDK does not know")


class ClientCore(Generic[L]):
    """The live request table of one manager connection; see the module docstring."""

    def __init__(self, deliver: Deliver, make_listener: Callable[[ModelLoadRequest], L],
                 *, reconnect: bool = True) -> None:
        self._deliver = deliver
        self._make_listener = make_listener
        self._live: dict[int, LiveRequest[L]] = {}
        self.phase = Phase.CONNECTED
        self.lost_reason: BaseException | None = None
        #: Reconnect when the connection drops (else end live requests CANCELLED at once).
        self.reconnect = reconnect
        #: npud said goodbye (a final stop): no reconnect on this loss.
        self.goodbye = False
        #: Times this client reconnected and re-registered its requests.
        self.reconnects = 0
        self._pushes: dict[str, Callable[[bytes], None]] = {
            "on_can_load_model": self._on_can_load,
            "on_request_unload_model": self._on_unload,
            "on_model_load_request_complete": self._on_complete,
        }

    def __len__(self) -> int:
        return len(self._live)

    def __repr__(self) -> str:
        return f"<ClientCore {self.phase.value} | {len(self._live)} live requests>"

    # --- the app's side ---------------------------------------------------------

    def register(self, request: ModelLoadRequest, callback: ModelLoadRequestCallback,
                 executor: ExecutorLike | None) -> LiveRequest[L]:
        """Add a request before it is sent: npud pushes its first status before the reply."""
        if not isinstance(request, ModelLoadRequest):
            raise InvalidArgument(f"expected a ModelLoadRequest, got {type(request).__name__}")
        live = LiveRequest(request, callback, executor, self._make_listener(request))
        if self.phase is not Phase.CONNECTED:
            raise self.unavailable()
        if request.id in self._live:
            raise InvalidArgument(
                f"request {request.id} is already live on this connection; "
                f"a request may be submitted once"
            )
        self._live[request.id] = live
        return live

    def withdraw(self, live: LiveRequest[L]) -> None:
        """The request call failed: npud never took the request."""
        if self._live.get(live.request.id) is live:
            del self._live[live.request.id]

    def reported(self, method: str, request_id: int) -> None:
        """The app's ``loaded`` call succeeded (``unloaded`` ends with npud's COMPLETE)."""
        if method != "loaded":
            return
        live = self._live.get(request_id)
        if live is not None and live.state is LiveState.GRANTED:
            live.state = LiveState.LOADED

    def live_requests(self) -> list[LiveView]:
        return [LiveView(x.request, x.state, x.grant_id) for x in self._live.values()]

    def unavailable(self) -> ServiceUnavailable:
        why = f": {self.lost_reason}" if self.lost_reason is not None else ""
        return ServiceUnavailable(f"not connected to npud ({self.phase.value}{why})")

    def close(self) -> None:
        """The app closes the connection: drop every live request without callbacks."""
        self.phase = Phase.CLOSED
        self._live.clear()

    # --- what the transport hears -------------------------------------------------

    def on_push(self, method: str, payload: bytes, fds: Sequence[int] = ()) -> None:
        if fds:
            close_fds(fds)  # no manager push carries fds
        handler = self._pushes.get(method)
        if handler is None:
            if method == "goodbye":
                self.goodbye = True
            else:
                log.debug("ignoring unknown push %r from npud", method)
            return
        try:
            handler(payload)
        except (DecodeError, ProtocolError) as exc:
            # A newer npud speaking the same protocol version should not get here.
            log.warning("dropped a malformed %s push from npud: %s", method, exc)

    def _on_can_load(self, payload: bytes) -> None:
        m = CanLoad.FromString(payload)
        status = _LOAD_STATUS.get(m.status)
        if status is None:
            raise _unknown("load status", m.status)
        live = self._live.get(m.request_id)
        if live is None:
            return
        if status is LoadStatus.CAN_LOAD_NOW:
            live.state = LiveState.GRANTED
            live.grant_id = live.listener.grant_id = m.grant_id or None
            live.listener.lane = m.lane
        self._deliver(live.executor, live.callback.on_can_load_model, live.request, status,
                      live.listener)

    def _on_unload(self, payload: bytes) -> None:
        m = UnloadAsk.FromString(payload)
        reason = _UNLOAD_REASON.get(m.reason)
        if reason is None:
            raise _unknown("unload reason", m.reason)
        live = self._live.get(m.request_id)
        if live is None:
            return
        live.state = LiveState.UNLOAD_REQUESTED
        live.unload_reason = reason
        self._deliver(live.executor, live.callback.on_request_unload_model, live.request,
                      reason)

    def _on_complete(self, payload: bytes) -> None:
        m = RequestComplete.FromString(payload)
        status = _REQUEST_STATUS.get(m.status)
        if status is None:
            raise _unknown("request status", m.status)
        live = self._live.pop(m.request_id, None)
        if live is not None:
            self._deliver(live.executor, live.callback.on_model_load_request_complete,
                          live.request, status)

    def connection_lost(self, exc: BaseException | None) -> bool:
        """The connection dropped (not closed by the app). True: keep the live requests and
        reconnect (the adapter calls :meth:`reconnected` or :meth:`give_up`); False: they
        ended CANCELLED here."""
        if self.phase is not Phase.CONNECTED:
            return False
        self.lost_reason = exc
        if self.reconnect and not self.goodbye:
            self.phase = Phase.RECONNECTING
            if self._live:
                log.warning("connection to npud lost (%s): reconnecting; %d live request(s) "
                            "kept", exc or "closed", len(self._live))
            return True
        self._end_all()
        return False

    def reconnected(self) -> Reclaim:
        """A new connection is up: what to re-register with npud (``reclaim``)."""
        self.phase = Phase.CONNECTED
        self.goodbye = False
        self.lost_reason = None
        self.reconnects += 1
        claims = []
        for x in self._live.values():
            c = Claim(request_id=x.request.id, size=int(x.request.size),
                      priority=int(x.request.priority), state=x.state.value,
                      grant_id=x.grant_id or "", device=x.request.device or "")
            if x.unload_reason is not None:
                c.unload_reason = int(x.unload_reason)
            claims.append(c)
        if claims:
            log.warning("reconnected to npud: re-registering %d live request(s)", len(claims))
        return Reclaim(claims=claims)

    def give_up(self) -> None:
        """npud did not come back within the reconnect window."""
        if self.phase is Phase.RECONNECTING:
            self._end_all()

    def _end_all(self) -> None:
        self.phase = Phase.LOST
        exc = self.lost_reason
        ended = list(self._live.values())
        self._live.clear()
        for live in ended:
            log.warning("connection to npud lost (%s): request %d ends CANCELLED",
                        exc or "closed", live.request.id)
            self._deliver(live.executor, live.callback.on_model_load_request_complete,
                          live.request, RequestStatus.CANCELLED)
