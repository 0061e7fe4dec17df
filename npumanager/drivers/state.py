"""DriverState: the driver host's decisions as a pure, synchronous state machine.

``handle(event) -> list[Instruction]`` (types in :mod:`.events`). No I/O and no
clock reads: time is ``event.now``. Prepared models, tensors, shared memory
and replies live in the shell (:class:`~npumanager.drivers.host.DriverHost`),
which refers to them by the ids this state hands out.

What it owns, and how it decides (ARCHITECTURE "The HAL and the driver"):

* Scheduling (:mod:`.runqueue`): effective priority = app priority of the
  attributed uid + the job priority clamped into that uid's [min, max]; lower
  runs first, FIFO on ties. Work is refused for a uid without direct access
  and for attribution to another uid without the right.
* Multi-step jobs give their channel back after every step and re-enter the
  queue behind the work of equal effective priority waiting then (round
  robin: nobody waits behind an equal's endless job) but ahead of less
  important work; queued work that takes the channel PAUSEs the job, later it
  is RESUMED. A step is never interrupted by other work; a cancelled job's
  running step is asked to abort. A job asks for at most ``max_steps`` steps.
* Execution classes (:mod:`.classes`): a job's effective priority makes it
  FOREGROUND or BACKGROUND; background work never takes the channels kept
  for foreground work, and its steps run on background threads (the shell).
* Thermal hold-back: from CRITICAL, work whose effective priority lies above
  the cutoff stays queued (multi-step jobs pause between steps).
* Lifecycle reports with AOSP's debouncing per uid (:mod:`.debounce`), only
  while a callback listens; timestamps are the host's monotonic ms.
* The inline fast path: a step of a model whose median step time is below
  ``inline_run_us`` (or below ``inline_idle_run_us`` for a single-step job
  alone on the device) is run inline on the event loop — as an instruction
  the shell carries out after ``handle`` returns, never by calling back in.
* Enforced admission (:mod:`.state_models`): grants npud issued, models prepared under them, and
  their release when a grant ends (revoked work ends CANCELLED_SYSTEM and its
  client learns why; a later call on the model says why too: tombstones). A
  connection uses only the models it prepared and the pools it registered;
  another connection's ids get the same answer as ids that never existed.
* Bounds per uid and per connection (:mod:`.bounds`): jobs, models, model
  bytes, bytes being read by prepares, pools and their bytes: LimitExceeded.
* The manager link (:mod:`.state_models`): once npud has attached and then gone away, nothing new is
  loaded (NoManagerAttached) and after ``orphan_grace_s`` every model is
  released, unless a manager attaches again first.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

from npumanager.constants import ThermalStatus
from npumanager.drivers import events as ev
from npumanager.drivers.admission import Grants
from npumanager.drivers.bounds import Holdings, Ledger
from npumanager.drivers.classes import ExecClass, Protection
from npumanager.drivers.configs import SchedulingConfigs
from npumanager.drivers.debounce import Debouncer
from npumanager.drivers.decisions import DecisionLog
from npumanager.drivers.events import JobState, WorkKind
from npumanager.drivers.load_hold import LOAD_TIMER, LoadHold, LoadHoldRules
from npumanager.drivers.quiet import QuietWindow
from npumanager.drivers.records import (
    ClientRecord,
    DriverParams,
    GrantCheck,
    ModelRecord,
    PrepareRecord,
    WorkStats,
)
from npumanager.drivers.runqueue import Job, RunQueue
from npumanager.drivers.share import BackgroundShare
from npumanager.drivers.state_models import ORPHAN_TIMER, ModelRules
from npumanager.drivers.state_repeat import RepeatPath
from npumanager.drivers.state_work import WorkRules
from npumanager.errors import GrantRevoked, InvalidArgument, NpuError
from npumanager.hal.exec_class import model_class
from npumanager.hal.types import (
    DEBOUNCE_DURATION_MS,
    EndReason,
    SchedulingConfig,
    StartReason,
)

__all__ = ["ORPHAN_TIMER", "DriverParams", "DriverState", "GrantCheck"]

DEBOUNCE_TIMER = "debounce"
QUIET_TIMER = "quiet"
#: Timers that change nothing an execute request's checks read (see ``_NEUTRAL``).
_NEUTRAL_TIMERS = frozenset({DEBOUNCE_TIMER, QUIET_TIMER, LOAD_TIMER})
_QUEUED, _PAUSED = JobState.QUEUED, JobState.PAUSED
_STARTED, _ENDED = WorkKind.STARTED, WorkKind.ENDED
#: Events that change nothing an execute request's checks read (its connection and
#: model, the model's specs, the attributed uid's priority range, thermal status and
#: the manager link are untouched; queue, channels, bounds and debouncing are not
#: checked but decided afresh on every admission): they leave ``epoch`` alone. Every
#: other event bumps it, a debounce timer excepted.
_NEUTRAL = frozenset({ev.ExecuteRequested, ev.StepFinished, ev.PoolRegistered,
                      ev.PoolUnregistered, ev.PrepareBegun, ev.PrepareEnded,
                      ev.ClientConnected, ev.ModelPrepared, ev.GrantIssued,
                      ev.GrantMoved})


class DriverState(ModelRules, RepeatPath, LoadHoldRules, WorkRules):
    """The driver host's whole state; see the module docstring for the rules (grants,
    prepares, models and the manager link: :class:`~.state_models.ModelRules`; a job's
    admission, steps and end: :class:`~.state_work.WorkRules`)."""

    def __init__(self, params: DriverParams | None = None) -> None:
        self.params = p = params or DriverParams()
        self.enforce_admission = p.enforce_admission
        self.thermal = ThermalStatus.NONE
        self.listening = False
        self.manager_attached = False
        #: When the manager that had attached went away (None: attached, or never was).
        self.orphaned_at: float | None = None
        self.scheduling = SchedulingConfigs()
        self.stats = WorkStats()
        self.protection = Protection(p.foreground_priority, p.reserved_channels)
        self._queue = RunQueue(p.channels, self.protection.reserved(p.channels), p.background_lanes)
        self._debounce = Debouncer(DEBOUNCE_DURATION_MS)
        self._clients: dict[int, ClientRecord] = {}
        self._models: dict[int, ModelRecord] = {}
        #: model id -> the lane of the host its grant moved to ("" the main one): its
        #: answers say so (the host reads it without the lock: one dict lookup).
        self.moved: dict[int, str] = {}
        #: Models dropped while a step of theirs still runs: released when it ends.
        self._releasing: dict[int, ModelRecord] = {}
        self.grants = Grants(p.name, p.tombstones)
        self._prepares: dict[int, PrepareRecord] = {}
        #: What each uid holds, against the bounds.
        self.ledger = Ledger(p.limits, p.name)
        self._jobs: dict[int, Job] = {}  # ticket -> job
        self._work_ids = itertools.count(1)
        self._model_ids = itertools.count(1)
        self._pool_ids = itertools.count(1)
        self._seq = itertools.count()
        self._cutoff: int | None = None  # effective priorities above it are held back
        self._timer_at: float | None = None
        #: The quiet window around paced foreground frames (.quiet; None: off) and when
        #: its timer is armed to look at held background work again.
        self.quiet = (QuietWindow(p.quiet_window_us / 1e6, p.quiet_tail_us / 1e6)
                      if p.quiet_window_us > 0 else None)
        self._quiet_at: float | None = None
        #: Background compiles stopped around the same frames (.load_hold).
        self.load_hold = LoadHold(self.quiet) if self.quiet and p.hold_loads else None
        #: Fair share among background uids (.share; None: off).
        self.share = BackgroundShare() if p.background_share else None
        self._log = DecisionLog(p.decision_log_size)
        self._out: list[ev.Instruction] = []
        self._ev: ev.Event | None = None
        #: Bumped by every event that can change what an execute request's checks find
        #: (see ``_NEUTRAL``): the fast admission of :mod:`.state_fast` holds only while
        #: it stands still.
        self.epoch = 0
        self._handlers: dict[type, Callable[[Any], None]] = {
            ev.ClientConnected: self._on_connected,
            ev.ClientGone: self._on_gone,
            ev.ConfigsSet: self._on_configs,
            ev.CallbackSet: self._on_callback,
            ev.ManagerAttached: self._on_manager_attached,
            ev.ManagerGone: self._on_manager_gone,
            ev.LauncherGone: self._on_launcher_gone,
            ev.GrantIssued: self._on_grant_issued,
            ev.GrantEnded: self._on_grant_ended,
            ev.GrantMoved: self._on_grant_moved,
            ev.PrepareBegun: self._on_prepare_begun,
            ev.PrepareEnded: self._on_prepare_ended,
            ev.ThermalSet: self._on_thermal,
            ev.ModelPrepared: self._on_model_prepared,
            ev.ModelReleased: self._on_model_released,
            ev.PoolRegistered: self._on_pool_registered,
            ev.PoolUnregistered: self._on_pool_unregistered,
            ev.ExecuteRequested: self._on_execute,
            ev.CancelRequested: self._on_cancel,
            ev.StepFinished: self._on_step_finished,
            ev.TimerFired: self._on_timer,
        }

    # --- the one entry point ------------------------------------------------------

    def handle(self, event: ev.Event) -> list[ev.Instruction]:
        """Apply ``event``; return what the shell must do, in order. Raises an
        ``npumanager.errors`` exception, having changed nothing, for a bad event."""
        out: list[ev.Instruction] = []
        self._out = out
        self._ev = event
        kind = type(event)
        if kind not in _NEUTRAL and (kind is not ev.TimerFired
                                     or event.key not in _NEUTRAL_TIMERS):  # type: ignore[attr-defined]
            self.epoch += 1  # what a fast admission found may not hold any more
        try:
            self._handlers[kind](event)
            self._after_event(event.now)
        finally:
            self._ev = None
        return out

    # --- public reads ---------------------------------------------------------------

    @property
    def configs(self) -> dict[int, SchedulingConfig]:
        """npud's scheduling configs by uid (uids without one get the default)."""
        return self.scheduling.by_uid

    def config(self, uid: int) -> SchedulingConfig:
        return self.scheduling.of(uid)

    def effective_priority(self, uid: int, original_uid: int | None, job_priority: int) -> int:
        """Check access and attribution; the attributed uid's app priority + clamped job."""
        return self.scheduling.effective_priority(uid, original_uid, job_priority)

    def model_class(self, uid: int) -> ExecClass:
        """The class a model prepared by ``uid`` is compiled in (its session's threads,
        the compile's thread): its app priority with job priority 0."""
        return model_class(self.config(uid), self.protection.foreground_priority)

    def check_grant(self, grant_id: str, uid: int) -> GrantCheck:
        """May ``uid`` prepare a model under ``grant_id`` now? Raises GrantRequired
        (enforced and none named, or another uid's) or GrantRevoked (it ended)."""
        return self.grants.check(grant_id, uid, self.enforce_admission)

    def load(self) -> tuple[int, int, int]:
        """(channels, channels busy, jobs queued)."""
        q = self._queue
        return q.channels, len(q.running), len(q)

    def job_state(self, ticket: int) -> JobState | None:
        job = self._jobs.get(ticket)
        return None if job is None else job.state

    def jobs(self) -> list[Job]:
        return list(self._jobs.values())

    def holdings(self, uid: int) -> Holdings:
        """What ``uid`` holds now (a copy)."""
        return self.ledger.of(uid)

    def check_owns_model(self, conn: int, model_id: int) -> None:
        """``model_id`` is a live model prepared on connection ``conn``, else what an
        execute of it raises: GrantRevoked (with why) when a grant's end dropped it."""
        model = self._models.get(model_id)
        if model is None or model.conn != conn:
            raise self._not_owned(conn, model_id)

    def _not_owned(self, conn: int, model_id: int) -> NpuError:
        why = self.grants.revoked(model_id, conn)
        if why is not None:
            return GrantRevoked(why)
        return InvalidArgument(f"no prepared model {model_id} on this connection")

    def model_ids(self) -> list[int]:
        return sorted(self._models)

    def grant_ids(self) -> list[str]:
        return sorted(self.grants.live)

    def held_grants(self) -> list[tuple[str, int, int, int, int]]:
        """(grant_id, uid, request_id, memory bytes, models) of every live grant: what a
        newly attached npud adopts."""
        return self.grants.held({m: r.memory_bytes for m, r in self._models.items()})

    def story(self, work_id: int | None = None, *, model_id: int | None = None,
              grant_id: str | None = None) -> list[ev.Decision]:
        """What happened to one work item, model or grant (as far as the log reaches)."""
        return self._log.story(work_id, model_id=model_id, grant_id=grant_id)

    def decisions(self) -> list[ev.Decision]:
        return self._log.all()

    def validate(self) -> None:
        """Check every invariant (tests call it after each step); AssertionError if broken."""
        from npumanager.drivers.state_checks import validate_driver_state

        validate_driver_state(self)

    def __repr__(self) -> str:
        q = self._queue
        return (f"<DriverState {self.params.name}: {len(q.running)}/{q.channels} channels busy"
                f" | {len(q)} queued ({q.held_count(self._cutoff)} held back) | "
                f"{len(self._models)} models, {len(self.grants.live)} grants | "
                f"thermal={self.thermal.name} | callback {'on' if self.listening else 'off'}>")

    # --- connections, configs, callback, manager ---------------------------------------

    def _on_connected(self, e: ev.ClientConnected) -> None:
        if e.conn in self._clients:
            raise InvalidArgument(f"connection {e.conn} is already known")
        self._clients[e.conn] = ClientRecord(e.conn, e.uid, e.pid)

    def _on_gone(self, e: ev.ClientGone) -> None:
        client = self._clients.pop(e.conn, None)
        if client is None:
            return
        for job in sorted(client.jobs, key=lambda j: j.info.id):
            self._cancel(job, EndReason.CANCELLED_USER)
        for model_id in sorted(client.models):
            self._drop_model(self._models[model_id], None)
        for pool_id in sorted(client.pools):
            self._close_pool(client, pool_id)

    def _on_configs(self, e: ev.ConfigsSet) -> None:
        self.scheduling.set(e.configs, e.replace)

    def _on_callback(self, e: ev.CallbackSet) -> None:
        self.listening = e.listening
        if e.listening:
            self._debounce.set_window(e.debounce_ms)
        else:
            self._debounce.drop_pending()

    # --- pools ----------------------------------------------------------------------------

    def _on_pool_registered(self, e: ev.PoolRegistered) -> None:
        client = self._client(e.conn)
        if e.size <= 0:
            raise InvalidArgument(f"a pool needs a positive size, not {e.size}")
        self.ledger.check_pool(client.uid, len(client.pools), e.size)
        self.ledger.add_pool(client.uid, e.size)
        pool_id = next(self._pool_ids)
        client.pools[pool_id] = e.size
        self._out.append(ev.PoolReady(e.conn, pool_id))

    def _on_pool_unregistered(self, e: ev.PoolUnregistered) -> None:
        client = self._clients.get(e.conn)
        if client is not None and e.pool_id in client.pools:
            self._close_pool(client, e.pool_id)

    def _close_pool(self, client: ClientRecord, pool_id: int) -> None:
        self.ledger.drop_pool(client.uid, client.pools.pop(pool_id))
        self._out.append(ev.ClosePool(pool_id))

    # --- thermal, timers -------------------------------------------------------------------

    def _on_thermal(self, e: ev.ThermalSet) -> None:
        self.thermal = e.status
        self._cutoff = (self.params.thermal_cutoff if e.status >= ThermalStatus.CRITICAL
                        else None)
        self._dispatch()

    def _on_timer(self, e: ev.TimerFired) -> None:
        if e.key == ORPHAN_TIMER:
            if self.orphaned_at is not None:
                self._orphan_grace_over()
            return
        if e.key == QUIET_TIMER:
            self._quiet_at = None
            self._dispatch()
            return
        if e.key == LOAD_TIMER:
            self._load_at = None  # (handle() decides the hold after every event)
            return
        if e.key != DEBOUNCE_TIMER:
            return
        self._timer_at = None
        for info, reason in self._debounce.due(e.now):
            self._out.append(ev.ReportWork(_ENDED, info, int(reason)))

    def quiet_hold_end(self, now: float, run_s: float) -> float | None:
        """None: background work of ``run_s`` may start at ``now`` as far as the quiet
        window says (:mod:`.quiet`; off, or no stream paced: None); else when to ask
        again (the host's freeing of released models, :mod:`.quiet_release`)."""
        quiet = self.quiet
        if quiet is None or not quiet.paced():
            return None
        return quiet.hold_end(now, run_s, self._queue.foreground_streams())

    # --- internals ------------------------------------------------------------------------

    def _dispatch(self, yielding: Job | None = None) -> None:
        out = self._out
        quiet = self.quiet
        if quiet is not None and (quiet.paced() or quiet.holding):
            chosen = self._queue.take(self._cutoff, self._quiet_gate(quiet))
            at = quiet.wake_at
            if at is not None and at != self._quiet_at:
                self._quiet_at = at  # held background work is looked at again then
                out.append(ev.ArmTimer(QUIET_TIMER, at))
        else:
            chosen = self._queue.take(self._cutoff)
        if yielding is not None and yielding.state is _QUEUED:
            yielding.state = _PAUSED
            self.stats.paused += 1
            self._decide("work", yielding.info.id, "paused", step=yielding.step)
            if self.listening:
                out.append(ev.ReportWork(_ENDED, self._stamp(yielding.info),
                                         int(EndReason.PAUSED)))
        for job, was in chosen:
            if job is yielding:
                pass  # it keeps its channel: no lifecycle event
            elif was is _PAUSED:
                self._decide("work", job.info.id, "resumed", step=job.step)
                if self.listening:
                    out.append(ev.ReportWork(_STARTED, self._stamp(job.info),
                                             int(StartReason.RESUMED)))
            elif job.reported and self.listening:
                out.append(ev.ReportWork(_STARTED, self._stamp(job.info),
                                         int(StartReason.INITIAL)))
            bg = job.cls is ExecClass.BACKGROUND
            out.append(ev.RunStep(job.ticket, job.step, job.step + 1 >= job.steps,
                                  self._inline(job), job.channel or 0, job.info.id, bg,
                                  job.info.effective_priority,
                                  bg and self.share is not None and self.share.yields(
                                      job.info.uid, self._ev.now,  # type: ignore[union-attr]
                                      self._queue.background_uids()), job.lane if bg else None))

    def _quiet_gate(self, quiet: QuietWindow) -> Callable[[Job], bool]:
        """The run queue's predicate: must this background job wait for a paced
        foreground frame (.quiet)? Its expected step time is its model's median."""
        e = self._ev
        assert e is not None
        now, models = e.now, self._models
        running = self._queue.foreground_streams()  # about to run, or running
        quiet.wake_at, quiet.holding = None, False

        def held(job: Job) -> bool:
            model = models.get(job.model_id)
            run_us = model.run_us if model is not None else None
            return quiet.held(now, (run_us or 0.0) / 1e6, running)

        return held

    def _inline(self, job: Job) -> bool:
        model = self._models.get(job.model_id)
        if model is None or model.run_us is None or model.runs < 3:
            return False
        run_us, p = model.run_us, self.params
        if run_us < p.inline_run_us:
            return True
        if job.cls is ExecClass.BACKGROUND and p.background_threads:
            # A medium background step on the event loop would run at the loop's normal
            # priority and delay every call behind it: it goes to a background thread.
            return False
        # Alone on the device, a medium single-step job runs inline too: the loop is
        # blocked for that one run (work arriving meanwhile waits no longer than it would
        # for a busy channel). Never multi-step jobs: their steps must stay preemptible.
        return job.steps == 1 and run_us < p.inline_idle_run_us and self._queue.alone(job)

    def _after_event(self, now: float) -> None:
        """How every event ends (``handle``, the fast paths): debounce timer, load hold."""
        if self._debounce.next_deadline() is not None:
            self._sync_timer()
        if self.load_hold is not None:
            self._sync_load_hold(now)

    def _sync_timer(self) -> None:
        """Keep one timer at or before the earliest debounce deadline. A timer armed no
        later than it is kept: it fires, reports what is due and re-arms, so a stream of
        work arms about one timer per window, not one per execution."""
        deadline = self._debounce.next_deadline()
        if deadline is None or (self._timer_at is not None and self._timer_at <= deadline):
            return
        self._timer_at = deadline
        self._out.append(ev.ArmTimer(DEBOUNCE_TIMER, deadline))

    def _client(self, conn: int) -> ClientRecord:
        client = self._clients.get(conn)
        if client is None:
            raise InvalidArgument(f"connection {conn} is not known (it closed)")
        return client

    def _decide(self, kind: str, key: int | str, what: str, **details: object) -> None:
        e = self._ev
        assert e is not None
        self._log.record(e, kind, key, what, details)
