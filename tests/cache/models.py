"""Small ONNX models with known weights and their numpy references, for cache tests."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


class LinearModel:
    """y = x @ W + b (MatMul + Add), with weights drawn from ``seed``."""

    def __init__(self, seed: int, n_in: int = 16, n_out: int = 8) -> None:
        rng = np.random.default_rng(seed)
        self.w = rng.standard_normal((n_in, n_out)).astype(np.float32)
        self.b = rng.standard_normal(n_out).astype(np.float32)
        self.n_in = n_in
        graph = helper.make_graph(
            [
                helper.make_node("MatMul", ["x", "W"], ["h"]),
                helper.make_node("Add", ["h", "B"], ["y"]),
            ],
            f"linear{seed}",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, n_in])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, n_out])],
            [numpy_helper.from_array(self.w, "W"), numpy_helper.from_array(self.b, "B")],
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8
        onnx.checker.check_model(model)
        self.onnx_bytes = model.SerializeToString()
        self.x = rng.standard_normal((3, n_in)).astype(np.float32)

    def reference(self, x: np.ndarray | None = None) -> np.ndarray:
        x = self.x if x is None else x
        return x @ self.w + self.b

    def matches(self, session_or_outputs: object) -> bool:
        """Whether an ORT session (or an outputs dict) computes this model on ``self.x``."""
        if isinstance(session_or_outputs, dict):
            y = session_or_outputs["y"]
        else:
            y = session_or_outputs.run(None, {"x": self.x})[0]  # type: ignore[attr-defined]
        return bool(np.allclose(y, self.reference(), rtol=1e-4, atol=1e-5))
