"""Events into and instructions out of :class:`~npumanager.drivers.state.DriverState`.

The driver host's core never does I/O and never reads a clock: every event
carries ``now`` (seconds on the host's monotonic clock) and a ``stimulus_id``
naming what caused it, and ``DriverState.handle(event)`` returns the
instructions the async shell (:class:`~npumanager.drivers.host.DriverHost`)
carries out, in order. An event the caller got wrong (an unknown model, no
direct access, a bad config table) raises an ``npumanager.errors`` exception
from ``handle`` and changes nothing.

Names the shell and the core share: ``conn`` is the shell's number for a
client connection; ``ticket`` is the shell's number for one execute call (its
reply, inputs and outputs live in the shell); ``work_id`` is the HAL work id
the core assigns; model and pool ids are assigned by the core.

Events and instructions are values: nobody changes one after making it. They
are plain slotted dataclasses rather than frozen ones because a frozen
dataclass sets each field through ``object.__setattr__``, which makes building
the five an execution needs cost ~3x more (a few µs per execute).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from npumanager.constants import ThermalStatus
from npumanager.hal.types import EndReason, SchedulingConfig, WorkInfo
from npumanager.tensorio.specs import TensorSpec


class JobState(Enum):
    """Where a job is. A finished job leaves the state (its story stays in the log)."""

    QUEUED = "queued"  # admitted, no step run yet
    RUNNING = "running"  # a step runs on a channel
    PAUSED = "paused"  # between steps, back in the queue behind more important work


class WorkKind(Enum):
    """Which ISchedulingCallback method a report goes to."""

    REQUESTED = "requested"
    STARTED = "started"
    ENDED = "ended"


# --- events -------------------------------------------------------------------------


@dataclass(kw_only=True, slots=True)
class Event:
    stimulus_id: str
    now: float


@dataclass(kw_only=True, slots=True)
class ClientConnected(Event):
    conn: int
    uid: int
    pid: int


@dataclass(kw_only=True, slots=True)
class ClientGone(Event):
    """The connection closed: its work is cancelled, its models and pools released."""

    conn: int


@dataclass(kw_only=True, slots=True)
class ConfigsSet(Event):
    """``set_scheduling_configs`` (``replace``) or ``update_scheduling_configs``."""

    configs: tuple[SchedulingConfig, ...]
    replace: bool


@dataclass(kw_only=True, slots=True)
class CallbackSet(Event):
    """A HAL callback was registered (``listening``) or cleared / its connection closed."""

    listening: bool
    debounce_ms: int = 50


@dataclass(kw_only=True, slots=True)
class ManagerAttached(Event):
    enforce_admission: bool


@dataclass(kw_only=True, slots=True)
class ManagerGone(Event):
    """The npud that attached went away (its connection closed)."""


@dataclass(kw_only=True, slots=True)
class LauncherGone(Event):
    """The npud that started this host process has exited (``npu driver
    --exit-with-manager`` watches it): a device whose link never attached, or had not
    attached yet when npud stopped, hears no ManagerGone; its grace starts here."""


@dataclass(kw_only=True, slots=True)
class GrantIssued(Event):
    grant_id: str
    uid: int
    request_id: int


@dataclass(kw_only=True, slots=True)
class GrantEnded(Event):
    grant_id: str
    revoked: bool


@dataclass(kw_only=True, slots=True)
class GrantMoved(Event):
    """npud's table now puts the grant on the device's other host (hal.grant_moved):
    ``lane`` is that host's ("" the main one)."""

    grant_id: str
    lane: str


@dataclass(kw_only=True, slots=True)
class ThermalSet(Event):
    status: ThermalStatus


@dataclass(kw_only=True, slots=True)
class PrepareBegun(Event):
    """A prepare (or prepare from cache) of ``conn`` is about to read ``nbytes`` (its
    model memfd, external data and cache files, each by its size): refused while no
    manager is attached (after one was) or when the uid is at a bound."""

    conn: int
    prepare_id: int
    nbytes: int


@dataclass(kw_only=True, slots=True)
class PrepareEnded(Event):
    """The prepare is over, whatever its outcome (its bytes are no longer charged)."""

    prepare_id: int


@dataclass(kw_only=True, slots=True)
class ModelPrepared(Event):
    """The shell compiled (or loaded from cache) a model for ``conn`` under ``grant_id``
    (``prepare_id``: the PrepareBegun it completes; 0 for none)."""

    conn: int
    grant_id: str | None
    memory_bytes: int
    inputs: frozenset[str]
    outputs: frozenset[str]
    #: The inputs' ONNX types (what executes are checked against); none: names only.
    input_specs: tuple[TensorSpec, ...] = ()
    prepare_id: int = 0


@dataclass(kw_only=True, slots=True)
class ModelReleased(Event):
    conn: int
    model_id: int


@dataclass(kw_only=True, slots=True)
class PoolRegistered(Event):
    conn: int
    size: int


@dataclass(kw_only=True, slots=True)
class PoolUnregistered(Event):
    conn: int
    pool_id: int


@dataclass(kw_only=True, slots=True)
class ExecuteRequested(Event):
    """An execute call; the shell has decoded its tensors (``inputs`` are their names,
    ``values`` the decoded values themselves, read only to check their types)."""

    conn: int
    ticket: int
    model_id: int
    inputs: tuple[str, ...]
    values: Mapping[str, Any] | None = None
    steps: int = 1
    feedback: tuple[tuple[str, str], ...] = ()
    job_priority: int = 0
    original_uid: int | None = None
    feature_id: int | None = None
    group_id: bytes | None = None
    exec_id: int = 0


@dataclass(kw_only=True, slots=True)
class CancelRequested(Event):
    """Cancel ``conn``'s executions of ``model_id`` (``exec_id`` 0: all of them)."""

    conn: int
    model_id: int
    exec_id: int = 0


@dataclass(kw_only=True, slots=True)
class StepFinished(Event):
    """The step :class:`RunStep` started is over; ``error`` says why it failed."""

    ticket: int
    run_us: float
    error: str | None = None


@dataclass(kw_only=True, slots=True)
class TimerFired(Event):
    key: str


# --- instructions -------------------------------------------------------------------


@dataclass(slots=True)
class Instruction:
    pass


@dataclass(slots=True)
class RunStep(Instruction):
    """Run step ``step`` of the job: inline on the event loop, or on a worker thread.
    ``last``: place the outputs for the reply (else feed them back into the inputs).
    ``channel`` and ``work_id`` are for traces."""

    ticket: int
    step: int
    last: bool
    inline: bool
    channel: int = 0
    work_id: int = 0
    #: The job's execution class is BACKGROUND: run it on a background worker thread
    #: (.classes). Not part of equality: it follows from the job's priority.
    background: bool = field(default=False, compare=False)
    #: The job's effective priority, for the backend's own knobs (PreparedModel.begin_step).
    priority: int = field(default=-1, compare=False)
    #: A background step of a uid that used more than its share of the background's
    #: time (.share): the shell runs it where the other background steps preempt it.
    yields: bool = field(default=False, compare=False)
    #: A BACKGROUND step's lane (.runqueue; None: none): the shell runs it on lane's
    #: own thread, kept on a CPU of its own, apart from the other background steps.
    lane: int | None = field(default=None, compare=False)


@dataclass(slots=True)
class AbortStep(Instruction):
    """Best effort: end the running step early (the job was cancelled)."""

    ticket: int


@dataclass(slots=True)
class FinishJob(Instruction):
    """The job is over: answer its execute call."""

    ticket: int
    work_id: int
    reason: EndReason
    steps_run: int
    error: str | None = None
    #: Why its grant ended (the model was released under it), if that ended it.
    revoked: str | None = None


@dataclass(slots=True)
class ReportWork(Instruction):
    """Push ``on_work_<kind>(info, reason)`` to the registered callback."""

    kind: WorkKind
    info: WorkInfo
    reason: int


@dataclass(slots=True)
class ModelReady(Instruction):
    """Answer the prepare of ``conn``: its model is ``model_id``."""

    conn: int
    model_id: int


@dataclass(slots=True)
class ReleaseModel(Instruction):
    """Free the prepared model (nothing of it runs any more)."""

    model_id: int


@dataclass(slots=True)
class ReportModelMemory(Instruction):
    """Tell npud what a granted model really holds (the MEMORY policy charges it);
    ``freed``: a model of a moved grant was released here, its bytes leave the count."""

    grant_id: str
    nbytes: int
    freed: bool = False


@dataclass(slots=True)
class PoolReady(Instruction):
    conn: int
    pool_id: int


@dataclass(slots=True)
class ClosePool(Instruction):
    pool_id: int


@dataclass(slots=True)
class GraceExpired(Instruction):
    """No manager came back within the orphan grace: every model was released (the
    shell of a host npud started exits now)."""

    models: int


@dataclass(slots=True)
class HoldLoads(Instruction):
    """Stop (``stop``) or continue the background compiles in flight (.load_hold); the
    shell does it from whichever thread carries this out."""

    stop: bool


@dataclass(slots=True)
class ArmTimer(Instruction):
    """Deliver ``TimerFired(key)`` at ``at`` (re-arming a key replaces it)."""

    key: str
    at: float


@dataclass(slots=True)
class CancelTimer(Instruction):
    key: str


# --- the decision log -----------------------------------------------------------------


@dataclass(slots=True)
class Decision:
    """One line of a story: at ``at``, because of ``stimulus_id``, ``what`` happened to
    ``subject`` (``work 12``, ``model 3``, ``grant ab12…``)."""

    at: float
    stimulus_id: str
    subject: str
    what: str
    details: dict[str, object]

    def __str__(self) -> str:
        extra = " ".join(f"{k}={v}" for k, v in self.details.items())
        return f"{self.at:.3f} [{self.stimulus_id}] {self.subject}: {self.what} {extra}".rstrip()
