"""Input and output specs with their ONNX types, and the check of an execute's inputs."""

from __future__ import annotations

import numpy as np
import pytest

from npumanager import tensorio
from npumanager.errors import InvalidArgument
from npumanager.proto.v1 import driver_pb2 as pb
from npumanager.tensorio.specs import MAP, OPTIONAL, SEQUENCE, InputCheck, TensorSpec, ValueType

F = ValueType("tensor", "float32", ("N", 3))
SEQ = ValueType(SEQUENCE, elem=ValueType("tensor", "int64", None))
MAP_T = ValueType(MAP, "int64", elem=ValueType("tensor", "float32", ()))
OPT = ValueType(OPTIONAL, elem=ValueType("tensor", "float32", (2,)))
STR = ValueType("tensor", "object", (None,))


def test_types_read_as_onnx_runtime_spells_them() -> None:
    assert str(F) == "tensor(float)[N,3]"
    assert str(SEQ) == "seq(tensor(int64))"
    assert str(MAP_T) == "map(int64,tensor(float)[])"
    assert str(OPT) == "optional(tensor(float)[2])"
    assert str(STR) == "tensor(string)[?]"
    assert F.shape == (-1, 3)
    assert TensorSpec("x", "float32", (1, -1)).value_type == ValueType("tensor", "float32",
                                                                       (1, None))


@pytest.mark.parametrize("vt", [F, SEQ, MAP_T, OPT, STR, ValueType(),
                                ValueType(SEQUENCE, elem=MAP_T)])
def test_specs_cross_the_wire_unchanged(vt: ValueType) -> None:
    spec = TensorSpec("x", vt.dtype if vt.kind == "tensor" else "", vt.shape, vt)
    msg = pb.TensorSpec.FromString(tensorio.spec_to_msg(spec).SerializeToString())
    assert tensorio.spec_from_msg(msg) == spec
    # A driver that sends no type describes a tensor by dtype and shape.
    old = pb.TensorSpec(name="y", dtype="int8", shape=[2, -1])
    assert tensorio.spec_from_msg(old).value_type == ValueType("tensor", "int8", (2, None))


def test_static_nbytes_only_for_numeric_tensors_of_fixed_shape() -> None:
    assert TensorSpec("x", "float16", (2, 3)).static_nbytes() == 12
    assert TensorSpec("x", "float32", (2, -1)).static_nbytes() is None
    assert TensorSpec("x", "object", (2,)).static_nbytes() is None
    assert TensorSpec("x", "", (), SEQ).static_nbytes() is None
    assert TensorSpec("x", "float32", (), ValueType("tensor", "float32", None)
                      ).static_nbytes() is None  # an unknown rank is not a scalar


def _check() -> InputCheck:
    return InputCheck([TensorSpec("x", "float32", (-1, 3), F), TensorSpec("s", "", (), SEQ),
                       TensorSpec("m", "", (), MAP_T), TensorSpec("o", "", (), OPT),
                       TensorSpec("t", "object", (-1,), STR)])


def _ok() -> dict[str, object]:
    return {"x": np.ones((5, 3), np.float32), "s": [np.ones(2, np.int64)], "m": {1: 2.0},
            "o": None, "t": np.array(["a"], dtype=object)}


def test_inputs_that_match_pass() -> None:
    check = _check()
    check.check(_ok())
    check.check({**_ok(), "o": np.ones(2, np.float32), "t": np.array(["ab", "c"])})
    without_optional = _ok()
    del without_optional["o"]  # ONNX Runtime: an optional input left out is absent
    check.check(without_optional)


@pytest.mark.parametrize(("change", "message"), [
    ({"x": np.ones((5, 3), np.float64)}, r"input 'x' expects tensor\(float\)\[N,3\], got "
                                         r"tensor\(double\)"),
    ({"x": np.ones((5, 4), np.float32)}, "input 'x' expects .*dimension 1 is 3"),
    ({"x": np.ones(3, np.float32)}, r"input 'x' expects .*\(rank 2\)"),
    ({"x": [1.0, 2.0]}, "input 'x' expects .* got a sequence"),
    ({"s": np.ones(2, np.int64)}, r"input 's' expects seq\(tensor\(int64\)\)"),
    ({"s": [np.ones(2, np.int32)]}, r"input 's\[0\]' expects tensor\(int64\)"),
    ({"m": [1.0]}, r"input 'm' expects map\(int64"),
    ({"o": np.ones(3, np.float32)}, "input 'o' expects .*dimension 0 is 2"),
    ({"t": np.ones(1, np.float32)}, r"input 't' expects tensor\(string\)"),
    ({"zz": np.ones(1)}, r"model has no input 'zz'; its inputs are 'x' \(tensor\(float\)"),
])
def test_a_wrong_input_is_named_with_what_was_expected(change: dict[str, object],
                                                      message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        _check().check({**_ok(), **change})


def test_a_missing_input_is_named() -> None:
    inputs = _ok()
    del inputs["s"]
    with pytest.raises(InvalidArgument, match=r"input 's' \(seq\(tensor\(int64\)\)\) is missing"):
        _check().check(inputs)


def test_unknown_types_and_ranks_are_left_to_the_backend() -> None:
    check = InputCheck([TensorSpec("x", "", (), ValueType()),
                        TensorSpec("y", "float32", (), ValueType("tensor", "float32", None))])
    check.check({"x": np.ones((2, 2), np.int8), "y": np.ones((1, 2, 3), np.float32)})
