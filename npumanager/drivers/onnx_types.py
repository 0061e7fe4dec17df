"""A model's inputs and outputs with their whole ONNX types, for drivers that take ONNX.

Read from the graph (``onnx.TypeProto``: element type, shape with fixed,
symbolic and unknown dimensions or no shape at all, and the nesting of
sequences, maps and optionals), or — when only a session is at hand — from
ONNX Runtime's ``NodeArg`` strings, which cannot tell a scalar from an unknown
rank (both ``[]``); the graph is preferred wherever the driver has it.
"""

from __future__ import annotations

from typing import Any

from npumanager.tensorio.dtypes import ONNX_TO_NUMPY
from npumanager.tensorio.specs import MAP, OPTIONAL, SEQUENCE, TENSOR, Dim, TensorSpec, ValueType

Specs = tuple[list[TensorSpec], list[TensorSpec]]


def _elem_dtype(elem_type: int) -> str:
    import onnx

    if not elem_type:
        return ""
    try:
        name = onnx.TensorProto.DataType.Name(elem_type).lower()
    except ValueError:
        return ""
    return ONNX_TO_NUMPY.get(name, "")


def value_type(tp: Any) -> ValueType:
    """An ``onnx.TypeProto`` as a :class:`ValueType`."""
    which = tp.WhichOneof("value")
    if which == "tensor_type":
        tt = tp.tensor_type
        dims: tuple[Dim, ...] | None = None
        if tt.HasField("shape"):
            dims = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                         for d in tt.shape.dim)
        return ValueType(TENSOR, _elem_dtype(tt.elem_type), dims)
    if which == "sequence_type":
        return ValueType(SEQUENCE, elem=value_type(tp.sequence_type.elem_type))
    if which == "map_type":
        mt = tp.map_type
        return ValueType(MAP, _elem_dtype(mt.key_type), elem=value_type(mt.value_type))
    if which == "optional_type":
        return ValueType(OPTIONAL, elem=value_type(tp.optional_type.elem_type))
    return ValueType(TENSOR)  # no type, or a sparse tensor: nothing to check against


def spec(name: str, vt: ValueType) -> TensorSpec:
    if vt.kind == TENSOR:
        return TensorSpec(name, vt.dtype, vt.shape, vt)
    return TensorSpec(name, "", (), vt)


def graph_specs(model: Any) -> Specs:
    """Inputs (initializers left out: ONNX Runtime does not ask for them) and outputs of
    an ``onnx.ModelProto``."""
    g = model.graph
    inits = {t.name for t in g.initializer}
    inputs = [spec(vi.name, value_type(vi.type)) for vi in g.input if vi.name not in inits]
    return inputs, [spec(vi.name, value_type(vi.type)) for vi in g.output]


def onnx_specs(onnx_bytes: bytes) -> Specs:
    import onnx

    return graph_specs(onnx.load_model_from_string(onnx_bytes))


def parse_ort_type(text: str, shape: list[Any] | None = None) -> ValueType:
    """ONNX Runtime's ``NodeArg.type`` (``seq(map(string,tensor(float)))``) as a type;
    ``shape`` (``NodeArg.shape``) for a top-level tensor, ``[]`` read as an unknown rank."""
    vt, rest = _parse(text.replace(" ", ""))
    if rest:
        return ValueType(TENSOR)
    if vt.kind == TENSOR and shape:
        dims = tuple(d if isinstance(d, int) and d >= 0 else (d if isinstance(d, str) and d
                                                              else None) for d in shape)
        vt = ValueType(TENSOR, vt.dtype, dims)
    return vt


def _parse(s: str) -> tuple[ValueType, str]:
    for prefix, kind in (("tensor(", TENSOR), ("seq(", SEQUENCE), ("optional(", OPTIONAL),
                         ("map(", MAP)):
        if not s.startswith(prefix):
            continue
        s = s[len(prefix):]
        if kind == TENSOR:
            elem, _, rest = s.partition(")")
            return ValueType(TENSOR, ONNX_TO_NUMPY.get(elem, "")), rest
        key = ""
        if kind == MAP:
            key_name, _, s = s.partition(",")
            key = ONNX_TO_NUMPY.get(key_name, "")
        inner, rest = _parse(s)
        return ValueType(kind, key, elem=inner), rest[1:] if rest.startswith(")") else rest
    return ValueType(TENSOR), ""


def session_specs(session: Any) -> Specs:
    """Specs from an ONNX Runtime session alone (when the graph is not at hand)."""
    def one(arg: Any) -> TensorSpec:
        return spec(arg.name, parse_ort_type(arg.type, list(arg.shape or [])))

    return [one(a) for a in session.get_inputs()], [one(a) for a in session.get_outputs()]
