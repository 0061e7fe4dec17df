"""Model inputs and outputs as the driver describes them and the client reads them.

A :class:`TensorSpec` names an input or output and gives its ONNX type
(:class:`ValueType`): a tensor's element type and shape (fixed, symbolic or
unknown dimensions; or not even a known rank), or a sequence, map or optional
of other types — what ONNX Runtime's ``NodeArg`` tells in-process, with the
nesting spelled out. :class:`InputCheck` holds a model's input specs ready to
check an execute's inputs against them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from npumanager.errors import InvalidArgument
from npumanager.proto.v1 import driver_pb2 as pb
from npumanager.tensorio.dtypes import check_dtype, is_numeric, onnx_elem_name

TENSOR, SEQUENCE, MAP, OPTIONAL = "tensor", "sequence", "map", "optional"
Dim = int | str | None  # fixed size, symbolic name, unknown


@dataclass(frozen=True)
class ValueType:
    """An ONNX type. ``dtype`` is a numpy dtype name (tensor elements; map keys), "" when
    unknown; ``dims`` is None when not even the rank is known; ``elem`` is a sequence's or
    optional's element type, or a map's value type."""

    kind: str = TENSOR
    dtype: str = ""
    dims: tuple[Dim, ...] | None = None
    elem: ValueType | None = None

    def __str__(self) -> str:
        """ONNX Runtime's spelling (``tensor(float)``, ``seq(tensor(int64))``,
        ``map(string,tensor(float))``, ``optional(...)``), shapes in brackets."""
        if self.kind == TENSOR:
            text = f"tensor({onnx_elem_name(self.dtype) or '?'})"
            if self.dims is not None:
                text += "[" + ",".join("?" if d is None else str(d) for d in self.dims) + "]"
            return text
        inner = str(self.elem) if self.elem is not None else "?"
        if self.kind == SEQUENCE:
            return f"seq({inner})"
        if self.kind == MAP:
            return f"map({onnx_elem_name(self.dtype) or '?'},{inner})"
        return f"optional({inner})"

    @property
    def shape(self) -> tuple[int, ...]:
        """The dims with -1 for any that is not fixed (() for an unknown rank)."""
        return tuple(d if isinstance(d, int) else -1 for d in self.dims or ())


def tensor_type(dtype: str, shape: tuple[int, ...] | None) -> ValueType:
    dims = None if shape is None else tuple(d if d >= 0 else None for d in shape)
    return ValueType(TENSOR, dtype, dims)


@dataclass(frozen=True)
class TensorSpec:
    """An input or output: name, numpy dtype name and shape (-1 = a dynamic dimension)
    of a tensor, and its whole ONNX ``type`` (for sequences, maps and optionals ``dtype``
    is "" and ``shape`` is ())."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    type: ValueType | None = None

    def __post_init__(self) -> None:
        if self.type is None:
            object.__setattr__(self, "type", tensor_type(self.dtype, self.shape))

    @property
    def value_type(self) -> ValueType:
        assert self.type is not None
        return self.type

    @property
    def is_tensor(self) -> bool:
        return self.value_type.kind == TENSOR

    def static_nbytes(self) -> int | None:
        """Bytes of a numeric tensor of this spec, or None while a dimension is dynamic
        (or it is no numeric tensor: strings, sequences, maps, optionals)."""
        vt = self.value_type
        if vt.kind != TENSOR or vt.dims is None or not self.dtype or any(
                d < 0 for d in self.shape):
            return None
        try:
            dt = check_dtype(self.dtype)
        except InvalidArgument:
            return None
        if not is_numeric(dt):
            return None
        return int(np.prod(self.shape, dtype=np.int64)) * dt.itemsize

    def __str__(self) -> str:
        return f"{self.name}: {self.type}"


# --- checking inputs --------------------------------------------------------------------


def _describe(value: Any) -> str:
    """What a value is, in the spelling of :meth:`ValueType.__str__`."""
    if isinstance(value, np.ndarray):
        return f"tensor({onnx_elem_name(_dt_name(value.dtype))}) of shape {value.shape}"
    if isinstance(value, list):
        return "a sequence (list)"
    if isinstance(value, dict):
        return "a map (dict)"
    if value is None:
        return "None (an absent optional)"
    return f"a {type(value).__name__}"


def _dt_name(dt: np.dtype[np.generic]) -> str:
    return "object" if dt.kind in "OUS" else dt.name


class _Expected:
    """One input's type, compiled for checking (the execute fast path calls this)."""

    __slots__ = ("dims", "dtype", "elem", "fixed", "kind", "rank", "text")

    def __init__(self, vt: ValueType) -> None:
        self.kind = vt.kind
        self.text = str(vt)
        self.dtype: np.dtype[np.generic] | None = None
        if vt.kind == TENSOR and vt.dtype:
            try:
                self.dtype = check_dtype(vt.dtype)
            except InvalidArgument:
                self.dtype = None  # a type the codec does not know: the backend decides
        self.dims = vt.dims
        self.rank = None if vt.dims is None else len(vt.dims)
        self.fixed = tuple((i, d) for i, d in enumerate(vt.dims or ()) if isinstance(d, int))
        self.elem = _Expected(vt.elem) if vt.elem is not None else None

    def check(self, name: str, value: Any) -> None:
        kind = self.kind
        if kind == TENSOR:
            if not isinstance(value, np.ndarray):
                raise InvalidArgument(f"input {name!r} expects {self.text}, got "
                                      f"{_describe(value)}")
            dt = self.dtype
            vdt = value.dtype
            if dt is not None and vdt is not dt and vdt != dt and not (
                    dt.kind == "O" and vdt.kind in "OUS"):
                raise InvalidArgument(f"input {name!r} expects {self.text}, got "
                                      f"{_describe(value)}")
            rank = self.rank
            if rank is not None:
                shape = value.shape
                if len(shape) != rank:
                    raise InvalidArgument(f"input {name!r} expects {self.text} (rank {rank}),"
                                          f" got {_describe(value)}")
                for i, d in self.fixed:
                    if shape[i] != d:
                        raise InvalidArgument(
                            f"input {name!r} expects {self.text}: dimension {i} is {d}, got "
                            f"{_describe(value)}")
        elif kind == OPTIONAL:
            if value is not None and self.elem is not None:
                self.elem.check(name, value)
        elif kind == SEQUENCE:
            if not isinstance(value, list):
                raise InvalidArgument(f"input {name!r} expects {self.text}, got "
                                      f"{_describe(value)}")
            elem = self.elem
            if elem is not None:
                for i, v in enumerate(value):
                    elem.check(f"{name}[{i}]", v)
        elif kind == MAP and not isinstance(value, dict):
            # Keys and values: ONNX Runtime converts a dict by its own rules; it says.
            raise InvalidArgument(f"input {name!r} expects {self.text}, got {_describe(value)}")


class InputCheck:
    """A model's input specs, ready to check an execute's inputs (names, kinds, element
    types, ranks and fixed dimensions) before any work is queued."""

    def __init__(self, specs: list[TensorSpec]) -> None:
        self._expected = {s.name: _Expected(s.value_type) for s in specs}
        self._names = frozenset(self._expected)

    def check(self, inputs: Mapping[str, Any]) -> None:
        expected = self._expected
        if len(inputs) != len(expected) or not self._names.issuperset(inputs):
            unknown = sorted(set(inputs) - self._names)
            if unknown:
                raise InvalidArgument(f"model has no input {unknown[0]!r}; its inputs are "
                                      + ", ".join(f"{n!r} ({e.text})"
                                                  for n, e in expected.items()))
            # Inputs of an optional type may be left out (ONNX Runtime: absent).
            missing = [n for n, e in expected.items() if n not in inputs and e.kind != OPTIONAL]
            if missing:
                raise InvalidArgument(f"input {missing[0]!r} ({expected[missing[0]].text}) is "
                                      f"missing; the model takes {len(expected)} inputs")
        for name, value in inputs.items():
            expected[name].check(name, value)


# --- on the wire ---------------------------------------------------------------------------

_KINDS = {TENSOR: 0, SEQUENCE: 1, MAP: 2, OPTIONAL: 3}
_KIND_NAMES = {v: k for k, v in _KINDS.items()}


def type_to_msg(vt: ValueType, msg: pb.ValueType) -> None:
    msg.kind = _KINDS[vt.kind]  # type: ignore[assignment]
    msg.dtype = vt.dtype
    if vt.dims is not None:
        msg.has_shape = True
        msg.dims[:] = [d if isinstance(d, int) else -1 for d in vt.dims]
        msg.dim_params[:] = [d if isinstance(d, str) else "" for d in vt.dims]
    if vt.elem is not None:
        type_to_msg(vt.elem, msg.elem)


def type_from_msg(msg: pb.ValueType, _depth: int = 0) -> ValueType:
    if _depth > 16:
        raise InvalidArgument("a value type nests deeper than 16")
    kind = _KIND_NAMES.get(msg.kind)
    if kind is None:
        raise InvalidArgument(f"unknown value kind {msg.kind}")
    dims: tuple[Dim, ...] | None = None
    if msg.has_shape:
        params = list(msg.dim_params) + [""] * (len(msg.dims) - len(msg.dim_params))
        dims = tuple(d if d >= 0 else (p or None) for d, p in zip(msg.dims, params, strict=False))
    elem = type_from_msg(msg.elem, _depth + 1) if msg.HasField("elem") else None
    return ValueType(kind, msg.dtype, dims, elem)


def spec_to_msg(spec: TensorSpec) -> pb.TensorSpec:
    msg = pb.TensorSpec(name=spec.name, dtype=spec.dtype, shape=list(spec.shape))
    type_to_msg(spec.value_type, msg.type)
    return msg


def spec_from_msg(msg: pb.TensorSpec) -> TensorSpec:
    vt = type_from_msg(msg.type) if msg.HasField("type") else None
    return TensorSpec(msg.name, msg.dtype, tuple(msg.shape), vt)
