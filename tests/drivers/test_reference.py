"""The reference backend in-process: real ONNX Runtime, memory estimate, thermal model."""

from __future__ import annotations

import numpy as np
import pytest

from npumanager.drivers.base import CompileOptions
from npumanager.drivers.reference import ReferenceDriver, ThermalModel
from npumanager.errors import InvalidArgument
from npumanager.testing.onnx_models import (
    matmul_model,
    matmul_reference,
    relu_model,
    step_model,
)


def test_thermal_model_heats_with_utilization_and_cools_when_idle() -> None:
    t = ThermalModel(ambient_c=30.0, max_c=90.0, tau_s=10.0)
    assert t.update(0.0, 1.0) == 30.0
    hot = t.update(10.0, 1.0)  # one time constant at full load: 63% of the way
    assert hot == pytest.approx(30.0 + 60.0 * (1 - np.exp(-1)), rel=1e-6)
    hotter = t.update(100.0, 1.0)
    assert 89.0 < hotter <= 90.0
    cooled = t.update(110.0, 0.0)
    assert cooled < hotter and cooled > 30.0
    assert t.update(109.0, 0.0) == cooled  # time never runs backwards


def test_reference_runs_real_models_and_estimates_memory() -> None:
    drv = ReferenceDriver({"intra_op_threads": 1})
    m = drv.compile(matmul_model(dim=32, depth=3, batch=2), CompileOptions())
    x = np.random.default_rng(3).standard_normal((2, 32)).astype(np.float32)
    np.testing.assert_allclose(m.run({"x": x})["y"], matmul_reference(x, 32, 3), rtol=1e-4,
                               atol=1e-5)
    assert m.memory_bytes >= 3 * 32 * 32 * 4  # at least the weights
    assert [t.name for t in m.inputs] == ["x"] and m.inputs[0].shape == (2, 32)
    m.release()


def test_run_into_writes_outputs_in_place() -> None:
    drv = ReferenceDriver({})
    m = drv.compile(relu_model((4, 8)), CompileOptions())
    x = np.linspace(-1, 1, 32, dtype=np.float32).reshape(4, 8)
    dest = np.zeros((4, 8), np.float32)
    out = m.run_into({"x": x}, {"y": dest})
    assert out["y"] is dest
    np.testing.assert_array_equal(dest, np.maximum(x, 0))


def test_bound_run_finds_the_graph_id_its_run_options_are_asked_for() -> None:
    """ONNX Runtime's run_with_iobinding asks the RunOptions for ``gpu_graph_id`` on every
    run; when unset the lookup raises (a C++ exception, caught in Python): about 80 µs of
    a tiny model's bound run. The reference model's options carry it, and the bound run
    (a burst's) still writes its outputs in place."""
    import onnxruntime.capi.onnxruntime_inference_collection as coll

    drv = ReferenceDriver({})
    m = drv.compile(relu_model((4, 8)), CompileOptions())
    x = np.linspace(-1, 1, 32, dtype=np.float32).reshape(4, 8)
    dest = np.zeros((4, 8), np.float32)
    run = m.bind({"x": x}, {"y": dest})
    assert run is not None
    asked: list[object] = []
    real = coll._graph_annotation_id

    def graph_id(opts: object) -> int:
        asked.append(opts.get_run_config_entry("gpu_graph_id"))  # type: ignore[attr-defined]
        return real(opts)

    coll._graph_annotation_id = graph_id  # type: ignore[assignment]
    try:
        out = run()
    finally:
        coll._graph_annotation_id = real  # type: ignore[assignment]
    assert asked == ["-1"]  # found: no exception raised on the way
    assert out["y"] is dest
    np.testing.assert_array_equal(dest, np.maximum(x, 0))
    m.release()


def test_step_model_is_not_constant_folded_and_counts_steps() -> None:
    drv = ReferenceDriver({})
    m = drv.compile(step_model(4, work_dim=16), CompileOptions())
    out = m.run({"state": np.full((1, 4), 2.0, np.float32)})
    np.testing.assert_array_equal(out["state_out"], np.full((1, 4), 3.0, np.float32))
    assert out["work"].shape == (16, 16)


def test_garbage_is_invalid_argument() -> None:
    with pytest.raises(InvalidArgument):
        ReferenceDriver({}).compile(b"\x00garbage", CompileOptions())
