"""The reference driver's ONNX Runtime options for background sessions
(drivers/ort_tuning.py: ``graph_optimization_background``, ``mem_arena_background``,
``mem_pattern_background``): read back from the sessions
real ONNX Runtime built, on every path that builds one, foreground sessions untouched,
and refused by check-config when mistyped."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

from npumanager.demo.models import mlp_model
from npumanager.drivers.base import CompileOptions
from npumanager.drivers.option_specs import option_problems
from npumanager.drivers.ort_tuning import SessionTuning
from npumanager.drivers.reference import OrtModel, ReferenceDriver

BG, FG = CompileOptions(background=True), CompileOptions()
ALL = {"graph_optimization_background": "basic", "mem_arena_background": 0,
       "mem_pattern_background": 0}


def onnx() -> bytes:
    return mlp_model("tuning", 64, 3, 4, seed=5).onnx


def seen(model: Any) -> tuple[bool, bool]:
    """(arena, memory pattern) as the session holds them."""
    inner = getattr(model, "_inner", model)  # (a JIT model's compiled one)
    assert isinstance(inner, OrtModel)
    so = inner.session.get_session_options()
    return so.enable_cpu_mem_arena, so.enable_mem_pattern


TUNED = (False, False)
DEFAULT = (True, True)


def runs(model: Any) -> None:
    x = np.ones((4, 64), np.float32)
    want = ReferenceDriver().compile(onnx(), FG).run({"x": x})["y"]
    np.testing.assert_allclose(model.run({"x": x})["y"], want, rtol=1e-5, atol=1e-6)


def test_background_sessions_get_the_options_foreground_ones_do_not() -> None:
    driver = ReferenceDriver(ALL)
    bg, fg = driver.compile(onnx(), BG), driver.compile(onnx(), FG)
    assert seen(bg) == TUNED
    assert seen(fg) == DEFAULT
    assert seen(ReferenceDriver().compile(onnx(), BG)) == DEFAULT
    assert bg.session.get_session_options().graph_optimization_level == \
        ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    assert fg.session.get_session_options().graph_optimization_level == \
        ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    runs(bg)


def test_every_path_that_builds_a_background_session_passes_them_on() -> None:
    driver = ReferenceDriver(ALL)
    made = driver.compile_with_artifacts(onnx(), BG)
    assert seen(made) == TUNED
    blobs = made.artifacts()
    loaded = driver.load_artifacts(*blobs, BG)  # (the compile child's path ends here)
    assert seen(loaded) == TUNED
    runs(loaded)
    assert seen(driver.load_artifacts(*blobs, FG)) == DEFAULT
    jit = ReferenceDriver({**ALL, "compile_mode": "jit"}).compile(onnx(), BG)
    runs(jit)  # (compiled at its first run)
    assert seen(jit) == TUNED


def test_the_level_is_part_of_the_version_so_of_the_cache_key() -> None:
    """Artifacts compiled at another level are another entry; the other options do not
    change what is compiled, so they leave the version alone."""
    plain = ReferenceDriver().version
    assert ReferenceDriver({"graph_optimization_background": "basic"}).version == \
        plain + "+bg-opt-basic"
    assert ReferenceDriver({"mem_arena_background": 0}).version == plain


def test_check_config_refuses_a_bad_value_and_the_driver_too() -> None:
    assert list(option_problems("reference", ALL)) == []
    assert list(option_problems("reference", {"graph_optimization_background": "max"})) == [
        "graph_optimization_background = 'max' must be one of 'disabled', 'basic', "
        "'extended', 'all'"]
    assert list(option_problems("reference", {"mem_arena_background": 2})) == [
        "mem_arena_background = 2 must be at most 1"]
    assert list(option_problems("reference", {"mem_pattern_background": "no"})) == [
        "mem_pattern_background = 'no' must be an integer"]
    with pytest.raises(ValueError, match="graph_optimization_background"):
        SessionTuning.background({"graph_optimization_background": "max"})
    with pytest.raises(ValueError, match="graph_optimization_background"):
        ReferenceDriver({"graph_optimization_background": 99})
