"""Drive a DriverState on virtual time, validating after every step.

``Harness`` wraps ``handle``: it builds events with ``now`` and a stimulus id,
calls ``validate()`` after each one, fires the armed timer as virtual time
advances, plays the shell's part for RunStep (a step runs until the test
finishes it), and feeds every instruction to ``StreamChecker``, which fails on
any sequence that is not a legal lifecycle of a job, a work report, a model
or a pool.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

from npumanager.constants import ThermalStatus
from npumanager.drivers import events as ev
from npumanager.drivers.state import DriverParams, DriverState
from npumanager.hal.types import EndReason, SchedulingConfig, StartReason

RESUMED, INITIAL = int(StartReason.RESUMED), int(StartReason.INITIAL)
PAUSED = int(EndReason.PAUSED)


@dataclass
class JobLife:
    steps: int
    next_step: int = 0
    running: bool = False
    aborted: bool = False
    finish: ev.FinishJob | None = None


@dataclass
class WorkLife:
    """What one work id has reported: requested? started? paused? ended?"""

    kinds: list[tuple[str, int]] = field(default_factory=list)
    phase: str = "new"  # new, requested, started, paused, ended


class StreamChecker:
    def __init__(self) -> None:
        self.jobs: dict[int, JobLife] = {}
        self.work: dict[int, WorkLife] = {}
        self.models: dict[int, str] = {}  # model id -> "ready" | "released"
        self.pools: dict[int, str] = {}
        self.last_ts: dict[int, int] = {}

    def feed(self, event: ev.Event, out: list[ev.Instruction]) -> None:
        if isinstance(event, ev.ExecuteRequested):
            assert event.ticket not in self.jobs, f"ticket {event.ticket} reused"
            self.jobs[event.ticket] = JobLife(steps=max(1, event.steps))
        if isinstance(event, ev.StepFinished):
            life = self.jobs.get(event.ticket)
            assert life is not None and life.running, f"ticket {event.ticket}: no step ran"
            life.running = False
            life.next_step += 1
        for ins in out:
            self._one(ins)

    def _one(self, ins: ev.Instruction) -> None:
        if isinstance(ins, ev.RunStep):
            life = self.jobs[ins.ticket]
            assert life.finish is None, f"{ins} after the job finished"
            assert not life.running, f"{ins} while a step of it runs"
            assert ins.step == life.next_step, f"{ins}: step {life.next_step} expected"
            assert ins.last == (ins.step + 1 == life.steps), ins
            life.running = True
        elif isinstance(ins, ev.AbortStep):
            life = self.jobs[ins.ticket]
            assert life.running and not life.aborted, f"{ins}: no step to abort"
            life.aborted = True
        elif isinstance(ins, ev.FinishJob):
            life = self.jobs[ins.ticket]
            assert life.finish is None, f"{ins}: finished twice"
            assert not life.running, f"{ins} while a step of it runs"
            assert ins.steps_run == life.next_step, ins
            if ins.reason == EndReason.COMPLETED:
                assert ins.steps_run == life.steps and ins.error is None, ins
            if ins.reason == EndReason.FAILED:
                assert ins.error, ins
            life.finish = ins
        elif isinstance(ins, ev.ReportWork):
            self._report(ins)
        elif isinstance(ins, ev.ModelReady):
            assert ins.model_id not in self.models, f"{ins}: model id reused"
            self.models[ins.model_id] = "ready"
        elif isinstance(ins, ev.ReleaseModel):
            assert self.models.get(ins.model_id) == "ready", f"{ins}: not a live model"
            self.models[ins.model_id] = "released"
        elif isinstance(ins, ev.PoolReady):
            assert ins.pool_id not in self.pools, f"{ins}: pool id reused"
            self.pools[ins.pool_id] = "ready"
        elif isinstance(ins, ev.ClosePool):
            assert self.pools.get(ins.pool_id) == "ready", f"{ins}: not a live pool"
            self.pools[ins.pool_id] = "closed"
        else:
            assert isinstance(ins, ev.ArmTimer | ev.CancelTimer | ev.ReportModelMemory
                              | ev.GraceExpired | ev.HoldLoads), ins

    def _report(self, ins: ev.ReportWork) -> None:
        info = ins.info
        assert info.timestamp_ms >= self.last_ts.get(info.id, 0), f"{ins}: time went back"
        self.last_ts[info.id] = info.timestamp_ms
        life = self.work.setdefault(info.id, WorkLife())
        life.kinds.append((ins.kind.value, ins.reason))
        kind, reason, phase = ins.kind, ins.reason, life.phase
        if kind is ev.WorkKind.REQUESTED:
            assert phase == "new", f"work {info.id}: requested in {phase}"
            life.phase = "requested"
        elif kind is ev.WorkKind.STARTED and reason == INITIAL:
            assert phase == "requested", f"work {info.id}: started in {phase}"
            life.phase = "started"
        elif kind is ev.WorkKind.STARTED:
            assert phase == "paused", f"work {info.id}: resumed in {phase}"
            life.phase = "started"
        elif reason == PAUSED:
            # Work folded into a burst reports no requested/started, but pauses.
            assert phase in ("started", "new"), f"work {info.id}: paused in {phase}"
            life.phase = "paused"
        else:
            assert phase != "ended", f"work {info.id}: ended twice"
            life.phase = "ended"

    def check_against(self, state: DriverState) -> None:
        for ticket, life in self.jobs.items():
            live = state.job_state(ticket) is not None
            assert live == (life.finish is None), f"ticket {ticket}: checker and state differ"
        live_models = set(state.model_ids())
        ready = {m for m, s in self.models.items() if s == "ready"}
        assert live_models <= ready, f"models {live_models - ready} live but never ready"


class Harness:
    """A DriverState on virtual time; conn n belongs to uid n unless told otherwise."""

    def __init__(self, params: DriverParams | None = None, *, listening: bool = True,
                 debounce_ms: int = 50, **kw: Any) -> None:
        if params is None:
            params = DriverParams(**{"channels": 1, "enforce_admission": False, **kw})
        self.state = DriverState(params)
        self.now = 1000.0
        self.checker = StreamChecker()
        self.timers: dict[str, float] = {}
        self.log: list[tuple[ev.Event, list[ev.Instruction]]] = []
        self._sid = itertools.count(1)
        self._tickets = itertools.count(1)
        self._uids: dict[int, int] = {}
        if listening:
            self.handle(self.mk(ev.CallbackSet, listening=True, debounce_ms=debounce_ms))

    # --- plumbing
    def handle(self, event: ev.Event) -> list[ev.Instruction]:
        out = self.state.handle(event)
        self.state.validate()
        self.checker.feed(event, out)
        self.checker.check_against(self.state)
        for ins in out:
            if isinstance(ins, ev.ArmTimer):
                self.timers[ins.key] = ins.at
            elif isinstance(ins, ev.CancelTimer):
                self.timers.pop(ins.key, None)
        self.log.append((event, out))
        return out

    def mk(self, cls: type[ev.Event], **kw: Any) -> Any:
        return cls(stimulus_id=f"s{next(self._sid)}", now=self.now, **kw)

    def advance(self, dt: float) -> list[ev.Instruction]:
        """Move time forward, firing the armed timers that come due, in order."""
        end = self.now + dt
        out: list[ev.Instruction] = []
        while True:
            due = sorted((at, k) for k, at in self.timers.items() if at <= end)
            if not due:
                break
            at, key = due[0]
            del self.timers[key]
            self.now = max(self.now, at)
            out += self.handle(self.mk(ev.TimerFired, key=key))
        self.now = end
        return out

    # --- events
    def connect(self, conn: int, uid: int | None = None) -> list[ev.Instruction]:
        uid = conn if uid is None else uid
        self._uids[conn] = uid
        return self.handle(self.mk(ev.ClientConnected, conn=conn, uid=uid, pid=uid + 10000))

    def prepare(self, conn: int, grant: str | None = None, memory: int = 1000,
                inputs: tuple[str, ...] = ("x",), outputs: tuple[str, ...] = ("y",)) -> int:
        """Connect ``conn`` if needed and prepare a model on it; returns its id."""
        if conn not in self._uids:
            self.connect(conn)
        out = self.handle(self.mk(ev.ModelPrepared, conn=conn, grant_id=grant,
                                  memory_bytes=memory, inputs=frozenset(inputs),
                                  outputs=frozenset(outputs)))
        ready = [i for i in out if isinstance(i, ev.ModelReady)]
        assert len(ready) == 1 and ready[0].conn == conn, out
        return ready[0].model_id

    def execute(self, conn: int, model: int, *, steps: int = 1, prio: int = 0,
                inputs: tuple[str, ...] = ("x",), ticket: int | None = None,
                **kw: Any) -> tuple[int, list[ev.Instruction]]:
        ticket = next(self._tickets) if ticket is None else ticket
        out = self.handle(self.mk(ev.ExecuteRequested, conn=conn, ticket=ticket, model_id=model,
                                  inputs=inputs, steps=steps, job_priority=prio, **kw))
        return ticket, out

    def step_done(self, ticket: int, error: str | None = None,
                  run_us: float = 1000.0) -> list[ev.Instruction]:
        return self.handle(self.mk(ev.StepFinished, ticket=ticket, run_us=run_us, error=error))

    def cancel(self, conn: int, model: int, exec_id: int = 0) -> list[ev.Instruction]:
        return self.handle(self.mk(ev.CancelRequested, conn=conn, model_id=model,
                                   exec_id=exec_id))

    def release(self, conn: int, model: int) -> list[ev.Instruction]:
        return self.handle(self.mk(ev.ModelReleased, conn=conn, model_id=model))

    def gone(self, conn: int) -> list[ev.Instruction]:
        return self.handle(self.mk(ev.ClientGone, conn=conn))

    def grant(self, gid: str, uid: int, request_id: int = 1) -> list[ev.Instruction]:
        return self.handle(self.mk(ev.GrantIssued, grant_id=gid, uid=uid,
                                   request_id=request_id))

    def end_grant(self, gid: str, revoked: bool = True) -> list[ev.Instruction]:
        return self.handle(self.mk(ev.GrantEnded, grant_id=gid, revoked=revoked))

    def thermal(self, status: ThermalStatus) -> list[ev.Instruction]:
        return self.handle(self.mk(ev.ThermalSet, status=status))

    def configs(self, *configs: SchedulingConfig, replace: bool = True) -> list[ev.Instruction]:
        return self.handle(self.mk(ev.ConfigsSet, configs=tuple(configs), replace=replace))

    def priorities(self, **by_uid: int) -> None:
        """Set app priorities: ``priorities(u1=100, u2=900)`` for uids 1 and 2."""
        self.configs(*(SchedulingConfig(uid=int(k[1:]), app_priority=v)
                       for k, v in by_uid.items()))

    # --- reading outcomes
    def running(self) -> list[int]:
        """Tickets with a step running, by work id."""
        return [j.ticket for j in sorted(self.state.jobs(), key=lambda j: j.info.id)
                if j.state is ev.JobState.RUNNING]

    def finish_of(self, ticket: int) -> ev.FinishJob:
        finish = self.checker.jobs[ticket].finish
        assert finish is not None, f"ticket {ticket} has not finished"
        return finish

    def reports(self) -> list[tuple[str, int, int]]:
        """(kind, work id, reason) of every ReportWork so far."""
        return [(i.kind.value, i.info.id, i.reason) for _, out in self.log for i in out
                if isinstance(i, ev.ReportWork)]


def kinds(out: list[ev.Instruction]) -> list[str]:
    return [type(i).__name__ for i in out]


def reports(out: list[ev.Instruction]) -> list[tuple[str, int, int]]:
    return [(i.kind.value, i.info.id, i.reason) for i in out if isinstance(i, ev.ReportWork)]
