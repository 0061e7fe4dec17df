"""What :class:`~npumanager.drivers.state.DriverState` keeps: its parameters and its
records of connections, models and grants (plain data, no behaviour beyond upkeep)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from npumanager.drivers.bounds import Limits
from npumanager.drivers.classes import DEFAULT_FOREGROUND_PRIORITY
from npumanager.drivers.runqueue import Job
from npumanager.tensorio.specs import InputCheck

#: Recent step times kept per model; their median decides the inline fast path (a
#: median, so one preempted run does not push a cheap model off it).
_RECENT_RUNS = 9


@dataclass(frozen=True)
class DriverParams:
    """What a driver host is configured with (from its HostConfig)."""

    name: str = "driver"
    channels: int = 2
    device_number: int = 0
    thermal_cutoff: int = 500
    inline_run_us: float = 150.0
    inline_idle_run_us: float = 5000.0
    enforce_admission: bool = True
    #: Execution classes (.classes): work at or below this effective priority is
    #: FOREGROUND, above it BACKGROUND; channels kept free for foreground work.
    foreground_priority: int = DEFAULT_FOREGROUND_PRIORITY
    reserved_channels: int = 0
    #: The shell runs BACKGROUND steps on background threads (its thread policy is not
    #: "normal"): then they never take the inline idle path on the event loop.
    background_threads: bool = False
    #: The quiet window around paced foreground frames in µs (:mod:`.quiet`; 0: off).
    quiet_window_us: float = 0.0
    #: The window's tail after a paced frame's end, µs (:mod:`.quiet`; 0: none).
    quiet_tail_us: float = 0.0
    #: The window stops background compiles around the same frames (:mod:`.load_hold`).
    hold_loads: bool = False
    #: Fair share among background uids (:mod:`.share`): steps of a uid over its share
    #: are marked ``RunStep.yields`` (the shell's background_sched = "share").
    background_share: bool = False
    #: Background lanes (:mod:`.runqueue`; 0: none): background steps running at once
    #: get distinct ``RunStep.lane``\ s (the shell's background_cpus = "lanes").
    background_lanes: int = 0
    #: No lanes while a BACKGROUND model prepares (``"lanes-except-loads"``: lanes measured
    #: to cost the camera most while a model loads; bench/README.md ``background_cpus``).
    lanes_except_loads: bool = False
    #: BACKGROUND repeats take the one pass too where the dispatch weighs nothing for them
    #: (:mod:`.state_repeat`; the shell's background_one_pass).
    background_one_pass: bool = False
    #: Ended grants and released models remembered to say why a later call fails.
    tombstones: int = 4096
    decision_log_size: int = 4096
    #: What one uid / connection may make the host hold (:mod:`.bounds`).
    limits: Limits = field(default_factory=Limits)
    #: Seconds loaded models keep running after the manager went away (then released).
    orphan_grace_s: float = 10.0


class GrantCheck(Enum):
    """What a prepare may do with the grant it names (:meth:`DriverState.check_grant`)."""

    LIVE = "live"  # prepare under it
    UNKNOWN = "unknown"  # not issued yet: npud's push may still be on its way, wait
    NOT_NEEDED = "not needed"  # admission is not enforced: prepare without a grant


@dataclass(eq=False, slots=True)
class ClientRecord:
    conn: int
    uid: int
    pid: int
    models: set[int] = field(default_factory=set)
    pools: dict[int, int] = field(default_factory=dict)  # pool id -> size
    jobs: set[Job] = field(default_factory=set)


@dataclass(eq=False, slots=True)
class PrepareRecord:
    """A prepare in progress: the bytes it reads, charged to its uid until it ends."""

    prepare_id: int
    conn: int
    uid: int
    nbytes: int
    #: The preparing uid's models are BACKGROUND (their compile may be held: .load_hold).
    background: bool = False


@dataclass(eq=False, slots=True)
class ModelRecord:
    model_id: int
    conn: int
    uid: int
    grant_id: str | None
    memory_bytes: int
    inputs: frozenset[str]
    outputs: frozenset[str]
    #: The inputs' types, compiled for checking each execute (None: names only).
    check: InputCheck | None = None
    jobs: set[Job] = field(default_factory=set)
    recent: list[float] = field(default_factory=list)
    #: Median of ``recent`` in µs (None until measured).
    run_us: float | None = None
    runs: int = 0

    def note_run(self, us: float) -> None:
        recent = self.recent
        recent.append(us)
        if len(recent) > _RECENT_RUNS:
            del recent[0]
        self.run_us = sorted(recent)[len(recent) // 2]
        self.runs += 1


@dataclass(eq=False, slots=True)
class Grant:
    grant_id: str
    uid: int
    request_id: int
    models: set[int] = field(default_factory=set)
    #: The lane of the device's other host npud moved it to ("" the main one); None: here.
    moved_to: str | None = None


@dataclass
class WorkStats:
    submitted: int = 0
    completed: int = 0
    failed: int = 0
    cancelled: int = 0
    paused: int = 0
