"""One device's channels and the queue of jobs waiting for them (pure, no I/O).

Order: lowest effective priority first, ties by arrival (``seq``). A job keeps
its ``seq`` when it goes back into the queue between steps, so it resumes
ahead of equal-priority work that arrived after it (FIFO among equals). Jobs
whose effective priority lies above the thermal hold-back cutoff stay queued
while the device is hot; the rest of the queue is not blocked behind them.

Background lanes (``lanes``, 0: none): BACKGROUND steps running at once each
get a lane of their own, ``0..lanes-1``; a job keeps the lane it last had when
that one is free (its next step runs where its data is). The shell runs lane
k's steps on a thread of its own kept on a CPU of its own (:mod:`.steps`,
``background_cpus = "lanes"``). Why: background threads are SCHED_IDLE, and the
kernel never lets a waking SCHED_IDLE thread preempt a running one, while it
counts a CPU running only SCHED_IDLE threads as idle when it places a waking
thread; so an embedder's short step woken next to an LLM's long one waited on
that CPU for the scheduler's tick (4 ms at HZ=250) while the other CPU idled:
21 % of its batches over 2 ms in the driver, the machine 1.57 of 2 cores busy
(bench/contention.py --device-time). Steps beyond ``lanes`` get none (the
shell's shared background threads). With one channel open to background work
there are no lanes.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass

from npumanager.drivers.classes import ExecClass, may_start
from npumanager.drivers.events import JobState
from npumanager.hal.types import EndReason, WorkInfo


@dataclass(eq=False, slots=True)
class Job:
    """One execution of ``steps`` steps for a client connection."""

    ticket: int
    info: WorkInfo
    conn: int
    model_id: int
    exec_id: int
    steps: int
    seq: int
    state: JobState = JobState.QUEUED
    #: Steps finished so far.
    step: int = 0
    channel: int | None = None
    #: False when its requested/started were folded into its uid's debounced burst.
    reported: bool = True
    cancel_reason: EndReason | None = None
    revoked: str | None = None
    #: Its execution class (a pure function of its effective priority: .classes).
    cls: ExecClass = ExecClass.FOREGROUND
    #: The background lane its running step has, or last had (None: none yet).
    lane: int | None = None

    @property
    def id(self) -> int:
        return self.info.id

    def __repr__(self) -> str:
        return (f"<Job {self.info.id} uid={self.info.uid} eff={self.info.effective_priority} "
                f"{self.state.value} step {self.step}/{self.steps}>")


class RunQueue:
    """Channels ``0..channels-1`` of one device, and the jobs queued for them.
    ``reserved`` of them are kept free for FOREGROUND jobs (background work runs on at
    most ``channels - reserved`` at once)."""

    def __init__(self, channels: int, reserved: int = 0, lanes: int = 0) -> None:
        if channels < 1:
            raise ValueError("a device needs at least one channel")
        if not 0 <= reserved < channels:
            raise ValueError("reserved channels must leave background work one channel")
        self.channels = channels
        self.reserved = reserved
        if lanes < 0:
            raise ValueError("background lanes cannot be negative")
        #: (with one background channel no two background steps run at once: a lane
        #: would only keep the one that runs off the other CPUs)
        self.lanes = lanes if channels - reserved >= 2 else 0
        #: No lanes given out for now (``background_cpus = "lanes-except-loads"``: while a
        #: background model prepares, set by the state's prepare handlers).
        self.lanes_paused = False
        self._heap: list[tuple[int, int, Job]] = []
        self._free = list(range(channels))
        self.running: dict[int, Job] = {}  # channel -> job

    def __len__(self) -> int:
        return len(self._heap)

    def queued(self) -> list[Job]:
        """Queued jobs in the order they would run."""
        return [j for _, _, j in sorted(self._heap, key=lambda e: (e[0], e[1]))]

    def free(self) -> int:
        return len(self._free)

    def push(self, job: Job) -> None:
        heapq.heappush(self._heap, (job.info.effective_priority, job.seq, job))

    def remove(self, job: Job) -> None:
        self._heap = [e for e in self._heap if e[2] is not job]
        heapq.heapify(self._heap)

    def foreground_streams(self) -> set[tuple[int, int]]:
        """(connection, model) of every FOREGROUND job running or queued (a queued one
        is taken before any background job: it ranks above them)."""
        fg = ExecClass.FOREGROUND
        out = {(j.conn, j.model_id) for j in self.running.values() if j.cls is fg}
        out.update((j.conn, j.model_id) for _, _, j in self._heap if j.cls is fg)
        return out

    def background_uids(self) -> set[int]:
        """uids with BACKGROUND work running or queued."""
        bg = ExecClass.BACKGROUND
        out = {j.info.uid for j in self.running.values() if j.cls is bg}
        out.update(j.info.uid for _, _, j in self._heap if j.cls is bg)
        return out

    def held_count(self, cutoff: int | None) -> int:
        if cutoff is None:
            return 0
        return sum(1 for eff, _, _ in self._heap if eff > cutoff)

    def take(self, cutoff: int | None, quiet: Callable[[Job], bool] | None = None
             ) -> list[tuple[Job, JobState]]:
        """Start the best queued jobs on the free channels; those above ``cutoff`` (thermal
        hold-back, None: nothing held) stay queued, and so do background jobs while
        ``channels - reserved`` background steps run or ``quiet(job)`` says so (the quiet
        window, :mod:`.quiet`). Returns each job started with the state it had in the
        queue (it is RUNNING now)."""
        heap, free = self._heap, self._free
        if not free or not heap:
            return []
        chosen: list[Job] = []
        held: list[tuple[int, int, Job]] = []
        background = sum(1 for j in self.running.values() if j.cls is ExecClass.BACKGROUND)
        while heap and len(chosen) < len(free):
            entry = heapq.heappop(heap)
            job = entry[2]
            if (cutoff is not None and entry[0] > cutoff) or not may_start(
                    job.cls, background, self.channels, self.reserved) or (
                    quiet is not None and job.cls is ExecClass.BACKGROUND and quiet(job)):
                held.append(entry)
            else:
                chosen.append(job)
                background += job.cls is ExecClass.BACKGROUND
        for entry in held:
            heapq.heappush(heap, entry)
        out: list[tuple[Job, JobState]] = []
        lanes = 0 if self.lanes_paused else self.lanes
        if lanes and background:
            # (the lanes of the background steps running now; the chosen ones' own lanes
            # are about to be given out again)
            taken = {j.lane for j in self.running.values() if j.cls is ExecClass.BACKGROUND}
        for job in chosen:
            channel = free.pop(0)
            out.append((job, job.state))
            job.state = JobState.RUNNING
            job.channel = channel
            self.running[channel] = job
            if lanes and job.cls is ExecClass.BACKGROUND:
                lane = job.lane
                if lane is None or lane in taken:
                    lane = next((k for k in range(lanes) if k not in taken), None)
                job.lane = lane
                taken.add(lane)
        return out

    def starts_now(self) -> bool:
        """Whether a FOREGROUND job pushed now would be taken at once, alone: nothing
        queued, a channel free."""
        return not self._heap and bool(self._free)

    def start(self, job: Job) -> int:
        """``job`` (FOREGROUND, ``starts_now``) straight onto a free channel, as ``push``
        then ``take`` would put it; its channel."""
        channel = self._free.pop(0)
        job.state = JobState.RUNNING
        job.channel = channel
        self.running[channel] = job
        return channel

    def release(self, job: Job) -> None:
        """The running step of ``job`` is over: its channel is free again."""
        channel = job.channel
        assert channel is not None and self.running.get(channel) is job, job
        del self.running[channel]
        self._free.append(channel)
        job.channel = None

    def alone(self, job: Job) -> bool:
        """Whether ``job`` is the only work on the device (running, nothing queued)."""
        return not self._heap and len(self.running) == 1 and job.state is JobState.RUNNING

    def check(self) -> None:
        """Invariants (for ``DriverState.validate``)."""
        assert len(self.running) + len(self._free) == self.channels, "channels lost"
        assert set(self.running).isdisjoint(self._free), "a channel both free and busy"
        for channel, job in self.running.items():
            assert job.channel == channel and job.state is JobState.RUNNING, job
        background = [j for j in self.running.values() if j.cls is ExecClass.BACKGROUND]
        assert len(background) <= self.channels - self.reserved, \
            "background work on a reserved channel"
        if self.lanes:
            lanes = [j.lane for j in background if j.lane is not None]
            assert len(set(lanes)) == len(lanes), "two background steps in one lane"
            assert all(0 <= k < self.lanes for k in lanes), "a lane out of range"
        for _, _, job in self._heap:
            assert job.state in (JobState.QUEUED, JobState.PAUSED), job
            assert job.channel is None, job
        assert len({id(e[2]) for e in self._heap}) == len(self._heap), "a job queued twice"
