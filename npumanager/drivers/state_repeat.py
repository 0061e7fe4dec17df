"""The one pass of a repeated request (part of
:class:`~npumanager.drivers.state.DriverState`, pure): ``repeat_begin``,
``repeat_end``, and anticipation's ``rehearse`` of both.

Most repeats of a paced FOREGROUND stream (a burst: :mod:`.burst_fixed`, admitted
before: :mod:`.state_fast`'s ``FastKey``) find the device idle and continue their
uid's debouncing burst, so the dispatch has nothing to weigh and nobody is to be
told. There the whole admission is one straight line (the job made, its channel
taken, its step returned) and the step's end one call that also says whether it
COMPLETED. ``repeat_check`` compares the cheap numbers that say the straight line is
what the full path would decide (the epoch, which every revocation, thermal change,
priority change and grant end bumps; an empty queue and a free channel; a pending
burst end; one step; the uid's job bound; for BACKGROUND work, a channel it may take,
no paced stream's quiet window, no lanes or share to weigh) and changes nothing;
``repeat_begin`` is that check, then the straight line (``_repeat_commit``), and
falls back, having changed nothing, when the check says no. What they record (work
ids, stats, the ledger, debouncing, the quiet window's arrivals, the decision log,
the instructions) is what the full path records; tests/drivers/test_state_repeat.py
holds them to it event for event.

BACKGROUND repeats too, with ``background_one_pass`` (embed22): the contention bench's
embedder on the background lane (its steps on the burst's own thread,
``background_burst_here = "normal"``) spent 32 µs of each 0.50 ms batch in the full
admission, on the one thread its batches wait for (bench/README.md "The second host tuned for
throughput"). Where the full path's dispatch would have nothing to weigh for it (no paced
stream for the quiet window to hold it behind, no lanes to give out, no share to
consult, a channel open to background work) it is the same straight line with the job's
class BACKGROUND. Measured there: the admission stage 26 vs 31 µs (the rest of it is
the kept request's checks), the embedder's items/s within the spread (81 / 80 % of
unmanaged vs 82 / 78 %, two full runs): off by default.

``rehearse`` runs the same check and the same straight line with ``dry`` set: the
objects built as for real (work info, job, step), every table read where the real
one writes, nothing written. Anticipation runs it just before a paced stream's
request is due (drivers/anticipate.py) so that the code and the data of the real
admission are in the caches when the request comes: after a cache flush the one
pass takes ~90 µs on this VM, ~11 hot.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from npumanager.drivers import events as ev
from npumanager.drivers.classes import ExecClass, may_start
from npumanager.drivers.events import JobState
from npumanager.drivers.runqueue import Job
from npumanager.drivers.state_fast import FastAdmission, FastKey
from npumanager.errors import NpuError
from npumanager.hal.exec_class import exec_class
from npumanager.hal.types import EndReason, WorkInfo

if TYPE_CHECKING:
    from npumanager.drivers.bounds import Ledger
    from npumanager.drivers.classes import Protection
    from npumanager.drivers.debounce import Debouncer
    from npumanager.drivers.decisions import DecisionLog
    from npumanager.drivers.load_hold import LoadHold
    from npumanager.drivers.quiet import QuietWindow
    from npumanager.drivers.records import DriverParams, ModelRecord, WorkStats
    from npumanager.drivers.runqueue import RunQueue
    from npumanager.drivers.share import BackgroundShare


class RepeatPath(FastAdmission):
    """The one pass of DriverState (and, as its base, the fast admission)."""

    if TYPE_CHECKING:  # DriverState's, declared for the type checker
        epoch: int
        params: DriverParams
        listening: bool
        protection: Protection
        quiet: QuietWindow | None
        ledger: Ledger
        stats: WorkStats
        load_hold: LoadHold | None
        _cutoff: int | None
        _queue: RunQueue
        share: BackgroundShare | None
        _work_ids: Iterator[int]
        _seq: Iterator[int]
        _log: DecisionLog
        _models: dict[int, ModelRecord]
        _jobs: dict[int, Job]
        _out: list[ev.Instruction]
        _ev: ev.Event | None
        _debounce: Debouncer

        def _after_event(self, now: float) -> None: ...
        def _inline(self, job: Job) -> bool: ...
        def _on_step_finished(self, e: ev.StepFinished) -> None: ...
        def _decide(self, kind: str, key: int | str, what: str, **details: object
                    ) -> None: ...

    def completes(self, ticket: int) -> bool:
        """Whether a ``StepFinished`` of ``ticket`` without an error, if it were handled
        now, would end its job COMPLETED: the job is running its last step and nobody
        cancelled it (a cancel, a revocation or a release of its model while the step
        runs makes the step's end a cancellation). The shell answers a burst execution
        whose outputs are in place on this word before it submits that event, holding its
        lock from the question to the event so that no other event comes between."""
        job = self._jobs.get(ticket)
        return (job is not None and job.state is _RUNNING
                and job.cancel_reason is None and job.step + 1 >= job.steps)

    def repeat_check(self, key: FastKey, ticket: int) -> bool:
        """Whether an execution of ``key``'s request as ``ticket`` would be admitted and
        started on a free channel in one pass now (see the module docstring); changes
        nothing. Raises as ``handle`` does for the uid's job bound."""
        eff = key.eff
        background = eff > self.protection.foreground_priority
        if background and not self.params.background_one_pass:
            return False  # (first: a BACKGROUND stream asks on every batch; trim22)
        cutoff = self._cutoff
        if (key.epoch != self.epoch or key.steps != 1 or not self._queue.starts_now()
                or self.load_hold is not None or ticket in self._jobs
                or (cutoff is not None and eff > cutoff)):
            return False
        if background and not self._background_straight():
            return False
        client = key.client
        # Its requested and started would be reported: the full path says so.
        if self.listening and not self._debounce.continues(client.uid):
            return False
        self.ledger.check_job(client.uid, len(client.jobs))
        return True

    def _background_straight(self) -> bool:
        """Whether a BACKGROUND job pushed now would be taken at once, alone, with nothing
        else for the dispatch to weigh (``_dispatch``): a channel it may take
        (``may_start``), no paced stream whose quiet window could hold it (nor one holding
        now), no background lanes to give out, no share to ask."""
        queue, quiet = self._queue, self.quiet
        running = sum(1 for j in queue.running.values() if j.cls is _BACKGROUND)
        return (may_start(_BACKGROUND, running, queue.channels, queue.reserved)
                and (quiet is None or not (quiet.paced() or quiet.holding))
                and not queue.lanes and self.share is None)

    def repeat_begin(self, key: FastKey, ticket: int, stimulus_id: str, now: float
                     ) -> ev.RunStep | None:
        """Admit an execution of ``key``'s request as ``ticket`` and start it on a free
        channel in one pass, where that is what ``execute_fast`` would decide and it would
        tell the shell nothing but the step (``repeat_check``); the step, which the shell
        runs itself. None, having changed nothing: the shell takes ``execute_fast``.
        Raises as ``handle`` does for the uid's job bound."""
        if not self.repeat_check(key, ticket):
            return None
        return self._repeat_commit(key, ticket, stimulus_id, now, False)

    def _repeat_commit(self, key: FastKey, ticket: int, stimulus_id: str, now: float,
                       dry: bool) -> ev.RunStep:
        """The straight line, once ``repeat_check`` said yes: as ``_admit``, then
        ``_dispatch`` taking the job. ``dry`` (``rehearse``): the same objects built, what
        each write would change read instead, nothing written. Nothing here raises."""
        client, model = key.client, key.model
        uid, eff, model_id = client.uid, key.eff, model.model_id
        e = ev.Event(stimulus_id=stimulus_id, now=now)
        if not dry:
            self._ev = e
        try:
            quiet = self.quiet
            debounce = self._debounce
            queue = self._queue
            if not dry:
                self.ledger.add_job(uid)
            info = WorkInfo(0 if dry else next(self._work_ids), key.group_id, uid,
                            client.pid, uid if key.original_uid is None else key.original_uid,
                            key.feature_id, key.job_priority, eff, int(now * 1000),
                            self.params.device_number)
            cls = exec_class(eff, self.protection.foreground_priority)
            job = Job(ticket, info, client.conn, model_id, key.exec_id, 1,
                      0 if dry else next(self._seq), cls=cls)
            if dry:
                _ = (ticket in self._jobs, job in client.jobs, job in model.jobs,
                     self.stats.submitted, len(self._log), queue.running.get(0),
                     debounce.continues(uid))
                if quiet is not None:
                    quiet.streams.get((client.conn, model_id))
                channel = 0
            else:
                self._jobs[ticket] = job
                if quiet is not None and cls is _FOREGROUND:
                    quiet.arrived((client.conn, model_id), now)
                client.jobs.add(job)
                model.jobs.add(job)
                self.stats.submitted += 1
                job.reported = debounce.begin(uid) and self.listening  # (False if listening)
                self._decide("work", info.id, "admitted", model=model_id, eff=eff, steps=1)
                channel = queue.start(job)
            if quiet is not None and (quiet.paced() or quiet.holding) and not dry:
                # (the dispatch's gate, with nothing but this job to weigh: nothing held,
                # no timer to arm)
                quiet.wake_at, quiet.holding = None, False
            # A debounce end may only have been dropped: no earlier deadline to arm for.
            bg = cls is _BACKGROUND  # (no share, no lanes: _background_straight)
            return ev.RunStep(ticket, 0, True, self._inline(job), channel, info.id, bg,
                              eff, False, None)
        finally:
            if not dry:
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
        """``repeat_begin`` of ``key``'s request, dry (``repeat_check``, then the straight
        line with ``dry``), and a read of what ``repeat_end`` reads: changes nothing (no
        work id, no count, no decision, no instruction). True: the request would take the
        one pass now."""
        try:
            if not self.repeat_check(key, 0):
                return False
        except NpuError:
            return False
        self._repeat_commit(key, 0, "", now, True)
        # The end: the model's run times, the debounce burst, the job's end.
        model = key.model
        self._models.get(model.model_id)
        model.run_us  # noqa: B018
        self._queue.foreground_streams()
        ev.FinishJob(0, 0, EndReason.COMPLETED, 1, None, None)
        self._debounce.next_deadline()
        return True


_FOREGROUND = ExecClass.FOREGROUND
_BACKGROUND = ExecClass.BACKGROUND
_RUNNING = JobState.RUNNING
