"""What the apps of the driver-side security tests do, as functions run under other uids
(``npumanager.testing.procs``): get a grant from npud, then use the driver as a
well-behaved app or as an attacker would."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from npumanager import ModelLoadRequest, NpuManager, nn
from npumanager.errors import NpuError
from npumanager.testing import procs
from npumanager.testing.onnx_models import add_model, step_model
from tests.security.harness import Lifecycle

X = np.arange(4, dtype=np.float32).reshape(1, 4)


@contextmanager
def granted(runtime_dir: str, request_id: int = 1) -> Iterator[tuple[nn.Device, Any]]:
    """A grant from npud and the reference device; unloads and leaves at the end."""
    with NpuManager(runtime_dir, client_name="app") as mgr:
        req = ModelLoadRequest(id=request_id)
        cb = Lifecycle()
        mgr.request_can_load_model(req, cb)
        cb.wait_for("CAN_LOAD_NOW")
        dev = nn.device("reference", runtime_dir)
        try:
            yield dev, cb.listener
        finally:
            dev.close()
            try:
                cb.listener.notify_model_unloaded(req)
            except NpuError:
                pass


def outcome(fn: Callable[[], Any]) -> str:
    """``"ok: <result>"`` or ``"<ErrorType>: <message>"``."""
    try:
        return f"ok: {fn()}"
    except NpuError as exc:
        return f"{type(exc).__name__}: {exc}"


def prepare_outcomes(runtime_dir: str, models: list[bytes | str]) -> list[str]:
    """Prepare each model (bytes or a path) under one grant; what each got."""
    out = []
    with granted(runtime_dir) as (dev, grant):
        for m in models:
            def run(m: bytes | str = m) -> Any:
                model = dev.prepare_model(m, grant=grant)
                try:
                    return model.execute({"x": X})["y"].ravel().tolist()
                finally:
                    model.release()
            out.append(outcome(run))
    return out


def endless_job(runtime_dir: str, steps: int) -> dict[str, Any]:
    """Run a job of ``steps`` steps (a decode loop) until the test says stop, then cancel it;
    report how many steps it had run and what a job of ``steps + 1`` got."""
    with granted(runtime_dir) as (dev, grant):
        model = dev.prepare_model(step_model(4, work_dim=64), grant=grant)
        result: dict[str, Any] = {}

        def run() -> None:
            result["job"] = outcome(lambda: model.execute(
                {"state": np.zeros((1, 4), np.float32)}, steps=steps,
                feedback={"state_out": "state"}))

        t = threading.Thread(target=run)
        t.start()
        procs.receive(timeout=60)  # running: the test checks the bystander meanwhile
        result["too_many"] = outcome(lambda: model.execute(
            {"state": np.zeros((1, 4), np.float32)}, steps=steps + 1,
            feedback={"state_out": "state"}))
        model.cancel()
        t.join(30)
        model.release()
        return result


def private_external_model(runtime_dir: str, directory: str) -> list[float]:
    """As the app: a model whose weights live in the app's own 0700 directory (the driver's
    user cannot read them), prepared from its path: the client sends the files."""
    from npumanager.testing.external_models import save_external_model

    d = Path(directory)
    d.mkdir(mode=0o700)
    path = save_external_model(d / "m", scale=3.0, bias=0.5)
    os.chmod(d / "m", 0o700)
    with granted(runtime_dir) as (dev, grant):
        model = dev.prepare_model(path, grant=grant)
        return [float(v) for v in model.execute({"x": X})["y"].ravel()]


def add_outcome(runtime_dir: str, bias: float = 1.0) -> str:
    return prepare_outcomes(runtime_dir, [add_model(4, bias)])[0]


def wait_until(pred: Callable[[], Any], timeout: float = 10.0, what: str = "condition",
               show: Callable[[], Any] | None = None) -> Any:
    """Until ``pred`` is true: a state the driver reports (device.stats), which no app can
    announce (an app does not know when the driver has queued its job or seen npud go).
    ``show``: what the timeout's message says the state was then."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}"
                                 + (f"; then: {show()}" if show is not None else ""))
        time.sleep(0.01)
