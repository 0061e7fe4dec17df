"""The OpenVINO driver (plugin ``openvino``, extra ``npumanager[openvino]``).

An instance serves one OpenVINO device: the first of the ``devices`` option
(default: every entry of ``ov.Core().available_devices``, so CPU here and GPU
or NPU on Intel machines). A [[driver]] entry whose ``devices`` lists several
is one host process serving each as the device ``NAME:DEVICE``, with an
instance (and ``ov.Core``) per device (hal/host_config.device_entries). GPU
and NPU take exactly this code with another device string.

- Input: ONNX bytes, or an IR bundle (xml + bin, :mod:`.openvino_ir`); both
  are read from memory, never from a path.
- Compile: ``core.compile_model``. The cache artifact is
  ``CompiledModel.export_model()`` (one blob: graph, kernels and weights, cut
  into ``model_cache_files`` pieces; no data cache files). The host verifies
  the blob with its keyed hash and map before :meth:`load_artifacts` hands it
  to ``core.import_model``. OpenVINO's own ``CACHE_DIR`` is kept off: it
  would trust whatever lies in that directory (no integrity check at import;
  a flipped byte in an exported blob still imports here).
- Priority: a priority band (HIGH, MEDIUM, LOW) is mapped onto the device's
  own knobs where the device lists them in ``SUPPORTED_PROPERTIES``
  (:func:`priority_config`): ``MODEL_PRIORITY`` LOW/MEDIUM/HIGH and
  ``WORKLOAD_TYPE`` EFFICIENT for background (GPU/NPU); on the CPU, which has
  neither, background models get ``SCHEDULING_CORE_TYPE=ECORE_ONLY`` (E-cores
  of a hybrid CPU) and no thread pinning. A model is compiled with the band of
  the NNAPI priority it is prepared with; at run time each step runs on a
  variant compiled for its job's band (:func:`job_band`: the HAL's effective
  priority and class), because these knobs are compile-time properties
  (:class:`OvModel`).
- Memory: the device's total memory property where it has one (GPU, NPU);
  the CPU has none, so it reports physical RAM (``capabilities().extra``
  says which).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping
from typing import Any

import numpy as np

from npumanager.drivers.base import (
    CompileOptions,
    Driver,
    DriverCapabilities,
    PreparedModel,
    TensorInfo,
)
from npumanager.drivers.onnx_types import Specs, onnx_specs
from npumanager.drivers.openvino_ir import (
    check_onnx_self_contained,
    is_ir_bundle,
    unpack_ir,
    with_external_inline,
)
from npumanager.drivers.openvino_values import OV_TO_ML, from_ov, to_ov
from npumanager.errors import GeneralFailure, InvalidArgument

log = logging.getLogger("npumanager.drivers.openvino")

#: Driver option ``execution_mode`` -> ov::hint::execution_mode. "accuracy" (the default)
#: runs a model in its own precision. "performance" lets the device lower it: OpenVINO's
#: CPU plugin runs an f32 model in bf16 on CPUs with AMX or AVX512_BF16 (on such a CPU
#: here, a conv net's outputs moved 0.2-1.5 % from ONNX Runtime's, past the 1e-3 the
#: tests allow; GPUs lower to f16 in the same way). An app that asked for an f32 model gets
#: f32 results unless the device's admin opts in.
EXECUTION_MODES = {"accuracy": "ACCURACY", "performance": "PERFORMANCE"}

#: NNAPI priority (nn.Priority) -> ov::hint::model_priority.
MODEL_PRIORITY = {90: "LOW", 100: "MEDIUM", 110: "HIGH"}
#: The properties priority_config may set (a variant's config replaces all of them).
PRIORITY_KEYS = ("MODEL_PRIORITY", "WORKLOAD_TYPE", "SCHEDULING_CORE_TYPE",
                 "ENABLE_CPU_PINNING")
#: A model variant: its priority knobs, and whether it serves background work.
VariantKey = tuple[tuple[tuple[str, str], ...], bool]
#: A job's effective priority at or below this (FOREGROUND_SERVICE) runs as HIGH.
HIGH_BAND_MAX = 125


def job_band(effective_priority: int, background: bool) -> int:
    """The NNAPI priority (90/100/110) whose knobs a step runs under: BACKGROUND work LOW,
    a foreground app's own work (effective priority up to FOREGROUND_SERVICE) HIGH, other
    foreground work MEDIUM. ``effective_priority`` < 0: not known (MEDIUM)."""
    if background:
        return 90
    return 110 if 0 <= effective_priority <= HIGH_BAND_MAX else 100
#: Device properties that give the device's memory, in order of preference.
MEMORY_PROPERTIES = ("GPU_DEVICE_TOTAL_MEM_SIZE", "NPU_DEVICE_TOTAL_MEM_SIZE")


def priority_config(supported: set[str], priority: int) -> dict[str, Any]:
    """The OpenVINO properties that carry ``priority`` (90/100/110) to this device.

    Only properties the device lists are set: a plugin refuses the others.
    """
    background = priority < 100
    cfg: dict[str, Any] = {}
    if "MODEL_PRIORITY" in supported:
        cfg["MODEL_PRIORITY"] = MODEL_PRIORITY.get(priority, "MEDIUM")
    if "WORKLOAD_TYPE" in supported:
        cfg["WORKLOAD_TYPE"] = "EFFICIENT" if background else "DEFAULT"
    if background and "SCHEDULING_CORE_TYPE" in supported:
        cfg["SCHEDULING_CORE_TYPE"] = "ECORE_ONLY"  # falls back to all cores if not hybrid
    if background and "ENABLE_CPU_PINNING" in supported:
        cfg["ENABLE_CPU_PINNING"] = False  # let the kernel place background threads
    return cfg


def device_memory(core: Any, device: str, supported: set[str]) -> tuple[int, str]:
    """(bytes, where the number came from) for the MEMORY policy."""
    for prop in MEMORY_PROPERTIES:
        if prop in supported:
            try:
                return int(core.get_property(device, prop)), f"OpenVINO {prop}"
            except Exception as exc:  # a property listed but failing: fall through
                log.warning("%s: %s unreadable: %s", device, prop, exc)
    try:
        phys = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        phys = 8 << 30
    return int(phys), f"physical RAM ({device} reports no device memory property)"


#: OpenVINO element types whose numpy dtype (``Type.to_dtype``) is exact; the others map to
#: a stand-in (bf16 -> float16, i4 -> int8, string -> |S0, f8 -> uint8) or to none (dynamic):
#: those ml_dtypes has are that type (:mod:`.openvino_values`), the rest unknown.
_EXACT_TYPES = {"f16", "f32", "f64", "i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64",
                "boolean"}


def _dtype(port: Any) -> str:
    """The port's numpy dtype name, or "" (unknown: inputs are not checked against it)
    where numpy has no exact counterpart."""
    et = port.get_element_type()
    if et.get_type_name() not in _EXACT_TYPES:
        return OV_TO_ML.get(et.get_type_name(), "")
    try:
        return str(np.dtype(et.to_dtype()))
    except Exception:
        return ""


def _shape(port: Any) -> tuple[int, ...]:
    return tuple(
        d.get_length() if d.is_static else -1 for d in port.get_partial_shape()
    )


def _name(port: Any, i: int, kind: str, known: frozenset[str] = frozenset()) -> str:
    """The ONNX name of a port. A port may carry several tensor names (an expanded
    function's inner names too, or an output's where the graph passes an input through):
    the one the ONNX graph gives (``known``) when the graph is at hand, else its node's
    friendly name (a Parameter's; a Result's without its "/sink_port_0"), which survives
    export."""
    names = port.get_names()
    graph_names = sorted(names & known)
    if len(graph_names) == 1:
        return str(graph_names[0])
    friendly = str(port.get_node().get_friendly_name())
    if kind == "output":
        friendly = friendly.rsplit("/sink_port_", 1)[0]
    if friendly in names:
        return friendly
    ordered = sorted(names)
    return ordered[0] if ordered else f"{kind}{i}"


def _split(blob: bytes, n: int) -> list[bytes]:
    if n == 1:
        return [blob]
    step = -(-len(blob) // n) if blob else 0
    return [blob[i * step : (i + 1) * step] for i in range(n)]


class OvModel(PreparedModel):
    """A compiled (or imported) OpenVINO model; one infer request per worker thread.

    The job's priority at run time (:meth:`begin_step`): OpenVINO's priority knobs are
    compile-time properties (on the CPU every property of a compiled model is read-only;
    ``set_property`` raises), so each step runs on a *variant* of the model compiled with
    the knobs of its band (:func:`job_band`, :func:`priority_config`). The variant
    prepared is the first; another is made the first time a step of its band comes, by
    importing the model's own ``export_model`` blob with that config, on the step's
    thread. On the CPU that thread matters: the inference runs on OpenVINO's stream
    threads, created at compile/import, and a thread inherits its creator's nice value,
    so a variant made on the host's lowered background thread runs at that nice value
    (``compiled_on_nice`` in :meth:`backend_state`). Variants share nothing: each holds
    its own copy of the weights."""

    def __init__(self, compiled: Any, memory_bytes: int, n_model_cache: int,
                 config: dict[str, Any], graph: Specs | None = None, *,
                 driver: OpenVinoDriver | None = None, priority: int = 100,
                 background: bool = False) -> None:
        self.compiled = compiled
        self._driver = driver
        self._band = priority if priority in MODEL_PRIORITY else 100
        self._base = {k: v for k, v in config.items() if k not in PRIORITY_KEYS}
        key = (self._key(config), background)
        #: Variant key (its priority knobs, made for background work: on a lowered thread)
        #: -> compiled model; the prepared one first.
        self._variants: dict[VariantKey, Any] = {key: compiled}
        self._variant_info: dict[VariantKey, dict[str, Any]] = {
            key: self._describe(compiled, config, background)}
        self._steps: dict[str, int] = {}
        #: The verified blob an imported model came from: its variants are imported from
        #: it (an imported model's own export_model() here is a blob import_model cannot
        #: read back: "Unable to read the model", OpenVINO 2026.4).
        self.source_blob: bytes | None = None
        graph_in = frozenset(s.name for s in graph[0]) if graph else frozenset()
        graph_out = frozenset(s.name for s in graph[1]) if graph else frozenset()
        self.inputs = [
            TensorInfo(_name(p, i, "input", graph_in), _dtype(p), _shape(p))
            for i, p in enumerate(compiled.inputs)
        ]
        # ONNX inputs OpenVINO found no use for (it compiled no port for them): taken, as
        # ONNX Runtime takes them, and not passed on.
        self._ports = frozenset(i.name for i in self.inputs)
        self.inputs += [s for s in (graph[0] if graph else []) if s.name not in self._ports]
        self.outputs = [
            TensorInfo(_name(p, i, "output", graph_out), _dtype(p), _shape(p))
            for i, p in enumerate(compiled.outputs)
        ]
        self.memory_bytes = memory_bytes
        self.config = dict(config)  # what compile/import was given (tests read it)
        self._n_model_cache = n_model_cache
        self._local = threading.local()
        self._running: set[Any] = set()
        self._lock = threading.Lock()
        self._make_lock = threading.Lock()

    @staticmethod
    def _key(config: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
        return tuple(sorted((k, str(v)) for k, v in config.items() if k in PRIORITY_KEYS))

    @staticmethod
    def _describe(compiled: Any, config: Mapping[str, Any], background: bool
                  ) -> dict[str, Any]:
        """The knobs asked for, what the compiled model reports for them, and the nice
        value of the thread that made it (its stream threads inherit it)."""
        read_back: dict[str, str] = {}
        for k in PRIORITY_KEYS:
            try:
                read_back[k] = str(compiled.get_property(k))
            except Exception:  # not a property of this device's compiled models
                continue
        try:
            nice = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        except OSError:
            nice = 0
        return {"config": {k: str(v) for k, v in config.items() if k in PRIORITY_KEYS},
                "background": background,
                "read_back": read_back, "compiled_on_nice": nice, "bands": []}

    def begin_step(self, effective_priority: int, background: bool) -> None:
        band = job_band(effective_priority, background)
        label = MODEL_PRIORITY[band]
        drv = self._driver
        if drv is None:  # no driver to make variants with: the prepared one serves all
            key = next(iter(self._variants))
        else:
            knobs = priority_config(drv.supported, band)
            key = (self._key(knobs), background)
        with self._lock:
            self._steps[label] = self._steps.get(label, 0) + 1
            compiled = self._variants.get(key)
        if compiled is None:
            assert drv is not None
            compiled = self._make_variant(drv, key, {**self._base, **knobs})
        self._local.key = key
        info = self._variant_info[key]
        if label not in info["bands"]:
            with self._lock:
                if label not in info["bands"]:
                    info["bands"].append(label)

    def _make_variant(self, drv: OpenVinoDriver, key: VariantKey,
                      config: dict[str, Any]) -> Any:
        with self._make_lock:  # one import per variant, whichever thread comes first
            compiled = self._variants.get(key)
            if compiled is not None:
                return compiled
            base = self.compiled
            if base is None or drv.core is None:
                raise GeneralFailure("the model was released")
            blob = self.source_blob
            if blob is None:
                exported = base.export_model()
                blob = (exported.getvalue() if hasattr(exported, "getvalue")
                        else bytes(exported))
            try:
                compiled = drv.core.import_model(blob, drv.device, config)
            except Exception as exc:
                raise GeneralFailure(f"OpenVINO cannot make the {dict(key[0])} variant: "
                                     f"{exc}") from None
            info = self._describe(compiled, config, key[1])
            with self._lock:
                self._variant_info[key] = info
                self._variants[key] = compiled
            return compiled

    def backend_state(self) -> dict[str, Any]:
        with self._lock:
            return {"prepared_as": MODEL_PRIORITY[self._band],
                    "steps": dict(self._steps),  # per band: HIGH, MEDIUM, LOW
                    "variants": [dict(v, bands=list(v["bands"]))
                                 for v in self._variant_info.values()]}

    def _request(self) -> Any:
        key = getattr(self._local, "key", None)
        requests: dict[Any, Any] | None = getattr(self._local, "requests", None)
        if requests is None:
            requests = self._local.requests = {}
        req = requests.get(key)
        if req is None:
            compiled = self._variants.get(key) if key is not None else self.compiled
            if compiled is None or self.compiled is None:
                raise GeneralFailure("the model was released")
            req = requests[key] = compiled.create_infer_request()
        return req

    def run(self, inputs: dict[str, Any]) -> dict[str, Any]:
        req = self._request()
        ports = self._ports
        feed = {name: to_ov(arr) for name, arr in inputs.items() if name in ports}
        with self._lock:
            self._running.add(req)
        try:
            # Asynchronous start + wait, so abort() can cancel a run in progress.
            req.start_async(feed, share_inputs=True)
            req.wait()
        finally:
            with self._lock:
                self._running.discard(req)
        return {
            info.name: from_ov(req.get_output_tensor(i), info.dtype)
            for i, info in enumerate(self.outputs)
        }

    def abort(self) -> None:
        with self._lock:
            running = list(self._running)
        for req in running:
            try:
                req.cancel()
            except Exception:  # finished meanwhile
                pass

    def release(self) -> None:
        self.compiled = None
        with self._lock:
            self._variants.clear()
        self._local = threading.local()

    def artifacts(self) -> tuple[list[bytes], list[bytes]]:
        if self.compiled is None:
            raise GeneralFailure("the model was released")
        blob = self.compiled.export_model()
        data = blob.getvalue() if hasattr(blob, "getvalue") else bytes(blob)
        return _split(data, self._n_model_cache), []


class OpenVinoDriver(Driver):
    name = "openvino"
    accepts_external_data = True

    def __init__(self, options: dict[str, Any] | None = None) -> None:
        super().__init__(options)
        import openvino as ov

        self.core = ov.Core()
        # Our verified cache is the cache: OpenVINO's own would load unverified blobs.
        self.core.set_property({"CACHE_DIR": ""})
        available = [str(d) for d in self.core.available_devices]
        wanted = self.options.get("devices") or available
        if isinstance(wanted, str):
            wanted = [wanted]
        self.devices = [str(d) for d in wanted]
        missing = [d for d in self.devices if d not in available]
        if not self.devices or missing:
            raise InvalidArgument(
                f"OpenVINO reports devices {available}; asked for {self.devices}"
            )
        if len(self.devices) > 1:
            # A config listing several devices gets a driver instance per device (npud
            # expands the entry: hal/host_config.device_entries); an instance made
            # with several directly serves the first.
            log.warning("openvino: this instance serves %s only", self.devices[0])
        self.device = self.devices[0]
        self.supported = {str(p) for p in self.core.get_property(self.device,
                                                                 "SUPPORTED_PROPERTIES")}
        arch = self._prop("DEVICE_ARCHITECTURE") or self.device
        mode = str(self.options.get("execution_mode", "accuracy"))
        if mode not in EXECUTION_MODES:
            raise InvalidArgument(f"openvino execution_mode must be one of "
                                  f"{', '.join(EXECUTION_MODES)}, not {mode!r}")
        self.execution_mode = mode
        # The blob is specific to the OpenVINO build, the device and the precision it was
        # compiled for: all three key the cache.
        self.version = f"1.0+ov{ov.__version__}+{self.device}:{arch}+{mode}"
        self.full_name = self._prop("FULL_DEVICE_NAME") or self.device
        self.memory_bytes, self.memory_source = device_memory(self.core, self.device,
                                                              self.supported)
        if "memory_bytes" in self.options:
            self.memory_bytes = int(self.options["memory_bytes"])
            self.memory_source = "driver option memory_bytes"
        self.n_model_cache = int(self.options.get("model_cache_files", 1))

    def _prop(self, key: str) -> str | None:
        if key not in getattr(self, "supported", set()):
            return None
        try:
            return str(self.core.get_property(self.device, key))
        except Exception:
            return None

    def capabilities(self) -> DriverCapabilities:
        import openvino as ov

        knobs = sorted(priority_config(self.supported, 90)) or ["none"]
        return DriverCapabilities(
            backend=f"openvino {ov.__version__} {self.device} ({self.full_name})",
            memory_bytes=self.memory_bytes,
            extra={"device": self.device, "devices": list(self.devices),
                   "memory_source": self.memory_source, "priority_knobs": knobs},
        )

    def get_number_of_cache_files_needed(self) -> tuple[int, int]:
        return self.n_model_cache, 0

    def compile_config(self, options: CompileOptions) -> dict[str, Any]:
        """Properties for compile_model/import_model: hint, streams, threads, priority."""
        cfg: dict[str, Any] = {}
        if "PERFORMANCE_HINT" in self.supported:
            cfg["PERFORMANCE_HINT"] = "THROUGHPUT" if options.preference == 2 else "LATENCY"
        # Two streams by default so the host's channels run at once (CPU).
        streams = self.options.get("num_streams", 2 if self.device == "CPU" else None)
        if streams is not None and "NUM_STREAMS" in self.supported:
            cfg["NUM_STREAMS"] = int(streams)
        threads = self.options.get("inference_num_threads")
        if threads is not None and "INFERENCE_NUM_THREADS" in self.supported:
            cfg["INFERENCE_NUM_THREADS"] = int(threads)
        if "EXECUTION_MODE_HINT" in self.supported:
            cfg["EXECUTION_MODE_HINT"] = EXECUTION_MODES[self.execution_mode]
        cfg.update(priority_config(self.supported, options.priority))
        return cfg

    def read_model(self, model_bytes: bytes, external: Mapping[str, Any] | None = None) -> Any:
        """An ov.Model from ONNX bytes (with the external data the host bound for it) or an
        IR bundle (InvalidArgument otherwise)."""
        import openvino as ov

        try:
            if external:
                model_bytes = with_external_inline(model_bytes, external)
            if is_ir_bundle(model_bytes):
                xml, weights = unpack_ir(model_bytes)
                tensor = ov.Tensor(np.frombuffer(weights, np.uint8).copy())
                return self.core.read_model(bytes(xml).decode("utf-8"), tensor)
            check_onnx_self_contained(model_bytes)
            return self.core.read_model(model_bytes)
        except InvalidArgument:
            raise
        except Exception as exc:
            raise InvalidArgument(f"OpenVINO cannot read this model: {exc}") from None

    def compile(self, onnx_bytes: bytes, options: CompileOptions) -> PreparedModel:
        model = self.read_model(onnx_bytes, options.external_data)
        cfg = self.compile_config(options)
        try:
            compiled = self.core.compile_model(model, self.device, cfg)
        except Exception as exc:
            raise InvalidArgument(f"OpenVINO cannot compile this model for {self.device}: "
                                  f"{exc}") from None
        weights = sum(int(op.get_byte_size()) for op in model.get_ops()
                      if op.get_type_name() == "Constant")
        prepared = OvModel(compiled, 0, self.n_model_cache, cfg, graph=self._graph(onnx_bytes),
                           driver=self, priority=options.priority,
                           background=options.background)
        prepared.memory_bytes = weights + self._io_bytes(prepared) + (1 << 20)
        return prepared

    def load_artifacts(self, model_blobs: list[bytes], data_blobs: list[bytes],
                       options: CompileOptions) -> PreparedModel:
        """Import a verified ``export_model`` blob (only called after verification)."""
        if data_blobs:
            raise GeneralFailure("the OpenVINO driver keeps no data cache files")
        blob = model_blobs[0] if len(model_blobs) == 1 else b"".join(model_blobs)
        if not blob:
            raise GeneralFailure("empty model cache")
        cfg = self.compile_config(options)
        try:
            compiled = self.core.import_model(blob, self.device, cfg)
        except Exception as exc:
            raise GeneralFailure(f"OpenVINO cannot import the cached model: {exc}") from None
        prepared = OvModel(compiled, 0, self.n_model_cache, cfg, driver=self,
                           priority=options.priority, background=options.background)
        prepared.source_blob = blob
        prepared.memory_bytes = len(blob) + self._io_bytes(prepared) + (1 << 20)
        return prepared

    @staticmethod
    def _graph(model_bytes: bytes) -> Specs | None:
        """The ONNX graph's inputs and outputs (None for an IR bundle)."""
        if is_ir_bundle(model_bytes):
            return None
        try:
            return onnx_specs(model_bytes)
        except Exception:
            return None

    @staticmethod
    def _io_bytes(model: OvModel) -> int:
        return 2 * sum(t.static_nbytes() or 0 for t in [*model.inputs, *model.outputs])

    def close(self) -> None:
        self.core = None


__all__ = ["MODEL_PRIORITY", "OpenVinoDriver", "OvModel", "device_memory", "job_band",
           "priority_config"]
