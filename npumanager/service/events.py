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

import dataclasses
import types
from dataclasses import MISSING, dataclass, field
from typing import TypeVar

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

_T = TypeVar("_T")
_FACTORY = object()  # "use the field's default_factory"


def _fast_init(cls: type[_T]) -> type[_T]:
    """Give a frozen, slotted dataclass an ``__init__`` that fills its slots directly.

    A frozen dataclass's generated ``__init__`` goes through ``object.__setattr__``
    for every field (~1.1 µs for five); setting the slot descriptors is ~0.35 µs.
    npud builds several events and instructions per request, so this is on the
    grant path. Same signature, defaults, equality, hash, repr and immutability."""
    params: list[str] = []
    body: list[str] = []
    ns: dict[str, object] = {"_FACTORY": _FACTORY}
    star = False
    for i, f in enumerate(dataclasses.fields(cls)):  # type: ignore[arg-type]
        if f.kw_only and not star:
            params.append("*")
            star = True
        if f.default is not MISSING:
            ns[f"_d{i}"] = f.default
            params.append(f"{f.name}=_d{i}")
        elif f.default_factory is not MISSING:
            ns[f"_f{i}"] = f.default_factory
            params.append(f"{f.name}=_FACTORY")
            body.append(f"    if {f.name} is _FACTORY: {f.name} = _f{i}()")
        else:
            params.append(f.name)
        ns[f"_s{i}"] = getattr(cls, f.name).__set__  # the slot's member descriptor
        body.append(f"    _s{i}(self, {f.name})")
    src = f"def __init__(self, {', '.join(params)}):\n" + "\n".join(body or ["    pass"])
    exec(src, ns)  # generated from the dataclass's own field list, nothing else
    init = ns["__init__"]
    assert isinstance(init, types.FunctionType)
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    cls.__init__ = init  # type: ignore[method-assign]
    return cls


# --- events -------------------------------------------------------------------


@_fast_init
@dataclass(frozen=True, kw_only=True, slots=True)
class Event:
    stimulus_id: str
    now: float


@_fast_init
@dataclass(frozen=True, kw_only=True, slots=True)
class RequestLoad(Event):
    uid: int
    pid: int
    conn: int
    request_id: int
    size: ModelSize = ModelSize.LESS_THAN_1GB
    priority: ModelPriority = ModelPriority.NORMAL


@_fast_init
@dataclass(frozen=True, kw_only=True, slots=True)
class CancelLoad(Event):
    uid: int
    conn: int
    request_id: int


@_fast_init
@dataclass(frozen=True, kw_only=True, slots=True)
class ModelLoaded(Event):
    uid: int
    conn: int
    request_id: int


@_fast_init
@dataclass(frozen=True, kw_only=True, slots=True)
class ModelUnloaded(Event):
    uid: int
    conn: int
    request_id: int


@_fast_init
@dataclass(frozen=True, kw_only=True, slots=True)
class ClientGone(Event):
    """The connection closed (linkToDeath): drop its requests, no callbacks."""

    conn: int


@_fast_init
@dataclass(frozen=True, kw_only=True, slots=True)
class ImportanceChanged(Event):
    uid: int
    importance: int


@_fast_init
@dataclass(frozen=True, kw_only=True, slots=True)
class PolicySet(Event):
    """Validated in the state: weight or budget <= 0, unknown policy -> InvalidArgument.

    ``None`` fields keep the policy's defaults (BUDGET 1/2/4 and 4; TURN_TAKING
    forces 1 and 1)."""

    policy: int
    max_budget: int | None = None
    weights: dict[int, int] | None = None
    memory_budget_bytes: int | None = None


@_fast_init
@dataclass(frozen=True, kw_only=True, slots=True)
class WorkEnded(Event):
    """HAL on_work_ended, attributed to ``uid`` (the work's original uid)."""

    uid: int
    reason: EndReason


@_fast_init
@dataclass(frozen=True, kw_only=True, slots=True)
class ThermalChanged(Event):
    status: ThermalStatus


@_fast_init
@dataclass(frozen=True, kw_only=True, slots=True)
class TimerFired(Event):
    key: str


@_fast_init
@dataclass(frozen=True, kw_only=True, slots=True)
class DriverUp(Event):
    name: str
    memory_bytes: int


@_fast_init
@dataclass(frozen=True, kw_only=True, slots=True)
class DriverDown(Event):
    name: str


@_fast_init
@dataclass(frozen=True, kw_only=True, slots=True)
class ModelMemory(Event):
    """A driver reports the real memory of a model prepared under ``grant_id``."""

    grant_id: str
    nbytes: int


# --- instructions ---------------------------------------------------------------


@_fast_init
@dataclass(frozen=True, slots=True)
class Instruction:
    pass


@_fast_init
@dataclass(frozen=True, slots=True)
class IssueGrant(Instruction):
    """Tell the drivers a grant is live. Always precedes the CAN_LOAD_NOW it belongs to."""

    uid: int
    request_id: int
    grant_id: str


@_fast_init
@dataclass(frozen=True, slots=True)
class SendCanLoad(Instruction):
    conn: int
    uid: int
    request_id: int
    status: LoadStatus
    grant_id: str | None = None  # set with CAN_LOAD_NOW


@_fast_init
@dataclass(frozen=True, slots=True)
class AskUnload(Instruction):
    conn: int
    uid: int
    request_id: int
    reason: UnloadReason


@_fast_init
@dataclass(frozen=True, slots=True)
class SendComplete(Instruction):
    """The terminal callback (CANCELLED, COMPLETE, REVOKED); nothing follows it."""

    conn: int
    uid: int
    request_id: int
    status: RequestStatus


@_fast_init
@dataclass(frozen=True, slots=True)
class EndGrant(Instruction):
    """The grant is over; ``revoked`` means the driver must release its models now."""

    grant_id: str
    uid: int
    request_id: int
    revoked: bool


@_fast_init
@dataclass(frozen=True, slots=True)
class ArmTimer(Instruction):
    """Fire TimerFired(key) at ``at`` (re-arming a key replaces it)."""

    key: str
    at: float


@_fast_init
@dataclass(frozen=True, slots=True)
class CancelTimer(Instruction):
    key: str


@_fast_init
@dataclass(frozen=True, slots=True)
class PushSchedulingConfigs(Instruction):
    """Single-entry (or few-entry) upserts of the drivers' scheduling table."""

    entries: tuple[SchedulingConfig, ...]


@_fast_init
@dataclass(frozen=True, slots=True)
class SetDriverThermal(Instruction):
    status: ThermalStatus


@_fast_init
@dataclass(frozen=True, slots=True)
class Decision:
    """One line of the bounded decision log (``npu status --story``)."""

    at: float
    stimulus_id: str
    key: RequestKey | None
    what: str
    details: dict[str, object] = field(default_factory=dict)


ALL_POLICIES = {int(p) for p in Policy}
