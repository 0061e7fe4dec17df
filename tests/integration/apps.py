"""Client "apps" that integration tests run as other uids (forked by npumanager.testing.procs).

``scripted_app`` connects to npud, submits its requests, reacts to callbacks
as told (report loaded, comply with unload requests or not), obeys commands
the test sends (unload, cancel, request, exit, die) and returns every
callback it saw as plain tuples.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from npumanager import (
    LoadStatus,
    ModelLoadRequest,
    ModelLoadRequestCallback,
    ModelLoadStatusListener,
    NpuManager,
    RequestStatus,
    UnloadReason,
)
from npumanager.testing import procs

Req = tuple[Any, ...]  # (id, size, priority) or (id, size, priority, device)
Event = tuple[Any, ...]


class Recorder(ModelLoadRequestCallback):
    """Records every callback; in a spawned app it also announces each one to the test
    (``Child.expect``), plus ``("loaded", id)`` once npud took the loaded report."""

    def __init__(self, *, report_loaded: bool = True, comply: bool = True,
                 announce: bool = False) -> None:
        self.events: list[Event] = []
        self.listeners: dict[int, ModelLoadStatusListener] = {}
        self.report_loaded = report_loaded
        self.comply = comply
        self.announce = announce
        self.cond = threading.Condition()
        self.ended: set[int] = set()
        self.on_end: Callable[[], None] = lambda: None

    def _add(self, ev: Event) -> None:
        with self.cond:
            self.events.append(ev)
            self.cond.notify_all()
        if self.announce:
            procs.announce(ev)

    def on_can_load_model(self, request: ModelLoadRequest, status: LoadStatus,
                          listener: Any) -> None:
        self.listeners[request.id] = listener
        self._add(("can", request.id, status.name))
        if status == LoadStatus.CAN_LOAD_NOW:
            assert listener.grant_id, "CAN_LOAD_NOW without a grant id"
            if self.report_loaded:
                listener.notify_model_loaded(request)
                if self.announce:
                    procs.announce(("loaded", request.id))

    def on_request_unload_model(self, request: ModelLoadRequest, reason: UnloadReason) -> None:
        self._add(("unload", request.id, reason.name))
        if self.comply:
            self.listeners[request.id].notify_model_unloaded(request)

    def on_model_load_request_complete(self, request: ModelLoadRequest,
                                       status: RequestStatus) -> None:
        with self.cond:
            self.ended.add(request.id)
        self._add(("complete", request.id, status.name))
        self.on_end()

    def wait_for(self, pred: Callable[[list[Event]], bool], timeout: float) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: pred(self.events), timeout)


def scripted_app(
    runtime_dir: str | Path,
    requests: Sequence[Req],
    *,
    report_loaded: bool = True,
    comply: bool = True,
    until: str = "done",
    run_for: float = 10.0,
) -> list[Event]:
    """Run one app; ``until="done"`` returns once every request ended, ``"exit"`` on command.

    Every callback is announced to the test as it happens (``Child.expect``), and
    ``("loaded", id)`` once npud took the loaded report. Commands (``Child.send``):
    ("unload", id), ("loaded", id), ("cancel", id), ("request", (id, size, prio)),
    ("exit",), ("die",) (exits at once, no close). ``run_for`` bounds the whole app.
    """
    rec = Recorder(report_loaded=report_loaded, comply=comply, announce=True)
    reqs: dict[int, ModelLoadRequest] = {}
    deadline = time.monotonic() + run_for
    # Commands and "a request ended" both wake the loop: it waits on events, not a clock.
    inbox: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
    rec.on_end = lambda: inbox.put(("ended",))

    def read_commands() -> None:
        while True:
            try:
                cmd = procs.receive(timeout=None)
            except EOFError:
                inbox.put(("exit",))
                return
            inbox.put(cmd)

    threading.Thread(target=read_commands, daemon=True).start()
    with NpuManager(runtime_dir) as mgr:
        for rid, size, prio, *device in requests:
            reqs[rid] = ModelLoadRequest(rid, size, prio, device=device[0] if device else None)
            mgr.request_can_load_model(reqs[rid], rec)
        while True:
            with rec.cond:
                if until == "done" and reqs and set(reqs) <= rec.ended:
                    break
            try:
                cmd = inbox.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            op = cmd[0]
            if op == "ended":
                continue
            if op == "exit":
                break
            if op == "die":
                os._exit(0)
            if op == "request":
                rid, size, prio = cmd[1]
                reqs[rid] = ModelLoadRequest(rid, size, prio)
                try:
                    mgr.request_can_load_model(reqs[rid], rec)
                except Exception as exc:
                    rec._add(("error", rid, type(exc).__name__))
                continue
            rid = cmd[1]
            try:
                if op == "unload":
                    rec.listeners[rid].notify_model_unloaded(reqs[rid])
                elif op == "loaded":
                    rec.listeners[rid].notify_model_loaded(reqs[rid])
                elif op == "cancel":
                    mgr.cancel_model_load(reqs[rid])
            except Exception as exc:
                rec._add(("error", rid, type(exc).__name__))
    # Closing delivered every callback npud had sent before its last reply.
    return list(rec.events)


def call_as_app(runtime_dir: str | Path, method: str, *args: Any) -> Any:
    """One NpuManager call from another uid; returns its result (errors travel back)."""
    with NpuManager(runtime_dir) as mgr:
        return getattr(mgr, method)(*args)


def niced_app(runtime_dir: str | Path, nice: int, requests: Sequence[Req],
              **kw: Any) -> list[Event]:
    """``scripted_app`` after ``os.nice(nice)``: a process the kernel treats as background."""
    os.nice(nice)
    return scripted_app(runtime_dir, requests, **kw)
