"""Attack: the element types numpy lacks, sent to the reference driver by another uid.

The reference driver passes bfloat16 and float8 tensors to ONNX Runtime as OrtValues made
from the request's bytes (drivers/ort_values.py, ux30): a path ``session.run`` never took.
An app that sends such a tensor where the model wants another type or shape, a numpy type
to such a model, or a type ONNX Runtime packs several to a byte (int4) gets a typed
``InvalidArgument`` naming the input, before ONNX Runtime sees the bytes; its own honest
call still answers bit for bit, and the device serves another uid."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from npumanager.testing import procs
from tests.security.conftest import StartDaemon
from tests.security.driver_apps import granted, outcome
from tests.security.harness import ATTACKER, assert_device_served, needs_root

pytestmark = needs_root


def identity(elem: int, shape: list[Any] | None) -> bytes:
    from onnx import helper as h

    g = h.make_graph([h.make_node("Identity", ["x"], ["y"])], "id",
                     [h.make_tensor_value_info("x", elem, shape)],
                     [h.make_tensor_value_info("y", elem, shape)])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 21)], ir_version=10)\
        .SerializeToString()


def attack(rt: str) -> dict[str, str]:
    import ml_dtypes
    from onnx import TensorProto as T

    bf = np.array([1, 2.5, -3], dtype=ml_dtypes.bfloat16)
    with granted(rt) as (dev, grant):
        b16 = dev.prepare_model(identity(T.BFLOAT16, [3]), grant=grant)
        f8 = dev.prepare_model(identity(T.FLOAT8E4M3FN, [None]), grant=grant)
        f32 = dev.prepare_model(identity(T.FLOAT, [3]), grant=grant)
        got = {
            "float32 to bfloat16": outcome(lambda: b16.execute({"x": bf.astype(np.float32)})),
            "bfloat16 of another shape": outcome(
                lambda: b16.execute({"x": np.zeros(100_000, ml_dtypes.bfloat16)})),
            "bfloat16 to float32": outcome(lambda: f32.execute({"x": bf})),
            "int4 to float8": outcome(
                lambda: f8.execute({"x": np.array([1, 2], dtype=ml_dtypes.int4)})),
            "bfloat16 to float8": outcome(lambda: f8.execute({"x": bf})),
            "int4 model": outcome(lambda: dev.prepare_model(identity(T.INT4, [None]),
                                                             grant=grant)),
        }
        y = b16.execute({"x": bf})["y"]
        got["honest"] = f"ok: {y.dtype} {y.tobytes() == bf.tobytes()}"
        return got


def test_typed_tensors_of_the_wrong_kind_are_invalid_argument(
        start_npud: StartDaemon, runtime_dir: Path) -> None:
    start_npud(drivers=True)
    got = procs.run_as(ATTACKER, None, attack, str(runtime_dir), timeout=120)
    assert got.pop("honest") == "ok: bfloat16 True", got
    for case, out in got.items():
        assert out.startswith("InvalidArgument: "), (case, out)
    assert "int4" in got["int4 model"] and "'x'" in got["int4 model"]
    assert_device_served(runtime_dir)
