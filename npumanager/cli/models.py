"""Small ONNX models built with ``onnx.helper`` (no downloads), for `npu run --builtin NAME`.

They let a newcomer run the README's tour without bringing a model: each one is
built in memory in well under a second and runs in a few milliseconds on a
CPU core. ``npu run --builtin NAME --save FILE`` writes one out as a .onnx file.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Builtin:
    name: str
    what: str
    build: Callable[[], bytes]
    #: output -> input fed back between steps (``--steps N`` runs a decode loop).
    feedback: dict[str, str] = field(default_factory=dict)


def _add() -> bytes:
    from npumanager.testing.onnx_models import add_model

    return add_model(4, 1.0)


def _mlp() -> bytes:
    from npumanager.testing.onnx_models import matmul_model

    return matmul_model(dim=256, depth=4, batch=16)


def _conv() -> bytes:
    from npumanager.demo.models import camera_model

    return camera_model().onnx


def _decode() -> bytes:
    from npumanager.testing.onnx_models import step_model

    return step_model(n=64, work_dim=128, work_depth=2)


BUILTINS: dict[str, Builtin] = {b.name: b for b in (
    Builtin("add", "y = x + 1, float32 [1, 4] (the smallest possible model)", _add),
    Builtin("mlp", "4 dense tanh layers, 256 wide, batch 16 (an embedder)", _mlp),
    Builtin("conv", "2 convolutions + pooling + a 10-class head on a 3x96x96 frame (a camera)",
            _conv),
    Builtin("decode", "one decode step: state_out = state + 1 plus a MatMul chain; "
            "--steps N feeds state_out back into state (an LLM loop)", _decode,
            {"state_out": "state"}),
)}


def listing() -> str:
    width = max(len(n) for n in BUILTINS)
    return "\n".join(f"  {b.name:<{width}}  {b.what}" for b in BUILTINS.values())
