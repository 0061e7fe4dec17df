"""A job's life in :class:`~.state.DriverState`: admission, cancel, each step's end and
the job's end (a mixin of it, split out of state.py by topic; pure, like it).

* An execute request is checked against its model's specs, the step bound and its
  feedback, then admitted within the uid's job bound (``_admit``, which the fast paths
  of :mod:`.state_fast` and :mod:`.state_repeat` share), reported (debouncing) and
  queued; the state's ``_dispatch`` then decides who runs.
* A multi-step job goes back into the queue after every step behind its equals
  (round robin) and ahead of less important work; a cancelled job's running step is
  asked to abort and the job ends when the step does.
* A job's end frees its bound, reports it (debouncing) and releases a model that was
  dropped while the step ran.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from npumanager.drivers import events as ev
from npumanager.drivers.classes import ExecClass, exec_class
from npumanager.drivers.events import JobState, WorkKind
from npumanager.drivers.runqueue import Job
from npumanager.errors import InvalidArgument
from npumanager.hal.types import EndReason, WorkInfo

if TYPE_CHECKING:
    from collections.abc import Iterator

    from npumanager.drivers.bounds import Ledger
    from npumanager.drivers.classes import Protection
    from npumanager.drivers.debounce import Debouncer
    from npumanager.drivers.quiet import QuietWindow
    from npumanager.drivers.records import ClientRecord, DriverParams, ModelRecord, WorkStats
    from npumanager.drivers.runqueue import RunQueue
    from npumanager.drivers.share import BackgroundShare
    from npumanager.errors import NpuError

_QUEUED, _RUNNING = JobState.QUEUED, JobState.RUNNING
_REQUESTED, _ENDED = WorkKind.REQUESTED, WorkKind.ENDED
#: (an Enum's ``name`` is a property: two Python calls on every job's end)
_REASON_NAMES = {r: r.name for r in EndReason}


class WorkRules:
    """The execute, cancel and step-end handlers of DriverState, and a job's end."""

    if TYPE_CHECKING:  # DriverState's, declared for the type checker
        params: DriverParams
        listening: bool
        protection: Protection
        quiet: QuietWindow | None
        share: BackgroundShare | None
        ledger: Ledger
        stats: WorkStats
        _queue: RunQueue
        _debounce: Debouncer
        _clients: dict[int, ClientRecord]
        _models: dict[int, ModelRecord]
        _releasing: dict[int, ModelRecord]
        _jobs: dict[int, Job]
        _work_ids: Iterator[int]
        _seq: Iterator[int]
        _out: list[ev.Instruction]
        _ev: ev.Event | None

        def _client(self, conn: int) -> ClientRecord: ...
        def _not_owned(self, conn: int, model_id: int) -> NpuError: ...
        def effective_priority(self, uid: int, original_uid: int | None,
                               job_priority: int) -> int: ...
        def _dispatch(self, yielding: Job | None = None) -> None: ...
        def _decide(self, kind: str, key: int | str, what: str, **details: object
                    ) -> None: ...

    def _on_execute(self, e: ev.ExecuteRequested) -> None:
        client = self._client(e.conn)
        model = self._models.get(e.model_id)
        if model is None or model.conn != e.conn:
            raise self._not_owned(e.conn, e.model_id)  # (open_burst's wording too)
        if model.check is not None and e.values is not None:
            # Names, kinds, element types, ranks and fixed dims, against the prepared specs.
            model.check.check(e.values)
        else:
            names = e.inputs
            if len(names) != len(model.inputs) or not model.inputs.issuperset(names):
                raise InvalidArgument(f"model takes inputs {sorted(model.inputs)}, got "
                                      f"{sorted(names)}")
        steps = max(1, e.steps)
        lim, name = self.params.limits, self.params.name
        if 0 < lim.max_steps < steps:
            raise InvalidArgument(f"an execution may run at most {lim.max_steps} steps on "
                                  f"driver {name}, not {steps}")
        if steps > 1:
            for out_name, in_name in e.feedback:
                if out_name not in model.outputs or in_name not in model.inputs:
                    raise InvalidArgument(f"feedback {out_name!r} -> {in_name!r} names no "
                                          "output/input of this model")
        if e.ticket in self._jobs:
            raise InvalidArgument(f"execution ticket {e.ticket} is already in use")
        uid = client.uid
        eff = self.effective_priority(uid, e.original_uid, e.job_priority)
        self._admit(client, model, e.ticket, steps, eff, e.job_priority, e.original_uid,
                    e.feature_id, e.group_id, e.exec_id, e.now)

    def _admit(self, client: ClientRecord, model: ModelRecord, ticket: int, steps: int,
               eff: int, job_priority: int, original_uid: int | None,
               feature_id: int | None, group_id: bytes | None, exec_id: int,
               now: float) -> Job:
        """An execution whose request passed every check (the full path, or the fast path
        of :mod:`.state_fast` with what that same check found): within the uid's bound
        it is admitted, reported (debouncing) and queued, then dispatched."""
        uid = client.uid
        self.ledger.check_job(uid, len(client.jobs))
        # Admitted: nothing below raises.
        self.ledger.add_job(uid)
        info = WorkInfo(next(self._work_ids), group_id, uid, client.pid,
                        uid if original_uid is None else original_uid, feature_id,
                        job_priority, eff, int(now * 1000), self.params.device_number)
        job = Job(ticket, info, client.conn, model.model_id, exec_id, steps, next(self._seq),
                  cls=exec_class(eff, self.protection.foreground_priority))
        self._jobs[ticket] = job
        if self.quiet is not None and job.cls is ExecClass.FOREGROUND:
            self.quiet.arrived((client.conn, model.model_id), now)
        client.jobs.add(job)
        model.jobs.add(job)
        self.stats.submitted += 1
        # Reported unless it continues a debouncing burst (or nobody listens: a callback
        # registered later hears of it from its pauses and end only).
        job.reported = self._debounce.begin(uid) and self.listening
        if job.reported:
            self._out.append(ev.ReportWork(_REQUESTED, info, 0))
        self._decide("work", info.id, "admitted", model=model.model_id, eff=eff, steps=steps)
        self._queue.push(job)
        self._dispatch()
        return job

    def _on_cancel(self, e: ev.CancelRequested) -> None:
        client = self._clients.get(e.conn)
        if client is None:
            return
        for job in sorted(client.jobs, key=lambda j: j.info.id):
            if job.model_id == e.model_id and e.exec_id in (0, job.exec_id):
                self._cancel(job, EndReason.CANCELLED_USER)

    def _cancel(self, job: Job, reason: EndReason) -> None:
        """Cancel a queued or paused job at once; a running step ends first (aborted)."""
        if job.state is _RUNNING:
            if job.cancel_reason is None:
                job.cancel_reason = reason
                self._decide("work", job.info.id, "abort asked", reason=reason.name)
                self._out.append(ev.AbortStep(job.ticket))
            return
        # Taking a job out of the queue frees no channel: nothing else can start.
        self._queue.remove(job)
        self._finish(job, reason)

    def _on_step_finished(self, e: ev.StepFinished) -> None:
        job = self._jobs.get(e.ticket)
        if job is None or job.state is not _RUNNING:
            return  # a stale report (the job already ended)
        model = self._models.get(job.model_id) or self._releasing.get(job.model_id)
        if model is not None:
            model.note_run(e.run_us)
        if self.share is not None and job.cls is ExecClass.BACKGROUND:
            self.share.note(job.info.uid, e.run_us / 1e6, e.now)
        self._queue.release(job)
        if self.quiet is not None and job.cls is ExecClass.FOREGROUND:
            self.quiet.ended((job.conn, job.model_id), e.now)  # its tail starts (.quiet)
        job.step += 1
        if job.cancel_reason is not None:
            self._finish(job, job.cancel_reason)
        elif e.error is not None:
            self._finish(job, EndReason.FAILED, e.error)
        elif job.step >= job.steps:
            self._finish(job, EndReason.COMPLETED)
        else:
            # Back into the queue behind the equally important work waiting now (round
            # robin among equals: an endless job cannot starve them) and ahead of less
            # important work: it keeps its channel unless such work is waiting.
            job.state = _QUEUED
            job.seq = next(self._seq)
            self._queue.push(job)
            self._dispatch(yielding=job)
            return
        self._dispatch()

    def _finish(self, job: Job, reason: EndReason, error: str | None = None) -> None:
        e = self._ev
        assert e is not None
        del self._jobs[job.ticket]
        self.ledger.drop_job(job.info.uid)
        job_id = job.info.id
        client = self._clients.get(job.conn)
        if client is not None:
            client.jobs.discard(job)
        model = self._models.get(job.model_id)
        if model is None:
            model = self._releasing.get(job.model_id)
        if model is not None:
            model.jobs.discard(job)
        stats = self.stats
        if reason is EndReason.COMPLETED:
            stats.completed += 1
        elif reason is EndReason.FAILED:
            stats.failed += 1
        else:
            stats.cancelled += 1
        listening = self.listening
        info = self._stamp(job.info) if listening else job.info
        if self._debounce.end(job.info.uid, info, reason, e.now, listening):
            self._out.append(ev.ReportWork(_ENDED, info, int(reason)))
        self._out.append(ev.FinishJob(job.ticket, job_id, reason, job.step, error, job.revoked))
        self._decide("work", job_id, "ended", reason=_REASON_NAMES[reason], steps=job.step)
        if model is not None and not model.jobs and model.model_id in self._releasing:
            del self._releasing[model.model_id]
            self._out.append(ev.ReleaseModel(model.model_id))

    def _stamp(self, info: WorkInfo) -> WorkInfo:
        e = self._ev
        assert e is not None
        return WorkInfo(info.id, info.group_id, info.uid, info.debug_pid, info.original_uid,
                        info.debug_feature_id, info.job_priority, info.effective_priority,
                        int(e.now * 1000), info.device_number)

