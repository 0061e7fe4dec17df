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

Lost connection: every live request ends with
``on_model_load_request_complete(request, CANCELLED)``, logged as a warning
naming it (npud drops a closed connection's requests without callbacks, so
CANCELLED is what happened to them), and new requests raise
``ServiceUnavailable``. :meth:`close` drops them silently, as npud does.

Reconnecting (ARCHITECTURE "Restart without losing the world") is meant to
land here once for both APIs: :meth:`connection_lost` is the one place that
decides between ending the live requests and keeping them, and
:meth:`live_requests` is what a new connection re-registers (id, size,
priority, state, grant); the adapters would only open the new connection on
the back-off the core computes.
"""

from __future__ import annotations

import enum
import functools
import logging
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from google.protobuf.message import DecodeError

from npumanager.constants import LoadStatus, RequestStatus, UnloadReason
from npumanager.errors import InvalidArgument, ProtocolError, ServiceUnavailable
from npumanager.fds import close_fds
from npumanager.proto.v1.manager_pb2 import CanLoad, RequestComplete, UnloadAsk

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


class Phase(enum.Enum):
    CONNECTED = "connected"
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

    __slots__ = ("callback", "executor", "grant_id", "listener", "request", "state")

    def __init__(self, request: ModelLoadRequest, callback: ModelLoadRequestCallback,
                 executor: ExecutorLike | None, listener: L) -> None:
        self.request = request
        self.callback = callback
        self.executor = executor
        self.listener = listener
        self.state = LiveState.WAITING
        self.grant_id: str | None = None

    def __repr__(self) -> str:
        return f"<LiveRequest {self.request.id} {self.state.value} grant={self.grant_id}>"


@dataclass(frozen=True, slots=True)
class LiveView:
    """A snapshot of one live request: what a reconnect would re-register."""

    request: ModelLoadRequest
    state: LiveState
    grant_id: str | None


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

    def __init__(self, deliver: Deliver, make_listener: Callable[[ModelLoadRequest], L]) -> None:
        self._deliver = deliver
        self._make_listener = make_listener
        self._live: dict[int, LiveRequest[L]] = {}
        self.phase = Phase.CONNECTED
        self.lost_reason: BaseException | None = None
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
            if method != "goodbye":
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

    def connection_lost(self, exc: BaseException | None) -> None:
        """The connection dropped (not closed by the app): end every live request CANCELLED."""
        if self.phase is not Phase.CONNECTED:
            return
        self.phase = Phase.LOST
        self.lost_reason = exc
        ended = list(self._live.values())
        self._live.clear()
        for live in ended:
            log.warning("connection to npud lost (%s): request %d ends CANCELLED",
                        exc or "closed", live.request.id)
            self._deliver(live.executor, live.callback.on_model_load_request_complete,
                          live.request, RequestStatus.CANCELLED)
