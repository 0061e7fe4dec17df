"""The driver's work scheduler: channels, effective priority, pause/resume, debounce.

A synchronous state machine with no I/O and no clock reads of its own: the
host calls it on its event loop, passing a :class:`Clock`; it tells the host
what to do through a :class:`SchedulerSink` (start a step on a channel,
finish a job, emit a lifecycle event). Tests drive it on a virtual clock and
finish steps by hand.

Rules (ARCHITECTURE "The HAL and the driver"):
- effective priority = app priority of the attributed uid + the job priority
  clamped into that uid's [min, max]; lower runs first, FIFO on ties;
- a multi-step job gives its channel back after every step and re-enters the
  queue with its original position, so more important queued work takes the
  channel (the job is PAUSED, later RESUMED);
- at thermal CRITICAL and above, work with effective priority above the
  cutoff is held back (stays queued; multi-step jobs pause between steps);
- debouncing as AOSP: the end of a uid's burst of work is reported once, one
  debounce window after its last work ended (with that work's info); a
  request inside the window continues the burst and its requested/started
  are suppressed. With a window of 0 every work item reports its own end.
  An end carries the time its work ended (not the time it was reported).
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, replace
from typing import Any, Protocol

from npumanager.clock import Clock
from npumanager.constants import ThermalStatus
from npumanager.errors import AttributionDenied, DirectAccessDenied
from npumanager.hal.types import (
    DEBOUNCE_DURATION_MS,
    EndReason,
    SchedulingConfig,
    StartReason,
    WorkInfo,
    default_config,
    validate_configs,
)

QUEUED, RUNNING, DONE = "queued", "running", "done"


@dataclass(eq=False)
class Job:
    """One work item: an execution of ``steps`` steps."""

    info: WorkInfo
    steps: int
    seq: int
    payload: Any = None
    state: str = QUEUED
    step: int = 0
    channel: int | None = None
    started: bool = False
    paused: bool = False
    #: False when its requested/started were folded into the uid's burst.
    reported: bool = True
    cancel_reason: EndReason | None = None
    error: BaseException | None = None
    end_reason: EndReason | None = None

    @property
    def id(self) -> int:
        return self.info.id

    def __repr__(self) -> str:
        return (f"<Job {self.info.id} uid={self.info.uid} eff={self.info.effective_priority} "
                f"{self.state} step {self.step}/{self.steps}>")


class SchedulerSink(Protocol):
    def run_step(self, job: Job, channel: int) -> None:
        """Start step ``job.step`` of ``job`` on ``channel``; call ``step_done`` later."""
        ...

    def abort_step(self, job: Job) -> None:
        """Best effort: end the running step early (cancel, revoke)."""
        ...

    def job_finished(self, job: Job) -> None:
        """The job is over: ``job.end_reason`` and ``job.error`` say how."""
        ...

    def work_event(self, kind: str, info: WorkInfo, reason: int) -> None:
        """A lifecycle event for the callback: kind is requested, started or ended."""
        ...


@dataclass
class _PendingEnd:
    info: WorkInfo
    reason: EndReason
    deadline: float


@dataclass
class _Burst:
    active: int = 0
    last_info: WorkInfo | None = None
    last_reason: EndReason = EndReason.COMPLETED
    pending: _PendingEnd | None = None


@dataclass
class SchedulerStats:
    submitted: int = 0
    completed: int = 0
    failed: int = 0
    cancelled: int = 0
    paused: int = 0


class Scheduler:
    def __init__(
        self,
        channels: int,
        clock: Clock,
        sink: SchedulerSink,
        *,
        device_number: int = 0,
        thermal_cutoff: int = 500,
        debounce_ms: int = DEBOUNCE_DURATION_MS,
    ) -> None:
        if channels < 1:
            raise ValueError("a driver needs at least one channel")
        self.channels = channels
        self.clock = clock
        self.sink = sink
        self.device_number = device_number
        self.thermal_cutoff = thermal_cutoff
        self.debounce_ms = debounce_ms
        self.thermal = ThermalStatus.NONE
        #: False while no callback is registered (the host says so): events are dropped.
        self.events_enabled = True
        self.configs: dict[int, SchedulingConfig] = {}
        self.stats = SchedulerStats()
        self._ids = itertools.count(1)
        self._seq = itertools.count()
        self._queue: list[tuple[int, int, Job]] = []  # (effective priority, seq, job)
        self._free = list(range(channels))
        self._running: dict[int, Job] = {}  # channel -> job
        self._bursts: dict[int, _Burst] = {}

    def __repr__(self) -> str:
        held = sum(1 for _, _, j in self._queue if not self._dispatchable(j))
        return (f"<Scheduler {len(self._running)}/{self.channels} channels busy | "
                f"{len(self._queue)} queued ({held} held back) | thermal={self.thermal.name} | "
                f"{len(self.configs)} configs>")

    # --- IScheduling ---------------------------------------------------------

    def set_configs(self, configs: list[SchedulingConfig]) -> None:
        validate_configs(configs)
        self.configs = {c.uid: c for c in configs}

    def update_configs(self, configs: list[SchedulingConfig]) -> None:
        validate_configs(configs)
        for c in configs:
            self.configs[c.uid] = c

    def config(self, uid: int) -> SchedulingConfig:
        return self.configs.get(uid) or default_config(uid)

    def set_thermal(self, status: ThermalStatus) -> None:
        self.thermal = status
        self._dispatch()

    def set_debounce_ms(self, ms: int) -> None:
        self.debounce_ms = max(0, int(ms))

    # --- work ------------------------------------------------------------------

    def now_ms(self) -> int:
        return int(self.clock.now() * 1000)

    def effective_priority(self, uid: int, original_uid: int | None, job_priority: int) -> int:
        """Check access and attribution; the attributed uid's app priority + clamped job."""
        cfg = self.config(uid)
        if not cfg.has_direct_access:
            raise DirectAccessDenied(f"uid {uid} has no direct access to this device")
        attributed = cfg
        if original_uid is not None and original_uid != uid:
            if not cfg.can_attribute_other_uid:
                raise AttributionDenied(
                    f"uid {uid} may not attribute work to uid {original_uid}"
                )
            attributed = self.config(original_uid)
        return attributed.app_priority + attributed.clamp(job_priority)

    def submit(
        self,
        *,
        uid: int,
        pid: int = 0,
        original_uid: int | None = None,
        feature_id: int | None = None,
        job_priority: int = 0,
        steps: int = 1,
        group_id: bytes | None = None,
        payload: Any = None,
    ) -> Job:
        """Admit a job (raises DirectAccessDenied / AttributionDenied) and queue it."""
        eff = self.effective_priority(uid, original_uid, job_priority)
        info = WorkInfo(
            id=next(self._ids),
            group_id=group_id,
            uid=uid,
            debug_pid=pid,
            original_uid=uid if original_uid is None else original_uid,
            debug_feature_id=feature_id,
            job_priority=job_priority,
            effective_priority=eff,
            timestamp_ms=self.now_ms(),
            device_number=self.device_number,
        )
        job = Job(info=info, steps=max(1, steps), seq=next(self._seq), payload=payload)
        self.stats.submitted += 1
        burst = self._bursts.setdefault(uid, _Burst())
        if burst.pending is not None:
            # The uid is debouncing: this work continues its burst without new events.
            burst.pending = None
            job.reported = False
        burst.active += 1
        if job.reported:
            self.sink.work_event("requested", info, 0)
        heapq.heappush(self._queue, (eff, job.seq, job))
        self._dispatch()
        return job

    def step_done(self, job: Job, error: BaseException | None = None) -> None:
        """The host reports the end of the running step (with the backend's error, if any)."""
        if job.state != RUNNING or job.channel is None:
            return
        self._running.pop(job.channel, None)
        self._free.append(job.channel)
        job.channel = None
        job.step += 1
        if job.cancel_reason is not None:
            self._finish(job, job.cancel_reason)
        elif error is not None:
            job.error = error
            self._finish(job, EndReason.FAILED)
        elif job.step >= job.steps:
            self._finish(job, EndReason.COMPLETED)
        else:
            job.state = QUEUED
            heapq.heappush(self._queue, (job.info.effective_priority, job.seq, job))
            self._dispatch(yielding=job)
            return
        self._dispatch()

    def cancel(self, job: Job, reason: EndReason) -> None:
        """Cancel a queued or running job; a running step ends first (aborted if it can be)."""
        if job.state == DONE:
            return
        if job.state == QUEUED:
            self._queue = [e for e in self._queue if e[2] is not job]
            heapq.heapify(self._queue)
            self._finish(job, reason)
            self._dispatch()
        elif job.cancel_reason is None:
            job.cancel_reason = reason
            self.sink.abort_step(job)

    def alone(self, job: Job) -> bool:
        """Whether ``job`` is the only work on the device (running, nothing queued)."""
        return not self._queue and len(self._running) == 1 and job.state == RUNNING

    def jobs(self) -> list[Job]:
        return [j for _, _, j in self._queue] + list(self._running.values())

    # --- timers ----------------------------------------------------------------

    def next_deadline(self) -> float | None:
        ds = [b.pending.deadline for b in self._bursts.values() if b.pending is not None]
        return min(ds) if ds else None

    def fire_due(self) -> None:
        """Report the burst ends whose debounce window has passed."""
        now = self.clock.now()
        for uid, burst in list(self._bursts.items()):
            p = burst.pending
            if p is not None and p.deadline <= now:
                burst.pending = None
                self.sink.work_event("ended", p.info, int(p.reason))
                if burst.active == 0:
                    del self._bursts[uid]

    # --- internals ---------------------------------------------------------------

    def _dispatchable(self, job: Job) -> bool:
        held = (self.thermal >= ThermalStatus.CRITICAL
                and job.info.effective_priority > self.thermal_cutoff)
        return not held

    def _stamp(self, job: Job) -> WorkInfo:
        if not self.events_enabled:
            return job.info  # nobody listens: skip the copy on the hot path
        return replace(job.info, timestamp_ms=self.now_ms())

    def _dispatch(self, yielding: Job | None = None) -> None:
        chosen: list[Job] = []
        if self._free and self._queue:
            held: list[tuple[int, int, Job]] = []
            while self._queue and len(chosen) < len(self._free):
                entry = heapq.heappop(self._queue)
                if self._dispatchable(entry[2]):
                    chosen.append(entry[2])
                else:
                    held.append(entry)
            for entry in held:
                heapq.heappush(self._queue, entry)
        if yielding is not None and yielding not in chosen and yielding.state == QUEUED:
            yielding.paused = True
            self.stats.paused += 1
            self.sink.work_event("ended", self._stamp(yielding), int(EndReason.PAUSED))
        for job in chosen:
            channel = self._free.pop(0)
            job.state = RUNNING
            job.channel = channel
            self._running[channel] = job
            if job.paused:
                job.paused = False
                self.sink.work_event("started", self._stamp(job), int(StartReason.RESUMED))
            elif not job.started and job.reported:
                self.sink.work_event("started", self._stamp(job), int(StartReason.INITIAL))
            job.started = True
            self.sink.run_step(job, channel)

    def _finish(self, job: Job, reason: EndReason) -> None:
        job.state = DONE
        job.end_reason = reason
        if reason == EndReason.COMPLETED:
            self.stats.completed += 1
        elif reason == EndReason.FAILED:
            self.stats.failed += 1
        else:
            self.stats.cancelled += 1
        uid = job.info.uid
        burst = self._bursts.setdefault(uid, _Burst(active=1))
        burst.active -= 1
        if not self.events_enabled:
            # Nobody listens: no burst to debounce (and no timer for the host to arm).
            if burst.active <= 0:
                del self._bursts[uid]
            self.sink.job_finished(job)
            return
        burst.last_info = self._stamp(job)
        burst.last_reason = reason
        if self.debounce_ms <= 0:
            # No debouncing: every work item reports its own end at once.
            self.sink.work_event("ended", burst.last_info, int(reason))
            if burst.active <= 0:
                del self._bursts[uid]
        elif burst.active <= 0:
            burst.active = 0
            burst.pending = _PendingEnd(
                burst.last_info, reason, self.clock.now() + self.debounce_ms / 1000.0
            )
        self.sink.job_finished(job)

