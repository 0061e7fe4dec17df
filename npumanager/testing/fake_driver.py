"""A scriptable driver plugin for tests: latency per step, failures, memory — no backend.

Its "models" are JSON scripts instead of ONNX (real ONNX bytes are accepted
too and get the default script), e.g.::

    dev.prepare_model(json.dumps({"latency_ms": 20, "memory_bytes": 5 << 20,
                                  "fail_on_step": 3}).encode())

Every model takes float32 input ``x`` and returns ``y = x + 1``. Driver
options (``[[driver]] options``) set the defaults for every model:
``latency_ms``, ``memory_bytes``, ``fail_message``, ``temperature_c``,
``cache_files`` (model/data cache counts) and ``compile_ms``.

Use it as plugin ``"npumanager.testing.fake_driver:FakeDriver"``. Two broken
plugins for the load-time checks live here too: :class:`OldHalDriver` (speaks
HAL version 0) and :class:`IncompleteDriver` (lacks ``compile``).
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

import numpy as np

from npumanager.drivers.base import (
    CompileOptions,
    Driver,
    DriverCapabilities,
    PreparedModel,
    TensorInfo,
)


class FakeModel(PreparedModel):
    def __init__(self, script: dict[str, Any], source: bytes) -> None:
        self.script = script
        self.source = source
        self.inputs = [TensorInfo("x", "float32", (-1, -1))]
        self.outputs = [TensorInfo("y", "float32", (-1, -1))]
        self.memory_bytes = int(script.get("memory_bytes", 1 << 20))
        self.runs = 0
        self._lock = threading.Lock()
        self._abort = threading.Event()
        self.released = False

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        with self._lock:
            self.runs += 1
            n = self.runs
        latency = float(self.script.get("latency_ms", 0.0)) / 1000.0
        if latency > 0 and self._abort.wait(latency):
            self._abort.clear()
            raise RuntimeError("aborted")
        fail_on = self.script.get("fail_on_step")
        if self.script.get("fail") or (fail_on is not None and n == int(fail_on)):
            raise RuntimeError(str(self.script.get("fail_message", "scripted failure")))
        return {"y": np.asarray(inputs["x"], dtype=np.float32) + 1.0}

    def abort(self) -> None:
        self._abort.set()

    def release(self) -> None:
        self.released = True

    def artifacts(self) -> tuple[list[bytes], list[bytes]]:
        payload = json.dumps(self.script).encode()
        n_model, n_data = self.script.get("cache_files", (0, 0))
        return [payload] * int(n_model), [b"data"] * int(n_data)


class FakeDriver(Driver):
    name = "fake"
    version = "fake-1"

    def capabilities(self) -> DriverCapabilities:
        return DriverCapabilities(backend="fake (scripted)",
                                  memory_bytes=int(self.options.get("device_memory", 8 << 30)))

    def get_number_of_cache_files_needed(self) -> tuple[int, int]:
        counts = self.options.get("cache_files", (0, 0))
        return int(counts[0]), int(counts[1])

    def _script(self, data: bytes) -> dict[str, Any]:
        script = {k: v for k, v in self.options.items() if k != "device_memory"}
        try:
            parsed = json.loads(data)
        except (ValueError, UnicodeDecodeError):
            parsed = None  # real ONNX bytes: the defaults
        if isinstance(parsed, dict):
            script.update(parsed)
        return script

    def compile(self, onnx_bytes: bytes, options: CompileOptions) -> PreparedModel:
        script = self._script(onnx_bytes)
        if script.get("compile_fail"):
            from npumanager.errors import InvalidArgument

            raise InvalidArgument("scripted compile failure")
        if script.get("compile_ms"):
            time.sleep(float(script["compile_ms"]) / 1000.0)
        return FakeModel(script, onnx_bytes)

    def load_artifacts(self, model_blobs: list[bytes], data_blobs: list[bytes],
                       options: CompileOptions) -> PreparedModel:
        script = json.loads(model_blobs[0]) if model_blobs else {}
        return FakeModel(script, b"")

    def temperature(self, now: float, utilization: float) -> float | None:
        t = self.options.get("temperature_c")
        return None if t is None else float(t)


class GatedStartDriver(FakeDriver):
    """Its host is not ready until the file ``options.start_gate`` exists (a host still
    importing its backend, held there as long as a test needs): what npud does while a
    host starts, without a race."""

    def __init__(self, options: dict[str, Any] | None = None) -> None:
        super().__init__(options)
        gate = str(self.options.get("start_gate", ""))
        deadline = time.monotonic() + float(self.options.get("start_gate_max_s", 60.0))
        while gate and not os.path.exists(gate) and time.monotonic() < deadline:
            time.sleep(0.01)


class OldHalDriver(FakeDriver):
    """Implements a HAL version npud does not speak: refused at load."""

    HAL_VERSION = 0


class IncompleteDriver(Driver):
    """Lacks compile (and capabilities): refused at load with the missing names."""

    name = "incomplete"


class TooManyCacheFilesDriver(FakeDriver):
    def get_number_of_cache_files_needed(self) -> tuple[int, int]:
        return 33, 0
