"""The fast admission of a repeated execute request (part of
:class:`~npumanager.drivers.state.DriverState`, pure).

A stream (a burst: :mod:`npumanager.drivers.burst_fixed`) sends the same request
every time. The full path checks each one: its connection and model (revoked?),
its inputs against the model's specs, steps and feedback, attribution and the
attributed uid's priority range (the effective priority). What those checks read
changes only with events that bump the state's ``epoch`` (every event but the ones
``state._NEUTRAL`` names: executions, steps, pools, prepares, new connections,
models and grants). So after one full admission the state hands the shell a
:class:`FastKey` with what the checks found; while the epoch stands still an
execution of the same request is admitted with it, unchecked, and otherwise the
shell takes the full path again.

Everything past the checks is the full path's own code (``_admit``): the uid's job
bound, the work report and debouncing, the queue and the dispatch (effective
priority order, execution classes and reserved channels, thermal hold-back,
preemption between steps, the inline decision) decide for a fast admission exactly
as for any other.

One pass (``repeat_begin``, ``repeat_end``): most repeats of a paced FOREGROUND
stream find the device idle and continue their uid's debouncing burst, so the
dispatch has nothing to weigh and nobody is to be told. There the whole admission is
one straight line (the job made, its channel taken, its step returned) and the
step's end one call that also says whether it COMPLETED; each begins by comparing
the cheap numbers that say the straight line is what the full path would decide (the
epoch, which every revocation, thermal change, priority change and grant end bumps;
an empty queue and a free channel; a pending burst end; one step; FOREGROUND) and
falls back, having changed nothing, when one moved. What they record (work ids,
stats, the ledger, debouncing, the quiet window's arrivals, the decision log, the
instructions) is what the full path records; tests/drivers/test_state_repeat.py
holds them to it event for event.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from npumanager.drivers import events as ev
from npumanager.drivers.classes import ExecClass
from npumanager.drivers.events import JobState
from npumanager.drivers.records import ClientRecord, ModelRecord
from npumanager.drivers.runqueue import Job, RunQueue
from npumanager.errors import NpuError
from npumanager.hal.types import EndReason, WorkInfo

if TYPE_CHECKING:
    from npumanager.drivers.bounds import Ledger
    from npumanager.drivers.classes import Protection
    from npumanager.drivers.debounce import Debouncer
    from npumanager.drivers.decisions import DecisionLog
    from npumanager.drivers.load_hold import LoadHold
    from npumanager.drivers.quiet import QuietWindow
    from npumanager.drivers.records import DriverParams, WorkStats


@dataclass(eq=False, slots=True)
class FastKey:
    """What a full admission of one request found (see the module docstring)."""

    client: ClientRecord
    model: ModelRecord
    steps: int
    eff: int
    job_priority: int
    original_uid: int | None
    feature_id: int | None
    group_id: bytes | None
    exec_id: int
    #: The state's epoch when the checks ran.
    epoch: int


class FastAdmission:
    """The fast admission of DriverState."""

    if TYPE_CHECKING:  # DriverState's, declared for the type checker
        epoch: int
        params: DriverParams
        listening: bool
        protection: Protection
        quiet: QuietWindow | None
        ledger: Ledger
        stats: WorkStats
        _cutoff: int | None
        _queue: RunQueue
        _work_ids: Iterator[int]
        _seq: Iterator[int]
        _releasing: dict[int, ModelRecord]
        _log: DecisionLog
        _clients: dict[int, ClientRecord]
        _models: dict[int, ModelRecord]
        _jobs: dict[int, Job]
        _out: list[ev.Instruction]
        _ev: ev.Event | None
        _debounce: Debouncer

        def _admit(self, client: ClientRecord, model: ModelRecord, ticket: int, steps: int,
                   eff: int, job_priority: int, original_uid: int | None,
                   feature_id: int | None, group_id: bytes | None, exec_id: int,
                   now: float) -> Job: ...

        def _after_event(self, now: float) -> None: ...
        def _inline(self, job: Job) -> bool: ...
        def _dispatch(self, yielding: Job | None = None) -> None: ...
        def _on_step_finished(self, e: ev.StepFinished) -> None: ...
        def _decide(self, kind: str, key: int | str, what: str, **details: object
                    ) -> None: ...

        load_hold: LoadHold | None

    def fast_key(self, e: ev.ExecuteRequested) -> FastKey | None:
        """Right after ``handle(e)`` admitted ``e``: what its checks found, for executions
        of the same request while the epoch stands still (None: it was not admitted)."""
        job = self._jobs.get(e.ticket)
        client = self._clients.get(e.conn)
        model = self._models.get(e.model_id)
        if job is None or client is None or model is None or job.model_id != e.model_id:
            return None
        return FastKey(client, model, job.steps, job.info.effective_priority, e.job_priority,
                       e.original_uid, e.feature_id, e.group_id, e.exec_id, self.epoch)

    def completes(self, ticket: int) -> bool:
        """Whether a ``StepFinished`` of ``ticket`` without an error, if it were handled
        now, would end its job COMPLETED: the job is running its last step and nobody
        cancelled it (a cancel, a revocation or a release of its model while the step
        runs makes the step's end a cancellation). The shell answers a burst execution
        whose outputs are in place on this word before it submits that event, holding its
        lock from the question to the event so that no other event comes between."""
        job = self._jobs.get(ticket)
        return (job is not None and job.state is JobState.RUNNING
                and job.cancel_reason is None and job.step + 1 >= job.steps)

    def execute_fast(self, key: FastKey, ticket: int, stimulus_id: str, now: float
                     ) -> list[ev.Instruction] | None:
        """Admit an execution of ``key``'s request as ``ticket`` without checking the
        request again; the instructions, as ``handle`` returns them. None, having changed
        nothing: an event since the key was made may have changed what the checks find,
        so the shell submits an ``ExecuteRequested`` instead. Raises as ``handle`` does
        for the one check made here too (the uid's job bound)."""
        if key.epoch != self.epoch or ticket in self._jobs:
            return None
        out: list[ev.Instruction] = []
        self._out = out
        self._ev = ev.Event(stimulus_id=stimulus_id, now=now)
        try:
            self._admit(key.client, key.model, ticket, key.steps, key.eff, key.job_priority,
                        key.original_uid, key.feature_id, key.group_id, key.exec_id, now)
            self._after_event(now)
        finally:
            self._ev = None
        return out

    # --- one pass ------------------------------------------------------------------

    def repeat_begin(self, key: FastKey, ticket: int, stimulus_id: str, now: float
                     ) -> ev.RunStep | None:
        """Admit an execution of ``key``'s request as ``ticket`` and start it on a free
        channel in one pass, where that is what ``execute_fast`` would decide and it would
        tell the shell nothing but the step (see the module docstring); the step, which
        the shell runs itself. None, having changed nothing: the shell takes
        ``execute_fast``. Raises as ``handle`` does for the uid's job bound."""
        queue = self._queue
        eff = key.eff
        cutoff = self._cutoff
        if (key.epoch != self.epoch or key.steps != 1 or not queue.starts_now()
                or self.load_hold is not None or ticket in self._jobs
                or eff > self.protection.foreground_priority  # (BACKGROUND: the full path)
                or (cutoff is not None and eff > cutoff)):
            return None
        client, model = key.client, key.model
        uid = client.uid
        listening = self.listening
        debounce = self._debounce
        # Its requested and started would be reported: the full path says so.
        if listening and not debounce.continues(uid):
            return None
        self.ledger.check_job(uid, len(client.jobs))
        # Admitted: nothing below raises. As ``_admit``, then ``_dispatch`` taking it.
        self._ev = ev.Event(stimulus_id=stimulus_id, now=now)
        try:
            self.ledger.add_job(uid)
            info = WorkInfo(next(self._work_ids), key.group_id, uid, client.pid,
                            uid if key.original_uid is None else key.original_uid,
                            key.feature_id, key.job_priority, eff, int(now * 1000),
                            self.params.device_number)
            model_id = model.model_id
            job = Job(ticket, info, client.conn, model_id, key.exec_id, 1, next(self._seq),
                      cls=_FOREGROUND)
            self._jobs[ticket] = job
            quiet = self.quiet
            if quiet is not None:
                quiet.arrived((client.conn, model_id), now)
            client.jobs.add(job)
            model.jobs.add(job)
            self.stats.submitted += 1
            job.reported = debounce.begin(uid) and listening  # (False when listening)
            self._decide("work", info.id, "admitted", model=model_id, eff=eff, steps=1)
            channel = queue.start(job)
            if quiet is not None and (quiet.paced() or quiet.holding):
                # (the dispatch's gate, with nothing but this job to weigh: nothing held,
                # no timer to arm)
                quiet.wake_at, quiet.holding = None, False
            # A debounce end may only have been dropped: no earlier deadline to arm for.
            return ev.RunStep(ticket, 0, True, self._inline(job), channel, info.id, False,
                              eff, False)
        finally:
            self._ev = None

    def repeat_end(self, ticket: int, run_us: float, stimulus_id: str, now: float
                   ) -> list[ev.Instruction] | None:
        """The end of ``ticket``'s running step, without an error, when it ends the job
        COMPLETED (``completes``): recorded by the ``StepFinished`` handler itself (the
        state's own rules, none copied), in one call with the check, and the
        instructions, as ``handle`` returns them. None, having changed nothing: it would
        not end COMPLETED (cancelled, revoked, more steps to run); the shell submits the
        ``StepFinished``."""
        if not self.completes(ticket):
            return None
        e = ev.StepFinished(stimulus_id=stimulus_id, now=now, ticket=ticket, run_us=run_us,
                            error=None)
        out: list[ev.Instruction] = []
        self._out = out
        self._ev = e
        try:
            # As ``handle`` (a StepFinished leaves the epoch alone).
            self._on_step_finished(e)
            self._after_event(now)
        finally:
            self._ev = None
        return out

    def rehearse(self, key: FastKey, now: float) -> bool:
        """Read what ``repeat_begin`` and ``repeat_end`` of ``key``'s request would read
        and write, in their order, building the objects they build and keeping none:
        changes nothing (no work id, no count, no decision, no instruction). Anticipation
        runs it just before a paced stream's request is due (drivers/anticipate.py), so
        that the state's tables, records and code are in the caches and the TLB when the
        request comes: on this VM the one pass takes ~100 µs after a 33 ms sleep and a
        fraction of that hot. True: the request would take the one pass now."""
        queue = self._queue
        eff = key.eff
        if (key.epoch != self.epoch or key.steps != 1 or not queue.starts_now()
                or self.load_hold is not None or eff > self.protection.foreground_priority):
            return False
        client, model = key.client, key.model
        uid = client.uid
        debounce = self._debounce
        if self.listening and not debounce.continues(uid):
            return False
        try:
            self.ledger.check_job(uid, len(client.jobs))
        except NpuError:
            return False
        model_id = model.model_id
        info = WorkInfo(0, key.group_id, uid, client.pid,
                        uid if key.original_uid is None else key.original_uid,
                        key.feature_id, key.job_priority, eff, int(now * 1000),
                        self.params.device_number)
        job = Job(0, info, client.conn, model_id, key.exec_id, 1, 0, cls=_FOREGROUND)
        quiet = self.quiet
        if quiet is not None:
            quiet.streams.get((client.conn, model_id))
            quiet.paced()
        _ = (job in client.jobs, job in model.jobs, self.stats.submitted, 0 in self._jobs,
             len(self._log), queue.running.get(0))
        self._inline(job)
        ev.RunStep(0, 0, True, False, 0, 0, False, eff, False)
        # The end: the model's run times, the debounce burst, the job's end.
        self._models.get(model_id)
        model.run_us  # noqa: B018
        self._queue.foreground_streams()
        ev.FinishJob(0, 0, EndReason.COMPLETED, 1, None, None)
        self._debounce.next_deadline()
        return True


_FOREGROUND = ExecClass.FOREGROUND
_RUNNING = JobState.RUNNING
