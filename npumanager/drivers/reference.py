"""The reference driver: real ONNX models on the CPU with ONNX Runtime.

It also carries a first-order thermal model so thermal management works (and
demos) on any machine: the temperature approaches ``ambient + (max - ambient)
* utilization`` exponentially with time constant ``thermal_tau_s``.
Compilation caching hooks (``artifacts``/``load_artifacts``) are filled in by
the cache modules when present.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from npumanager.drivers.base import (
    CompileOptions,
    Driver,
    DriverCapabilities,
    PreparedModel,
)
from npumanager.drivers.device_queue import DeviceQueue
from npumanager.drivers.lowering import native
from npumanager.drivers.onnx_types import Specs, onnx_specs, session_specs
from npumanager.drivers.ort_tuning import SessionTuning
from npumanager.drivers.ort_values import refuse_packed, run_values, typed_io
from npumanager.drivers.reference_external import OrtBinding, ort_binding
from npumanager.errors import InvalidArgument
from npumanager.tensorio.dtypes import ONNX_TO_NUMPY

# ONNX Runtime element type strings -> numpy dtype names (for an estimate from a session).
_ORT_TYPES = {f"tensor({k})": v for k, v in ONNX_TO_NUMPY.items()}


def _shape(dims: list[Any]) -> tuple[int, ...]:
    return tuple(d if isinstance(d, int) and d >= 0 else -1 for d in dims)


def _caching_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("npumanager.drivers.cache_artifacts") is not None


def _memory(weights: int, specs: Specs) -> int:
    """Weights as stored, plus an arena estimate: every static input and output twice
    (ORT's allocations for them and their intermediates' peak)."""
    io = sum(t.static_nbytes() or 0 for t in [*specs[0], *specs[1]])
    return weights + 2 * io + (1 << 20)


class ThermalModel:
    """First-order heating/cooling (Newton's law) driven by channel utilization."""

    def __init__(self, ambient_c: float, max_c: float, tau_s: float) -> None:
        self.ambient_c = ambient_c
        self.max_c = max_c
        self.tau_s = max(tau_s, 1e-3)
        self.celsius = ambient_c
        self._last: float | None = None

    def update(self, now: float, utilization: float) -> float:
        if self._last is not None and now > self._last:
            u = min(max(utilization, 0.0), 1.0)
            target = self.ambient_c + (self.max_c - self.ambient_c) * u
            k = 1.0 - math.exp(-(now - self._last) / self.tau_s)
            self.celsius += (target - self.celsius) * k
        self._last = now if self._last is None else max(self._last, now)
        return self.celsius


class OrtModel(PreparedModel):
    #: (model, data) cache files artifacts() splits into (set by the driver).
    cache_counts: tuple[int, int] = (1, 1)
    #: The one-queue device emulation's token (option ``device_queue_lock``; benchmarks
    #: only, drivers/device_queue.py), held around each native run; None: runs as they come.
    queue: DeviceQueue | None = None

    def __init__(self, session: Any, memory_bytes: int, serialized: bytes | None,
                 specs: Specs | None = None, binding: OrtBinding | None = None) -> None:
        self.session = session
        #: The model's external data as the host bound it (kept while ONNX Runtime may
        #: read it; the artifacts of a later cache save are compiled from it too).
        self.binding = binding
        if specs is None:
            # The graph's types when the source is at hand (a scalar and an unknown rank
            # look alike in ONNX Runtime's NodeArg), else the session's.
            specs = onnx_specs(serialized) if serialized else session_specs(session)
        self.inputs, self.outputs = specs
        io = [(spec.name, spec.dtype) for spec in [*self.inputs, *self.outputs]]
        refuse_packed(io)
        #: bfloat16 or float8 inputs or outputs: run through OrtValues (drivers/ort_values).
        self._typed = typed_io(dtype for _, dtype in io)
        self._output_names = [o.name for o in self.outputs]
        self.memory_bytes = memory_bytes
        self._serialized = serialized
        self._lock = threading.Lock()
        self._local = threading.local()
        self._run_options: set[Any] = set()

    def _options(self) -> Any:
        """This thread's RunOptions (reused: creating one per run costs more than a tiny
        model's run), registered while it runs so ``abort`` can reach it."""
        opts = getattr(self._local, "opts", None)
        if opts is None:
            import onnxruntime as ort

            opts = self._local.opts = ort.RunOptions()
            # ONNX Runtime's run_with_iobinding (Python) asks the options for this entry on
            # every run; unset, its lookup raises and catches a C++ exception: 80 µs of a
            # tiny model's 86 µs bound run, 100 µs after an idle gap (session.run asks only
            # when WebGPU graph capture is on). -1 is "no graph capture", what a CPU
            # session does anyway.
            opts.add_run_config_entry("gpu_graph_id", "-1")
        opts.terminate = False
        return opts

    def run(self, inputs: dict[str, Any]) -> dict[str, Any]:
        opts = self._options()
        self._run_options.add(opts)
        queue = self.queue
        if queue is not None:
            queue.acquire()
        try:
            if self._typed:
                outs = run_values(self.session, self._output_names, inputs, opts)
            else:
                outs = self.session.run(self._output_names, inputs, opts)
        finally:
            if queue is not None:
                queue.release()
            self._run_options.discard(opts)
        return dict(zip(self._output_names, outs, strict=True))

    def run_into(self, inputs: dict[str, Any], outputs: dict[str, np.ndarray]
                 ) -> dict[str, Any]:
        if not all(type(a) is np.ndarray and a.dtype.kind in "biuf" for a in inputs.values()):
            # Sequences, maps, optionals, strings: no IO binding for them; run and copy.
            return super().run_into(inputs, outputs)
        # IO binding: ORT reads the inputs and writes the bound outputs in place.
        io = self.session.io_binding()
        for name, arr in inputs.items():
            io.bind_cpu_input(name, np.ascontiguousarray(arr))
        for name in self._output_names:
            dest = outputs.get(name)
            if dest is None:
                io.bind_output(name, "cpu")
            else:
                io.bind_output(name, "cpu", 0, dest.dtype, list(dest.shape), dest.ctypes.data)
        opts = self._options()
        self._run_options.add(opts)
        queue = self.queue
        if queue is not None:
            queue.acquire()
        try:
            self.session.run_with_iobinding(io, opts)
        finally:
            if queue is not None:
                queue.release()
            self._run_options.discard(opts)
        values = io.get_outputs()
        out: dict[str, np.ndarray] = {}
        for name, value in zip(self._output_names, values, strict=True):
            dest = outputs.get(name)
            out[name] = dest if dest is not None else value.numpy()
        return out

    def bind(self, inputs: dict[str, Any], outputs: dict[str, np.ndarray]
             ) -> Callable[[], dict[str, Any]] | None:
        """IO binding made once: ONNX Runtime reads the inputs and writes every output
        where the arrays lie, so a run is one call with no per-run binding, validation or
        numpy allocation (the arrays stay alive with the returned run)."""
        session = self.session
        if session is None or set(outputs) != set(self._output_names):
            return None
        arrays = [*inputs.values(), *outputs.values()]
        if not all(type(a) is np.ndarray and a.dtype.kind in "biuf" and a.flags.c_contiguous
                   for a in arrays):
            return None
        try:
            io = session.io_binding()
            for name, arr in inputs.items():
                io.bind_input(name, "cpu", 0, arr.dtype, list(arr.shape), arr.ctypes.data)
            for name in self._output_names:
                dest = outputs[name]
                io.bind_output(name, "cpu", 0, dest.dtype, list(dest.shape), dest.ctypes.data)
        except Exception:  # a type ONNX Runtime cannot bind: run_into each time
            return None
        result = {name: outputs[name] for name in self._output_names}
        run_with_iobinding = session.run_with_iobinding
        options, running = self._options, self._run_options
        held = (io, arrays)  # the arrays ONNX Runtime points into live as long as the run

        def run() -> dict[str, Any]:
            opts = options()
            running.add(opts)
            try:
                run_with_iobinding(held[0], opts)
            finally:
                running.discard(opts)
            return result

        queue = self.queue
        if queue is None:
            return run

        def queued() -> dict[str, Any]:
            with queue:
                return run()

        return queued

    def abort(self) -> None:
        # ORT checks the flag between kernels, so a long run ends early with an error.
        for opts in list(self._run_options):
            opts.terminate = True

    def release(self) -> None:
        self.session = None
        self._serialized = None
        self.binding = None

    def artifacts(self) -> tuple[list[bytes], list[bytes]]:
        from npumanager.drivers import cache_artifacts  # written by the cache engineer

        return cache_artifacts.reference_artifacts(self)


class ReferenceDriver(Driver):
    name = "reference"
    accepts_external_data = True

    def __init__(self, options: dict[str, Any] | None = None) -> None:
        super().__init__(options)
        import onnxruntime as ort

        self.version = f"1.0+ort{ort.__version__}"
        self.intra_op_threads = int(self.options.get("intra_op_threads", 1))
        # Per execution class (drivers/classes.py); each defaults to intra_op_threads.
        self.intra_op_threads_fg = int(self.options.get("intra_op_threads_foreground",
                                                        self.intra_op_threads))
        self.intra_op_threads_bg = int(self.options.get("intra_op_threads_background",
                                                        self.intra_op_threads))
        # Whether a session's intra-op pool spins for work (1: ONNX Runtime's default), per
        # class as above. Spinning, a 2-thread pool keeps a second core busy between a
        # session's kernels; without it the pool's threads block, and each kernel wakes
        # them (bench/README.md: intra_op_spinning).
        self.intra_op_spinning = int(self.options.get("intra_op_spinning", 1)) != 0
        self.intra_op_spinning_fg = int(self.options.get("intra_op_spinning_foreground",
                                                         self.intra_op_spinning)) != 0
        self.intra_op_spinning_bg = int(self.options.get("intra_op_spinning_background",
                                                         self.intra_op_spinning)) != 0
        # ONNX Runtime's session options for background sessions (drivers/ort_tuning.py:
        # opt-ins measured for the embedder; bench/README.md: "ONNX Runtime's session options").
        self.tuning_bg = SessionTuning.background(self.options)
        self.version += self.tuning_bg.version_tag()
        self.thermal = ThermalModel(
            ambient_c=float(self.options.get("ambient_c", 35.0)),
            max_c=float(self.options.get("max_c", 95.0)),
            tau_s=float(self.options.get("thermal_tau_s", 30.0)),
        )
        try:
            phys = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError):
            phys = 8 << 30
        self.memory_bytes = int(self.options.get("memory_bytes", phys))
        self.n_model_cache = int(self.options.get("model_cache_files", 1))
        self.n_data_cache = int(self.options.get("data_cache_files", 1))
        # Logical devices (``devices = ["a", "b"]``: one host serving each as a device of
        # its own, hal/host_config.device_entries): ONNX Runtime on the same CPU cores,
        # with a budget, channels, queue and cache map each; not separate silicon.
        wanted = self.options.get("devices") or []
        self.device = str(wanted[0] if isinstance(wanted, list) and wanted else "CPU")
        # A one-queue device emulated for benchmarks (drivers/device_queue.py): every
        # native run holds this machine-wide token. Not an NPU: the runs stay on the CPU.
        queue_path = str(self.options.get("device_queue_lock", ""))
        self.queue = DeviceQueue(queue_path) if queue_path else None

    def capabilities(self) -> DriverCapabilities:
        import onnxruntime as ort

        where = "CPU" if self.device == "CPU" else f"CPU (logical device {self.device})"
        return DriverCapabilities(
            backend=f"onnxruntime {ort.__version__} {where}", memory_bytes=self.memory_bytes,
            extra={"device": self.device},
        )

    def get_number_of_cache_files_needed(self) -> tuple[int, int]:
        if not _caching_available():
            return 0, 0
        return self.n_model_cache, self.n_data_cache

    def session_options(self, options: CompileOptions) -> Any:
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = (self.intra_op_threads_bg if options.background
                                   else self.intra_op_threads_fg)
        so.inter_op_num_threads = 1
        so.log_severity_level = 3
        if not (self.intra_op_spinning_bg if options.background else self.intra_op_spinning_fg):
            from npumanager.drivers.reference_cache import no_spinning

            no_spinning(so)
        # LOW_POWER (0) asks for less work at compile time; the others optimize fully.
        so.graph_optimization_level = (
            ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
            if options.preference == 0
            else ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        )
        if options.background:
            tuning = self.tuning_bg
            if tuning.level is not None:
                from npumanager.drivers.reference_cache import ort_level

                so.graph_optimization_level = ort_level(tuning.level)
            tuning.apply(so)
        return so

    def tuning(self, options: CompileOptions) -> SessionTuning | None:
        """The session options a model of ``options``'s class gets beyond the defaults."""
        return self.tuning_bg if options.background and not self.tuning_bg.default else None

    def compile(self, onnx_bytes: bytes, options: CompileOptions) -> PreparedModel:
        import onnxruntime as ort

        mode = str(self.options.get("compile_mode", "eager"))
        if mode != "eager":  # JIT / multi-stage (cache engineer's drivers/staged.py)
            from npumanager.drivers import cache_artifacts

            return cache_artifacts.reference_staged(self, onnx_bytes, options, mode)
        # One parse: external data checked against what the host bound (nothing else is
        # looked for), weights and the graph's types.
        binding = ort_binding(onnx_bytes, options.external_data)
        so = self.session_options(options)
        binding.apply(so)
        try:
            with native():  # (a background thread lowered only for native work: .lowering)
                session = ort.InferenceSession(binding.onnx, sess_options=so,
                                               providers=["CPUExecutionProvider"])
        except Exception as exc:
            raise InvalidArgument(f"ONNX Runtime cannot prepare this model: {exc}") from None
        binding.session_created()
        return self.prepared(session, onnx_bytes, binding)

    def prepared(self, session: Any, onnx_bytes: bytes, binding: OrtBinding) -> OrtModel:
        """The prepared model of a session compiled from ``binding``."""
        specs = binding.specs or session_specs(session)
        model = OrtModel(session, _memory(binding.weights, specs), onnx_bytes, specs, binding)
        model.cache_counts = (self.n_model_cache, self.n_data_cache)  # for artifacts()
        model.queue = self.queue
        return model

    def compile_with_artifacts(self, onnx_bytes: bytes, options: CompileOptions) -> PreparedModel:
        """compile() that also produces the cache artifacts (one compile instead of two)."""
        from npumanager.drivers import cache_artifacts

        return cache_artifacts.reference_compile_with_artifacts(self, onnx_bytes, options)

    def compile_in_worker(self, worker: Any, onnx: bytes | tuple[int, int],
                          options: CompileOptions,
                          caching: bool, max_bytes: int) -> PreparedModel | None:
        """Compile in the host's compile worker (drivers/compile_worker.py) and load the
        result as a cache entry; None where only this process can compile it."""
        from npumanager.drivers import cache_artifacts

        return cache_artifacts.reference_worker_compile(self, worker, onnx, options, caching,
                                                        max_bytes)

    def load_artifacts(
        self, model_blobs: list[bytes], data_blobs: list[bytes], options: CompileOptions
    ) -> PreparedModel:
        from npumanager.drivers import cache_artifacts  # written by the cache engineer

        return cache_artifacts.reference_load(
            self, model_blobs, data_blobs, options
        )

    def temperature(self, now: float, utilization: float) -> float | None:
        return self.thermal.update(now, utilization)
