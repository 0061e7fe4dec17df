"""Events into and instructions out of :class:`ManagerState`.

The state machine never does I/O and never reads a clock: every event carries
``now`` (seconds on the daemon's monotonic clock) and a ``stimulus_id`` that
names what caused it, and ``ManagerState.handle(event)`` returns the
instructions the async shell must carry out, in order. A call the caller got
wrong (bad policy, reused id) raises an ``npumanager.errors`` exception from
``handle`` and leaves the state unchanged.

Requests are keyed by (uid, request id), never by id alone; ``conn`` names the
client connection (its death drops exactly its requests).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from npumanager.constants import (
    LoadStatus,
    ModelPriority,
    ModelSize,
    Policy,
    RequestStatus,
    ThermalStatus,
    UnloadReason,
)
from npumanager.hal.types import EndReason, SchedulingConfig

RequestKey = tuple[int, int]  # (uid, request id)

# --- events -------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class Event:
    stimulus_id: str
    now: float


@dataclass(frozen=True, kw_only=True, slots=True)
class RequestLoad(Event):
    uid: int
    pid: int
    conn: int
    request_id: int
    size: ModelSize = ModelSize.LESS_THAN_1GB
    priority: ModelPriority = ModelPriority.NORMAL
    #: The device the model will be prepared on (``nn.devices()`` names); None: the first.
    device: str | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class CancelLoad(Event):
    uid: int
    conn: int
    request_id: int


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelLoaded(Event):
    uid: int
    conn: int
    request_id: int


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelUnloaded(Event):
    uid: int
    conn: int
    request_id: int


@dataclass(frozen=True, kw_only=True, slots=True)
class ClientGone(Event):
    """The connection closed (linkToDeath): drop its requests, no callbacks."""

    conn: int


@dataclass(frozen=True, kw_only=True, slots=True)
class ImportanceChanged(Event):
    uid: int
    importance: int


@dataclass(frozen=True, kw_only=True, slots=True)
class PolicySet(Event):
    """Validated in the state: weight or budget <= 0, unknown policy -> InvalidArgument.

    ``None`` fields keep the policy's defaults (BUDGET 1/2/4 and 4; TURN_TAKING
    forces 1 and 1)."""

    policy: int
    max_budget: int | None = None
    weights: dict[int, int] | None = None
    memory_budget_bytes: int | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class WorkEnded(Event):
    """HAL on_work_ended, attributed to ``uid`` (the work's original uid), on ``device``
    (None: unknown, every device of the uid's holders)."""

    uid: int
    reason: EndReason
    device: str | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class ThermalChanged(Event):
    """The machine's thermal status (``device`` None), or one device's own (its driver's
    thermal model). A device's budget follows the worse of the two."""

    status: ThermalStatus
    device: str | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class TimerFired(Event):
    key: str


@dataclass(frozen=True, kw_only=True, slots=True)
class DriverUp(Event):
    """Driver ``name`` is up with ``devices`` ((device name, memory bytes), in its order;
    empty: one device named like the driver, with ``memory_bytes``)."""

    name: str
    memory_bytes: int = 0
    devices: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True, kw_only=True, slots=True)
class DriverDown(Event):
    name: str


@dataclass(frozen=True, kw_only=True, slots=True)
class GrantEndApplied(Event):
    """A driver acknowledged an ``EndGrant(ack=True)``: it released the grant's models and
    refuses its bursts (:mod:`.ending`)."""

    grant_id: str
    driver: str  # the link it came on: only the grant's own driver can apply its end


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelMemory(Event):
    """A driver reports the real memory of a model prepared under ``grant_id``;
    ``freed``: one of a moved grant was released on the host it left (its app prepared
    it again on the other one), its bytes leave the grant's count."""

    grant_id: str
    nbytes: int
    freed: bool = False


@dataclass(frozen=True, slots=True)
class HeldGrant:
    """A grant a driver still holds when a (new) npud attaches: models prepared under it
    keep running (``nbytes``: their memory as the driver reports it)."""

    grant_id: str
    uid: int
    request_id: int
    nbytes: int = 0
    #: The device it is valid on (set by the state from the reporting driver).
    device: str = ""


@dataclass(frozen=True, kw_only=True, slots=True)
class DriverHeld(Event):
    """A driver attached and listed the grants it holds (see :mod:`.adoption`)."""

    name: str
    grants: tuple[HeldGrant, ...] = ()


#: What a reconnecting client says it knew of a request.
CLAIM_STATES = ("waiting", "granted", "loaded", "unload_requested")


@dataclass(frozen=True, kw_only=True, slots=True)
class ClaimRequest(Event):
    """A client reconnected after npud restarted re-registers one live request."""

    uid: int
    pid: int
    conn: int
    request_id: int
    size: ModelSize = ModelSize.LESS_THAN_1GB
    priority: ModelPriority = ModelPriority.NORMAL
    state: str = "waiting"
    grant_id: str = ""
    unload_reason: UnloadReason | None = None
    #: The device the request named (None: the first; a held grant's own device wins).
    device: str | None = None


# --- instructions ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Instruction:
    pass


@dataclass(frozen=True, slots=True)
class IssueGrant(Instruction):
    """Tell the drivers a grant is live, for ``device`` only. Always precedes the
    CAN_LOAD_NOW it belongs to."""

    uid: int
    request_id: int
    grant_id: str
    device: str = ""
    #: The request's ModelPriority: which of the device's hosts it is valid on
    #: (service/host_lanes.grant_target).
    priority: int = 0


@dataclass(frozen=True, slots=True)
class SendCanLoad(Instruction):
    conn: int
    uid: int
    request_id: int
    status: LoadStatus
    grant_id: str | None = None  # set with CAN_LOAD_NOW
    device: str = ""  # the request's device (metrics label)


@dataclass(frozen=True, slots=True)
class AskUnload(Instruction):
    conn: int
    uid: int
    request_id: int
    reason: UnloadReason
    device: str = ""


@dataclass(frozen=True, slots=True)
class SendComplete(Instruction):
    """The terminal callback (CANCELLED, COMPLETE, REVOKED); nothing follows it."""

    conn: int
    uid: int
    request_id: int
    status: RequestStatus
    device: str = ""


@dataclass(frozen=True, slots=True)
class RequestEnded(Instruction):
    """A request's terminal state is decided (CANCELLED, COMPLETE, REVOKED): for observers
    (``npu_requests_completed_total``), nothing to carry out. Emitted once per request, at
    the decision, whether or not its client is still there to receive the SendComplete
    that follows now or, after the driver's ack (:mod:`.ending`), later."""

    uid: int
    request_id: int
    status: RequestStatus
    device: str = ""


@dataclass(frozen=True, slots=True)
class RequestDropped(Instruction):
    """A live request dropped without a terminal state: its client left before npud decided
    its end (ClientGone). For observers (``npu_requests_dropped_total``), nothing to carry
    out; emitted once, instead of a :class:`RequestEnded`."""

    uid: int
    request_id: int
    device: str = ""


@dataclass(frozen=True, slots=True)
class EndGrant(Instruction):
    """The grant is over; ``revoked`` means the driver must release its models now.
    ``ack``: the state waits for the driver's ``GrantEndApplied`` before it answers the app
    and frees the memory (:mod:`.ending`)."""

    grant_id: str
    uid: int
    request_id: int
    revoked: bool
    ack: bool = False


@dataclass(frozen=True, slots=True)
class RestartDriver(Instruction):
    """Driver ``driver`` is hung (it did not acknowledge the end of a grant in time): kill
    it and let the supervisor restart it, as after a crash."""

    driver: str
    reason: str


@dataclass(frozen=True, slots=True)
class ArmTimer(Instruction):
    """Fire TimerFired(key) at ``at`` (re-arming a key replaces it)."""

    key: str
    at: float


@dataclass(frozen=True, slots=True)
class CancelTimer(Instruction):
    key: str


@dataclass(frozen=True, slots=True)
class PushSchedulingConfigs(Instruction):
    """Single-entry (or few-entry) upserts of the drivers' scheduling table."""

    entries: tuple[SchedulingConfig, ...]


@dataclass(frozen=True, slots=True)
class SetDriverThermal(Instruction):
    """The thermal status the drivers hold work back by: every device's (``device`` "")
    or one device's."""

    status: ThermalStatus
    device: str = ""


@dataclass(frozen=True, slots=True)
class Decision:
    """One line of the bounded decision log (``npu status --story``)."""

    at: float
    stimulus_id: str
    key: RequestKey | None
    what: str
    details: dict[str, object] = field(default_factory=dict)


ALL_POLICIES = {int(p) for p in Policy}
