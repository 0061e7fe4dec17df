"""The compile starvation bound for compiles that run in the driver host itself.

A BACKGROUND prepare whose driver compiles in-process (torch AOTInductor, OpenVINO, the
reference driver's external-data path: everything the compile child does not take,
drivers/prepare.py) runs on a lowered compile thread of the host, at SCHED_IDLE, and the
processes it starts (torch's g++) inherit that. On a machine kept busy at normal priority
it could wait without end (a torch conformance test hung 300 s here behind a priority
race; the missing bound was the rest of it). So it gets the compile child's bound
(drivers/compile_starve.py): the same pure decision (hal/starve_bound.py) raises the
compiling thread and every process it forked (hal/proc_tree.py's tree ``(host pid, tid)``)
to nice 0 for one bound when it starved one bound, and lowers it again after.

Who watches: where the host may not raise itself, npud (``hal.watch_compile``, asked from
the compiling thread before the compile and after it; service/host_compile_watch.py). A
lowered thread that waits for the CPU while it holds the host's GIL (an ONNX Runtime
session being built, torch tracing) stops every other Python thread of the host, so a
watch inside the host decides late: measured, a session built at SCHED_IDLE beside two
busy loops on its CPU took about 220 s with the host's own watch (16 raises decided in that
time) and 16.6 s with npud's (tests/security/test_compile_raise.py). Where the host may
raise itself (RLIMIT_NICE 20), or no npud is attached, :class:`CompileWatch`'s own thread
watches (at normal priority: made on the host's main thread), with that limit.

What counts as starving: the tree's wall time less its CPU time, counted only while one of
its threads is runnable (state R at the sample). Unlike the compile child, a compiling
host thread blocks on threads outside its tree (OpenVINO's and ONNX Runtime's pools, which
it made, are the host's threads, not its children): wall time less CPU time alone would
read that as starving and raise it on an idle machine. (schedstat's run_delay would be the
exact measure, but the kernel adds a wait to it only when the thread next runs: a thread
that never runs shows none; measured here, 1.2 s of 2 s starved.)
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from npumanager.drivers.compile_starve import CompileRaiser, CompileStarve
from npumanager.hal.proc_tree import TreeProgress

log = logging.getLogger("npumanager.drivers.compile_watch")

T = TypeVar("T")


@dataclass
class _Watched:
    guard: CompileStarve
    tree: TreeProgress
    moves: list[bool] = field(default_factory=list)  # raises (True) and lowers (tests)


class CompileWatch:
    """Watches the host's in-process BACKGROUND compiles, or has npud watch them. Made on
    a normal-priority thread (its watcher thread inherits the policy: one made on a
    lowered compile thread would starve with the compile it watches)."""

    def __init__(self, name: str, starve_ms: int, raiser: CompileRaiser,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.name = name
        self.starve_s = starve_ms / 1e3
        self.raiser = raiser
        self._clock = clock
        self._cond = threading.Condition()
        self._watched: dict[int, _Watched] = {}
        self._closed = False
        self.compiles = self.raises = 0  # compiles watched, raises decided (stats, tests)
        self.by_npud = 0  # compiles of those that npud watched
        self._thread = threading.Thread(target=self._run, name=f"npu-{name}-cwatch",
                                        daemon=True)
        self._thread.start()

    def run(self, fn: Callable[..., T], *args: object) -> T:
        """``fn(*args)`` on the calling (lowered) thread, watched with the processes it
        forks."""
        return self._run_watched(True, fn, *args)

    def run_here(self, fn: Callable[..., T], *args: object) -> T:
        """``fn(*args)`` on the calling (lowered) thread, watched without its children:
        the session build after the compile child's compile (the thread may have started
        the child, which the compile worker watches itself), or from cache artifacts."""
        return self._run_watched(False, fn, *args)

    def _run_watched(self, children: bool, fn: Callable[..., T], *args: object) -> T:
        pid, tid = os.getpid(), threading.get_native_id()
        ask = self.raiser.ask_watch
        if not self.raiser.local and ask is not None and not self.raiser.refused:
            # npud watches it (service/host_compile_watch.py): this process's GIL, which
            # the compile holds while it waits for the CPU, does not stop npud.
            signed = tid if children else -tid
            if ask(pid, signed, True):
                with self._cond:
                    self.compiles += 1
                    self.by_npud += 1
                try:
                    return fn(*args)
                finally:
                    ask(pid, signed, False)
        w = _Watched(CompileStarve(self.starve_s), TreeProgress(pid, tid, children))
        now = self._clock()
        w.guard.begin(now, w.tree.sample(now) or 0.0)
        with self._cond:
            self._watched[tid] = w
            self.compiles += 1
            self._cond.notify()
        try:
            return fn(*args)
        finally:
            with self._cond:
                self._watched.pop(tid, None)
                if w.guard.end():
                    self._down(w)
                    w.moves.append(False)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._watched and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                self._cond.wait(max(0.001, self.starve_s / 2))
                if self._closed:
                    return
                try:
                    self._tick()
                except Exception:
                    log.exception("%s: the compile watch's tick failed", self.name)

    def _tick(self) -> None:
        """(under the lock) Each watched compile's decision, carried out."""
        now = self._clock()
        for w in self._watched.values():
            progress = w.tree.sample(now)
            if progress is None:
                continue
            move = w.guard.tick(now, progress)
            if move is True:
                self.raises += 1
                w.moves.append(True)
                self.raiser.up(w.tree.pid, w.tree.tid, children=w.tree.children)
            elif move is False:
                self._down(w)

    def _down(self, w: _Watched) -> None:
        w.moves.append(False)
        self.raiser.down(w.tree.pid, w.tree.tid, children=w.tree.children)

    def counts(self) -> dict[str, object]:
        """For ``device.stats`` (``compile_thread``)."""
        return {"starve_ms": self.starve_s * 1e3, "compiles": self.compiles,
                "raises": self.raises, "watched_by_npud": self.by_npud,
                "via": self.raiser.via}

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(5)
