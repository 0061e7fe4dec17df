"""The element types numpy lacks, between ml_dtypes arrays and OpenVINO (openvino_values):
in as typed ov.Tensors over the same values (4-bit ones packed), out as ml_dtypes again."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from tests.drivers.backends import needs_openvino

pytestmark = needs_openvino

VALUES = {
    "bfloat16": [1.5, -2.0, 3e5, 0.0, -0.0],
    "float8_e4m3fn": [448.0, -0.5, 1.0, 0.0, -3.0],
    "float8_e5m2": [57344.0, -0.25, 2.0, 0.0, 1.5],
    "int4": [-8, -1, 0, 3, 7],
    "uint4": [0, 1, 15, 9, 2],
    "float4_e2m1fn": [0.5, -1.0, 6.0, 0.0, 3.0],
}


@pytest.mark.parametrize("dtype", sorted(VALUES))
@pytest.mark.parametrize("shape", [(), (0,), (5,), (1, 5), (2, 3)])
def test_ml_dtypes_cross_as_openvino_types_and_back(dtype: str, shape: tuple[int, ...]
                                                    ) -> None:
    import openvino as ov

    from npumanager.drivers.openvino_values import ML_TO_OV, from_ov, to_ov

    n = int(np.prod(shape))
    values = (VALUES[dtype] * 2)[:n]
    arr = np.array(values, dtype=getattr(ml_dtypes, dtype)).reshape(shape)
    arr.flags.writeable = False  # as an inline input arrives
    t = to_ov(arr)
    assert isinstance(t, ov.Tensor)
    assert t.get_element_type() == getattr(ov.Type, ML_TO_OV[dtype])
    assert tuple(t.shape) == shape
    back = from_ov(t, dtype)
    assert back.dtype == arr.dtype and back.shape == shape
    assert back.tolist() == arr.tolist()


def test_numpy_dtypes_pass_through_untouched() -> None:
    from npumanager.drivers.openvino_values import from_ov, to_ov

    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert to_ov(x) is x  # the zero-copy path for plain tensors
    scalar = np.frombuffer(np.float32(2.5).tobytes(), np.float32).reshape(())
    fed = to_ov(scalar)  # a read-only 0-d input (inline): copied, shape kept
    assert fed.shape == () and fed.flags.writeable and fed == scalar

    class Out:
        data = np.ones(3, np.int64)

    out = from_ov(Out(), "int64")
    assert out.dtype == np.int64 and out.tolist() == [1, 1, 1]
    assert not np.shares_memory(out, Out.data)
