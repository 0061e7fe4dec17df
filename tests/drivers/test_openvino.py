"""The openvino driver: real models, IR input, the trust boundary, priority knobs, memory,
cancel, and caching end to end through a real driver host process (CPU here)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from onnx import TensorProto, helper

from npumanager import nn
from npumanager.drivers.base import CompileOptions, instantiate
from npumanager.drivers.openvino_ir import ir_bundle_from_path, pack_ir
from npumanager.errors import DriverRefused, GeneralFailure, InvalidArgument
from npumanager.testing.backend_models import BuiltModel, conv_net_onnx
from npumanager.testing.driver_host import running_driver
from npumanager.testing.onnx_models import matmul_model
from tests.drivers.backends import needs_openvino

pytestmark = needs_openvino
OPTS = CompileOptions()


@pytest.fixture(scope="module")
def driver() -> Iterator[Any]:
    from npumanager.drivers.openvino import OpenVinoDriver

    d = OpenVinoDriver({})
    yield d
    d.close()


@pytest.fixture(scope="module")
def conv() -> BuiltModel:
    return conv_net_onnx(seed=3)


def test_conv_net_matches_onnx_runtime_compiled_and_imported(driver: Any, conv: BuiltModel) -> None:
    m = driver.compile(conv.data, OPTS)
    assert [t.name for t in m.inputs] == ["x"] and [t.name for t in m.outputs] == ["logits"]
    assert conv.matches(m.run(conv.inputs))
    model_blobs, data_blobs = m.artifacts()
    assert data_blobs == [] and len(model_blobs) == 1
    loaded = driver.load_artifacts(model_blobs, data_blobs, OPTS)
    assert conv.matches(loaded.run(conv.inputs))
    other = conv_net_onnx(seed=4)
    assert not conv.matches(driver.compile(other.data, OPTS).run(conv.inputs))


def test_execution_mode_keeps_the_models_precision_unless_the_admin_opts_out(
        driver: Any, conv: BuiltModel) -> None:
    """By default a model runs in its own precision (ACCURACY), so an f32 model's outputs
    match ONNX Runtime's even where OpenVINO would lower them (bf16 on a CPU with AMX or
    AVX512_BF16, as this CI's); "performance" hands the choice to the device and keys the
    cache apart; an unknown mode is refused."""
    from npumanager.drivers.openvino import OpenVinoDriver

    m = driver.compile(conv.data, OPTS)
    if "EXECUTION_MODE_HINT" in driver.supported:
        assert str(m.compiled.get_property("EXECUTION_MODE_HINT")) == "ExecutionMode.ACCURACY"
    precision = str(m.compiled.get_property("INFERENCE_PRECISION_HINT"))
    assert "bfloat16" not in precision and "float16" not in precision, precision  # "dynamic"
    assert conv.matches(m.run(conv.inputs))
    fast = OpenVinoDriver({"execution_mode": "performance"})
    try:
        assert fast.version != driver.version and driver.version.endswith("+accuracy")
        assert fast.compile_config(OPTS).get("EXECUTION_MODE_HINT") in (None, "PERFORMANCE")
    finally:
        fast.close()
    with pytest.raises(InvalidArgument, match="execution_mode"):
        OpenVinoDriver({"execution_mode": "fast"})


def test_ir_bundle_gives_the_same_outputs(driver: Any, conv: BuiltModel, tmp_path: Path) -> None:
    import openvino as ov

    ov.save_model(driver.core.read_model(conv.data), tmp_path / "net.xml",
                  compress_to_fp16=False)
    bundle = ir_bundle_from_path(tmp_path / "net.xml")
    assert conv.matches(driver.compile(bundle, OPTS).run(conv.inputs))
    for bad in (bundle[:-1], bundle[:20], pack_ir(b"<net/>", b"")):
        with pytest.raises(InvalidArgument):
            driver.compile(bad, OPTS)


def test_models_naming_files_or_garbage_are_invalid(driver: Any) -> None:
    w = TensorProto(name="W", data_type=TensorProto.FLOAT, dims=[4])
    w.data_location = TensorProto.EXTERNAL
    w.external_data.add(key="location", value="/etc/shadow")
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "W"], ["y"])], "ext",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])], [w])
    external = helper.make_model(graph).SerializeToString()
    with pytest.raises(InvalidArgument, match="external data"):
        driver.compile(external, OPTS)
    for junk in (b"", b"garbage" * 100):
        with pytest.raises(InvalidArgument):
            driver.compile(junk, OPTS)
    with pytest.raises(GeneralFailure):
        driver.load_artifacts([b"not an exported blob"], [], OPTS)


def test_priority_reaches_the_device_knobs_it_has(driver: Any, conv: BuiltModel) -> None:
    from npumanager.drivers.openvino import priority_config

    # An NPU or GPU that lists both hints gets both.
    npu = {"MODEL_PRIORITY", "WORKLOAD_TYPE", "PERFORMANCE_HINT"}
    assert priority_config(npu, 90) == {"MODEL_PRIORITY": "LOW", "WORKLOAD_TYPE": "EFFICIENT"}
    assert priority_config(npu, 110) == {"MODEL_PRIORITY": "HIGH", "WORKLOAD_TYPE": "DEFAULT"}
    # The CPU lists neither: background models go to E-cores (hybrid CPUs), unpinned.
    assert "MODEL_PRIORITY" not in driver.supported and "WORKLOAD_TYPE" not in driver.supported
    low = driver.compile(conv.data, CompileOptions(priority=90))
    assert low.config["SCHEDULING_CORE_TYPE"] == "ECORE_ONLY"
    assert low.compiled.get_property("ENABLE_CPU_PINNING") is False
    high = driver.compile(conv.data, CompileOptions(priority=110))
    assert "SCHEDULING_CORE_TYPE" not in high.config
    assert high.compiled.get_property("ENABLE_CPU_PINNING") is True
    assert conv.matches(low.run(conv.inputs)) and conv.matches(high.run(conv.inputs))
    assert driver.core.get_property("CACHE_DIR") == ""  # OpenVINO's own cache stays off


def test_capabilities_memory_and_devices(driver: Any) -> None:
    caps = driver.capabilities()
    assert caps.extra["device"] == "CPU" and caps.memory_bytes > 0
    assert "reports no device memory property" in caps.extra["memory_source"]
    from npumanager.drivers.openvino import OpenVinoDriver

    assert OpenVinoDriver({"memory_bytes": 1 << 30}).capabilities().memory_bytes == 1 << 30
    with pytest.raises(DriverRefused, match="asked for"):
        instantiate("openvino", {"devices": ["NO_SUCH_DEVICE"]})


def test_abort_cancels_a_run_in_progress(driver: Any) -> None:
    m = driver.compile(matmul_model(512, 60, 64), OPTS)
    x = {"x": np.ones((64, 512), np.float32)}
    errors: list[BaseException] = []

    def run() -> None:
        try:
            m.run(x)
        except BaseException as exc:
            errors.append(exc)

    th = threading.Thread(target=run)
    th.start()
    while th.is_alive():
        m.abort()
        th.join(0.001)
    assert errors, "the run was not cancelled"
    m.run(x)  # the model still works afterwards


@pytest.mark.slow
def test_cache_end_to_end_through_the_host(runtime_dir: Path, state_dir: Path,
                                           tmp_path: Path, conv: BuiltModel) -> None:
    token = b"openvino-app-token-of-32-bytes!!"
    with running_driver("openvino", runtime_dir, state_dir, args=["--no-enforce-admission"]), \
            nn.device("openvino", runtime_dir) as dev:
        assert dev.get_number_of_cache_files_needed() == (1, 0)
        hits = []
        for _ in range(2):
            m = dev.prepare_model(conv.data, cache_dir=tmp_path, token=token)
            assert conv.matches(m.execute(conv.inputs))
            hits.append(m.loaded_from_cache)
            m.release()
        assert hits == [False, True]
        (blob,) = list(tmp_path.iterdir())
        blob.write_bytes(blob.read_bytes()[:-1] + b"\x00")  # imports fine unverified
        m = dev.prepare_model(conv.data, cache_dir=tmp_path, token=token)
        assert not m.loaded_from_cache and conv.matches(m.execute(conv.inputs))
