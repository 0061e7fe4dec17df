"""ONNX Runtime's Python API and the element types numpy lacks (bfloat16, float8).

``InferenceSession.run`` takes numpy arrays and maps their dtype to an ONNX type itself:
it knows no ml_dtypes dtype ("Numpy_type 256 can't be converted to MLDataType" for a
bfloat16 input) and returns no such output ("No corresponding Numpy type for Tensor
Type. bfloat16"), although the CPU provider runs these types (Identity, Cast, MatMul
for bfloat16, ...). An app gives them as ``OrtValue``s made with their ONNX type and
reads the output's bytes back; so does the reference driver, for a model whose graph
inputs or outputs are of such a type (every other model runs as before).

ONNX Runtime packs the 4- and 2-bit types two or four to a byte, where ml_dtypes (and
so npumanager's tensors) hold one element per byte: those stay refused, in words.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from npumanager.errors import InvalidArgument

#: ml_dtypes' names -> ONNX TensorProto element types ONNX Runtime takes as OrtValues.
TYPED = {
    "bfloat16": 16,
    "float8_e4m3fn": 17,
    "float8_e4m3fnuz": 18,
    "float8_e5m2": 19,
    "float8_e5m2fnuz": 20,
    "float8_e8m0fnu": 24,
}
#: ONNX Runtime's type strings of those -> ml_dtypes' names.
_FROM_ORT = {
    "tensor(bfloat16)": "bfloat16",
    "tensor(float8e4m3fn)": "float8_e4m3fn",
    "tensor(float8e4m3fnuz)": "float8_e4m3fnuz",
    "tensor(float8e5m2)": "float8_e5m2",
    "tensor(float8e5m2fnuz)": "float8_e5m2fnuz",
    "tensor(float8e8m0)": "float8_e8m0fnu",
}
#: Packed in ONNX Runtime, one per byte in ml_dtypes.
PACKED = frozenset({"uint4", "int4", "float4_e2m1fn", "uint2", "int2", "float6_e2m3fn",
                    "float6_e3m2fn"})


def typed_io(dtypes: Iterable[str]) -> bool:
    """Whether a model with graph inputs and outputs of ``dtypes`` must run through
    OrtValues (:func:`run_values`)."""
    return any(d in TYPED or d in PACKED for d in dtypes)


def refuse_packed(dtypes: Iterable[tuple[str, str]]) -> None:
    """InvalidArgument naming the first (name, dtype) of a packed type."""
    for name, dtype in dtypes:
        if dtype in PACKED:
            raise InvalidArgument(
                f"the model's {name!r} is {dtype}: ONNX Runtime's Python API packs that type "
                f"several elements to a byte and takes no array of it, so the reference "
                f"driver cannot pass it; it passes numpy's element types and "
                f"{', '.join(TYPED)} (cast at the model's edges)")


def refuse_packed_model(onnx_bytes: bytes) -> None:
    """:func:`refuse_packed` for a model ONNX Runtime could not prepare (parsed only then:
    the compile worker's path has no graph types at hand, and a parse costs a large
    model's compile a few percent)."""
    from npumanager.drivers.onnx_types import onnx_specs

    try:
        ins, outs = onnx_specs(onnx_bytes)
    except Exception:
        return  # not ONNX that parses: ONNX Runtime's own words say more
    refuse_packed((s.name, s.dtype) for s in [*ins, *outs])


def to_ort(arr: Any) -> Any:
    """One input as ONNX Runtime takes it: an OrtValue of its ONNX type for a bfloat16 or
    float8 array (ONNX Runtime copies it), else the array itself."""
    if type(arr) is not np.ndarray:
        return arr
    onnx_type = TYPED.get(arr.dtype.name)
    if onnx_type is None:
        return arr
    import onnxruntime as ort

    raw = np.ascontiguousarray(arr).view(np.uint8 if arr.itemsize == 1 else np.uint16)
    return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(raw, onnx_type)


def from_ort(value: Any) -> Any:
    """One output of ``run_with_ort_values`` as the driver returns it: an ml_dtypes array
    (its bytes copied out) for a bfloat16 or float8 tensor, else what ``numpy()`` gives."""
    name = _FROM_ORT.get(value.data_type()) if value.is_tensor() else None
    if name is None:
        return value.numpy()
    import ml_dtypes

    dtype = np.dtype(getattr(ml_dtypes, name))
    shape = tuple(value.shape())
    n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    data = ctypes.string_at(value.data_ptr(), n) if n else b""
    return np.frombuffer(data, dtype=dtype).reshape(shape).copy()


def run_values(session: Any, output_names: Sequence[str], inputs: dict[str, Any],
               options: Any) -> list[Any]:
    """``session.run`` for a model with bfloat16 or float8 inputs or outputs: every input
    as an OrtValue, every output read back by :func:`from_ort`."""
    import onnxruntime as ort

    values = {}
    for name, arr in inputs.items():
        v = to_ort(arr)
        values[name] = v if isinstance(v, ort.OrtValue) else ort.OrtValue.ortvalue_from_numpy(v)
    outs = session.run_with_ort_values(list(output_names), values, options)
    return [from_ort(v) for v in outs]


def session_typed(session: Any) -> bool:
    """:func:`typed_io` from an InferenceSession's own inputs and outputs (ONNX Runtime's
    type strings): how an app that holds only the session decides."""
    kinds = {a.type for a in [*session.get_inputs(), *session.get_outputs()]}
    return bool(kinds & set(_FROM_ORT))
