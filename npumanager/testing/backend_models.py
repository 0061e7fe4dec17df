"""Small, realistic models for the OpenVINO and torch backends, built here, never downloaded.

Each builder returns the bytes a client passes to ``prepare_model``, an input
and the expected output from an independent implementation (ONNX Runtime for
ONNX models, eager PyTorch for ``torch.export`` programs).
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass
class BuiltModel:
    """Model bytes, its inputs, and the outputs an independent implementation computes."""

    data: bytes
    inputs: dict[str, np.ndarray]
    expected: dict[str, np.ndarray]
    rtol: float = 1e-4
    atol: float = 1e-5

    def matches(self, outputs: dict[str, np.ndarray]) -> bool:
        return all(
            name in outputs and outputs[name].shape == want.shape
            and bool(np.allclose(outputs[name], want, rtol=self.rtol, atol=self.atol))
            for name, want in self.expected.items()
        )


def conv_net_onnx(channels: int = 16, size: int = 32, classes: int = 10, batch: int = 1,
                  seed: int = 0) -> BuiltModel:
    """Conv-BN(folded)-ReLU x3 with a stride-2 stage, global pooling and a classifier."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    prev, c_in = "x", 3
    for i, (c_out, stride) in enumerate(((channels, 1), (channels * 2, 2), (channels * 2, 1))):
        w = (rng.standard_normal((c_out, c_in, 3, 3)) / np.sqrt(9 * c_in)).astype(np.float32)
        b = (rng.standard_normal(c_out) * 0.1).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(b, f"b{i}")]
        nodes += [
            helper.make_node("Conv", [prev, f"w{i}", f"b{i}"], [f"c{i}"], pads=[1, 1, 1, 1],
                             strides=[stride, stride]),
            helper.make_node("Relu", [f"c{i}"], [f"r{i}"]),
        ]
        prev, c_in = f"r{i}", c_out
    fc = (rng.standard_normal((c_in, classes)) / np.sqrt(c_in)).astype(np.float32)
    inits.append(numpy_helper.from_array(fc, "fc"))
    nodes += [
        helper.make_node("GlobalAveragePool", [prev], ["pool"]),
        helper.make_node("Flatten", ["pool"], ["flat"]),
        helper.make_node("MatMul", ["flat", "fc"], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes, "convnet",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, size, size])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch, classes])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    data = model.SerializeToString()
    x = rng.standard_normal((batch, 3, size, size)).astype(np.float32)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.log_severity_level = 3
    sess = ort.InferenceSession(data, sess_options=so, providers=["CPUExecutionProvider"])
    (ref,) = sess.run(["logits"], {"x": x})
    return BuiltModel(data, {"x": x}, {"logits": ref}, rtol=1e-3, atol=1e-4)


# --- torch.export programs ------------------------------------------------------------


def torch_program(module: Any, *example_inputs: Any) -> bytes:
    """``module`` exported with ``torch.export`` and saved as .pt2 bytes."""
    import warnings

    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ep = torch.export.export(module.eval(), tuple(example_inputs))
        buf = io.BytesIO()
        torch.export.save(ep, buf)
    return buf.getvalue()


def _modules() -> dict[str, type]:
    import torch

    class Add(torch.nn.Module):  # type: ignore[misc]
        def __init__(self, bias: float) -> None:
            super().__init__()
            self.bias = bias

        def forward(self, x: Any) -> Any:
            return {"y": x + self.bias}

    class Step(torch.nn.Module):  # type: ignore[misc]
        """A decode-loop step: state_out = state + 1, plus a MatMul chain that takes time."""

        def __init__(self, work_dim: int, work_depth: int) -> None:
            super().__init__()
            g = torch.Generator().manual_seed(0)
            self.w = torch.nn.Parameter(
                torch.randn(work_dim, work_dim, generator=g) / work_dim**0.5,
                requires_grad=False)
            self.work_depth = work_depth

        def forward(self, state: Any) -> Any:
            work = self.w * state.mean()
            for _ in range(self.work_depth):
                work = torch.tanh(work @ self.w)
            return {"state_out": state + 1.0, "work": work}

    class Linear(torch.nn.Module):  # type: ignore[misc]
        def __init__(self, n_in: int, n_out: int, seed: int) -> None:
            super().__init__()
            g = torch.Generator().manual_seed(seed)
            self.w = torch.nn.Parameter(torch.randn(n_in, n_out, generator=g),
                                        requires_grad=False)
            self.b = torch.nn.Parameter(torch.randn(n_out, generator=g), requires_grad=False)

        def forward(self, x: Any) -> Any:
            return {"y": x @ self.w + self.b}

    class Block(torch.nn.Module):  # type: ignore[misc]
        """A pre-norm transformer block: multi-head self-attention and a GELU MLP."""

        def __init__(self, d: int, heads: int) -> None:
            super().__init__()
            self.ln1 = torch.nn.LayerNorm(d)
            self.attn = torch.nn.MultiheadAttention(d, heads, batch_first=True)
            self.ln2 = torch.nn.LayerNorm(d)
            self.mlp = torch.nn.Sequential(
                torch.nn.Linear(d, 4 * d), torch.nn.GELU(), torch.nn.Linear(4 * d, d))

        def forward(self, x: Any) -> Any:
            y = self.ln1(x)
            a, _ = self.attn(y, y, y, need_weights=False)
            x = x + a
            return {"y": x + self.mlp(self.ln2(x))}

    return {"add": Add, "step": Step, "linear": Linear, "block": Block}


def torch_add_program(n: int = 4, bias: float = 1.0) -> bytes:
    """x [1, n] -> {"y": x + bias}."""
    import torch

    return torch_program(_modules()["add"](bias), torch.ones(1, n))


def torch_step_program(n: int = 4, work_dim: int = 160, work_depth: int = 2) -> bytes:
    """state [1, n] -> {"state_out": state + 1, "work": [work_dim, work_dim]}."""
    import torch

    return torch_program(_modules()["step"](work_dim, work_depth), torch.zeros(1, n))


def _built(module: Any, x: Any) -> BuiltModel:
    import torch

    with torch.no_grad():
        ref = module.eval()(x)
    return BuiltModel(torch_program(module, x), {"x": x.numpy()},
                      {k: v.numpy() for k, v in ref.items()}, rtol=1e-4, atol=1e-4)


def torch_linear(seed: int, n_in: int = 16, n_out: int = 8) -> BuiltModel:
    """y = x @ W + b with weights drawn from ``seed``."""
    import torch

    g = torch.Generator().manual_seed(1000 + seed)
    return _built(_modules()["linear"](n_in, n_out, seed), torch.randn(3, n_in, generator=g))


def transformer_block(d: int = 64, heads: int = 4, seq: int = 16, seed: int = 0) -> BuiltModel:
    """One transformer block on a [1, seq, d] input."""
    import torch

    torch.manual_seed(seed)
    block = _modules()["block"](d, heads)
    g = torch.Generator().manual_seed(seed + 1)
    return _built(block, torch.randn(1, seq, d, generator=g))


def onnx_linear(seed: int, n_in: int = 16, n_out: int = 8) -> BuiltModel:
    """y = x @ W + b as ONNX, with its numpy reference."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    w = rng.standard_normal((n_in, n_out)).astype(np.float32)
    b = rng.standard_normal(n_out).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Add", ["h", "B"], ["y"])],
        f"linear{seed}",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, n_in])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, n_out])],
        [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "B")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    x = rng.standard_normal((3, n_in)).astype(np.float32)
    return BuiltModel(model.SerializeToString(), {"x": x}, {"y": x @ w + b})


__all__ = [
    "BuiltModel",
    "conv_net_onnx",
    "onnx_linear",
    "torch_add_program",
    "torch_linear",
    "torch_program",
    "torch_step_program",
    "transformer_block",
]
