"""ONNX Runtime's side of external data: the bytes the host bound, handed over by reference.

The host resolved a model's external data against the files its client sent
(:mod:`.external_data`); what is left in the model names buffers in
``CompileOptions.external_data`` only. :func:`ort_binding` checks that again
(a reference to anything else is an InvalidArgument, never a file ONNX Runtime
goes looking for) and turns each bound initializer of the main graph into an
``OrtValue`` over those bytes, given to the session with
``SessionOptions.add_external_initializers``: no path anywhere, and no second
copy of the model's weights in the driver. Any other external tensor gets its
bytes inline.

The ONNX Runtime releases we run on (1.18 .. 1.32 measured) copy those
initializers into the session; their documentation still asks callers to keep
the buffers alive with the session. :func:`ort_copies_initializers` asks the
installed release once (a tiny session whose buffer is overwritten after it is
created): when it copies, the model drops its buffers once the session exists
(a 2 GiB model then costs 2 GiB, not 4); when it does not, the model keeps them.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from npumanager.drivers.external_data import BINDABLE, check_bound, put_inline
from npumanager.drivers.onnx_types import Specs, graph_specs
from npumanager.drivers.ort_values import refuse_packed
from npumanager.errors import GeneralFailure, InvalidArgument
from npumanager.tensorio.onnx_external import parse_onnx


@dataclass
class OrtBinding:
    """What a session is created from: the ONNX bytes and the initializers bound to
    buffers (kept alive here)."""

    onnx: bytes
    #: Weight bytes of the model's initializers (the memory estimate's main part).
    weights: int
    #: The graph's inputs and outputs with their ONNX types (None: not ONNX).
    specs: Specs | None = None
    names: list[str] = field(default_factory=list)
    values: list[Any] = field(default_factory=list)
    arrays: list[np.ndarray] = field(default_factory=list)

    #: The buffers were dropped (the session copied them): no recompile from here.
    released: bool = False

    def apply(self, so: Any) -> None:
        if self.released:
            raise GeneralFailure("this model's external data was released after it was "
                                 "compiled")
        if self.names:
            so.add_external_initializers(self.names, self.values)

    def session_created(self) -> None:
        """The session exists: drop the buffers if it holds its own copy of them."""
        if self.names and ort_copies_initializers():
            self.values, self.arrays, self.released = [], [], True


def initializer_bytes(model: Any) -> int:
    """What an ONNX model's initializers take in memory (unknown element types as 4 bytes)."""
    import onnx

    total = 0
    for init in model.graph.initializer:
        n = int(np.prod(init.dims, dtype=np.int64)) if init.dims else 1
        try:
            itemsize = onnx.helper.tensor_dtype_to_np_dtype(init.data_type).itemsize
        except (KeyError, ValueError, TypeError):
            itemsize = 4
        total += n * itemsize
    return total


def ort_binding(onnx_bytes: bytes, external: Mapping[str, np.ndarray]) -> OrtBinding:
    """The session inputs for ``onnx_bytes``; InvalidArgument for external data that is
    not in ``external``. Bytes that are not ONNX pass as they are (ONNX Runtime refuses
    them with its own message)."""
    import onnxruntime as ort

    model = parse_onnx(onnx_bytes)
    if model is None:
        return OrtBinding(onnx_bytes, len(onnx_bytes))
    bound = check_bound(model, external)
    specs = graph_specs(model)
    # Said before ONNX Runtime's own words for it (often a missing kernel: NOT_IMPLEMENTED).
    refuse_packed((s.name, s.dtype) for s in [*specs[0], *specs[1]])
    out = OrtBinding(onnx_bytes, initializer_bytes(model), specs)
    inlined = False
    for ref, data in bound:
        dtype = BINDABLE.get(ref.tensor.data_type)
        itemsize = np.dtype(dtype).itemsize if dtype else 0
        if not (ref.main_initializer and dtype and data.size % itemsize == 0):
            put_inline(ref.tensor, data)
            inlined = True
            continue
        dims = tuple(int(d) for d in ref.tensor.dims)
        if data.size != int(np.prod(dims, dtype=np.int64)) * itemsize:
            raise InvalidArgument(f"tensor {ref.name!r} needs {np.prod(dims)} elements; its "
                                  f"external data {ref.location!r} holds {data.size} bytes")
        if data.ctypes.data % itemsize:
            data = data.copy()  # a misaligned slice: ORT reads elements in place
        arr = data.view(dtype).reshape(dims)
        out.names.append(ref.name)
        out.values.append(ort.OrtValue.ortvalue_from_numpy(arr))
        out.arrays.append(arr)
    if inlined:
        out.onnx = model.SerializeToString()
    return out


@functools.cache
def ort_copies_initializers() -> bool:
    """Whether this ONNX Runtime copies initializers given by ``add_external_initializers``
    (then a session never reads the caller's buffer after it is created)."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    w = TensorProto()
    w.name, w.data_type = "w", TensorProto.FLOAT
    w.dims.append(1)
    w.data_location = TensorProto.EXTERNAL
    for key, value in (("location", "npu-probe"), ("offset", "0"), ("length", "4")):
        entry = w.external_data.add()
        entry.key, entry.value = key, value
    graph = helper.make_graph([helper.make_node("Identity", ["w"], ["y"])], "probe", [],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
                              [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    buf = np.array([1.0], np.float32)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.add_external_initializers(["w"], [ort.OrtValue.ortvalue_from_numpy(buf)])
    try:
        session = ort.InferenceSession(model.SerializeToString(), sess_options=so,
                                       providers=["CPUExecutionProvider"])
        buf[0] = 2.0
        return bool(session.run(None, {})[0][0] == 1.0)
    except Exception:
        return False  # cannot tell: keep the buffers


__all__ = ["OrtBinding", "ort_binding", "ort_copies_initializers"]
