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

The one pass of a repeat that finds the device idle (``repeat_begin``,
``repeat_end``, anticipation's ``rehearse``) is :mod:`.state_repeat`'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from npumanager.drivers import events as ev
from npumanager.drivers.records import ClientRecord, ModelRecord

if TYPE_CHECKING:
    from npumanager.drivers.runqueue import Job


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
        _clients: dict[int, ClientRecord]
        _models: dict[int, ModelRecord]
        _jobs: dict[int, Job]
        _out: list[ev.Instruction]
        _ev: ev.Event | None

        def _admit(self, client: ClientRecord, model: ModelRecord, ticket: int, steps: int,
                   eff: int, job_priority: int, original_uid: int | None,
                   feature_id: int | None, group_id: bytes | None, exec_id: int,
                   now: float) -> Job: ...

        def _after_event(self, now: float) -> None: ...

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
