"""What the conformance checks stand on: the target, a session, an event log."""

from __future__ import annotations

import itertools
import os
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from npumanager.hal.client import IScheduling, connect_scheduling
from npumanager.hal.types import EndReason, ISchedulingCallback, StartReason, WorkInfo
from npumanager.hal.wire import SERVICE
from npumanager.nn.device import Device
from npumanager.nn.model import Model
from npumanager.paths import driver_socket
from npumanager.proto.v1 import driver_pb2 as pb
from npumanager.wire.client import SyncRpcClient


@dataclass
class ConformanceTarget:
    """A running driver to check, and models it can run.

    ``model`` takes ``inputs`` and should run quickly; ``step_model`` is run as
    long multi-step jobs (``step_feedback`` maps outputs to inputs between
    steps; one step should take at least a few milliseconds). ``plugin`` and
    ``options`` let the restart check start the driver under npud's supervisor.
    """

    name: str
    runtime_dir: Path
    model: bytes
    inputs: dict[str, np.ndarray]
    step_model: bytes
    step_inputs: dict[str, np.ndarray]
    step_feedback: dict[str, str] = field(default_factory=dict)
    plugin: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    state_dir: Path | None = None
    #: ``options`` for the host npud's supervisor starts, which runs as ``[manager]
    #: driver_user`` (None: ``options``): a directory an option names must be that user's.
    supervised_options: dict[str, Any] | None = None


class EventLog(ISchedulingCallback):
    """Collects the lifecycle events a driver pushes (on the HAL reader thread)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, WorkInfo, int]] = []
        self._cond = threading.Condition()

    def _add(self, kind: str, info: WorkInfo, reason: int) -> None:
        with self._cond:
            self.events.append((kind, info, reason))
            self._cond.notify_all()

    def on_work_requested(self, info: WorkInfo) -> None:
        self._add("requested", info, 0)

    def on_work_started(self, info: WorkInfo, reason: StartReason) -> None:
        self._add("started", info, int(reason))

    def on_work_ended(self, info: WorkInfo, reason: EndReason) -> None:
        self._add("ended", info, int(reason))

    def clear(self) -> None:
        with self._cond:
            self.events.clear()

    def snapshot(self) -> list[tuple[str, WorkInfo, int]]:
        with self._cond:
            return list(self.events)

    def wait_for(self, pred: Callable[[list[tuple[str, WorkInfo, int]]], bool],
                 timeout: float = 10.0) -> list[tuple[str, WorkInfo, int]]:
        deadline = time.monotonic() + timeout
        with self._cond:
            while not pred(self.events):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"timed out waiting for events; got {self.events}")
                self._cond.wait(left)
            return list(self.events)


_grant_seq = itertools.count(1)


class Session:
    """Connections shared by the checks: IScheduling, the device, a raw admin channel."""

    def __init__(self, target: ConformanceTarget) -> None:
        self.target = target
        self.hal: IScheduling = connect_scheduling(target.name, target.runtime_dir)
        self.admin = SyncRpcClient(str(driver_socket(target.name, target.runtime_dir)), SERVICE,
                                   client_name="conformance")
        self.device = Device(target.name, target.runtime_dir)
        self.log = EventLog()
        self.uid = os.getuid()
        self._models: list[Model] = []

    def reset(self, debounce_ms: int = 0) -> None:
        self.hal.set_scheduling_configs([])
        self.log.clear()
        self.hal.set_callback(self.log, debounce_ms)

    def grant(self, uid: int | None = None) -> str:
        grant_id = secrets.token_hex(16)
        self.admin.call("hal.grant_issued", pb.GrantIssued(
            uid=self.uid if uid is None else uid, request_id=next(_grant_seq),
            grant_id=grant_id))
        return grant_id

    def end_grant(self, grant_id: str, revoked: bool = True) -> None:
        self.admin.call("hal.grant_ended", pb.GrantEnded(grant_id=grant_id, revoked=revoked))

    def prepare(self, step: bool = False, grant_id: str | None = None) -> Model:
        t = self.target
        model = self.device.prepare_model(t.step_model if step else t.model,
                                          grant=grant_id or self.grant())
        self._models.append(model)
        return model

    @contextmanager
    def background(self, model: Model, n: int, steps: int = 10_000,
                   job_priority: int = 1000) -> Iterator[list[threading.Thread]]:
        """``n`` long multi-step jobs running in threads; cancelled when the block ends."""
        t = self.target
        errors: list[BaseException] = []

        def run() -> None:
            try:
                model.execute(t.step_inputs, job_priority=job_priority, steps=steps,
                              feedback=t.step_feedback)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=run, daemon=True) for _ in range(n)]
        for th in threads:
            th.start()
        try:
            yield threads
        finally:
            model.cancel()
            for th in threads:
                th.join(30)

    def close(self) -> None:
        for m in self._models:
            m.release()
        self.device.close()
        self.admin.close()
        self.hal.close()
