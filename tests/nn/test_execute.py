"""The runtime client against a real driver host process and real ONNX Runtime."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from npumanager import nn
from npumanager.errors import GrantRequired, InvalidArgument
from npumanager.testing.driver_host import DriverProcess, running_driver
from npumanager.testing.onnx_models import add_model, relu_model, reshape_model

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def open_driver() -> Iterator[tuple[DriverProcess, Path]]:
    import shutil
    import tempfile

    rt = Path(tempfile.mkdtemp(prefix="npu-rt-", dir="/tmp"))
    st = Path(tempfile.mkdtemp(prefix="npu-st-", dir="/tmp"))
    try:
        with running_driver("reference", rt, st, args=["--no-enforce-admission"]) as d:
            yield d, rt
    finally:
        shutil.rmtree(rt, ignore_errors=True)
        shutil.rmtree(st, ignore_errors=True)


@pytest.fixture
def dev(open_driver: tuple[DriverProcess, Path]) -> Iterator[nn.Device]:
    d = nn.device("reference", open_driver[1])
    try:
        yield d
    finally:
        d.close()


def test_prepare_and_execute_small_model_inline(dev: nn.Device) -> None:
    model = dev.prepare_model(add_model(4, bias=2.0))
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    out = model.execute({"x": x})
    np.testing.assert_array_equal(out["y"], x + 2.0)
    assert not model.loaded_from_cache
    assert model.memory_bytes > 0
    model.release()


def test_large_tensor_travels_through_shared_memory(dev: nn.Device) -> None:
    shape = (512, 1024)  # 2 MiB: far above the inline limit and the 1 MiB frame bound
    model = dev.prepare_model(relu_model(shape))
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    out = model.execute({"x": x})
    np.testing.assert_array_equal(out["y"], np.maximum(x, 0))
    assert model._all_pools, "a pool was registered"
    # A second call reuses the registered pool (no new registration).
    pools = list(model._all_pools)
    out2 = model.execute({"x": -x})
    np.testing.assert_array_equal(out2["y"], np.maximum(-x, 0))
    assert model._all_pools == pools
    model.release()


def test_dynamic_output_shape_is_returned(dev: nn.Device) -> None:
    model = dev.prepare_model(reshape_model())
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    out = model.execute({"x": x, "shape": np.array([2, 2], dtype=np.int64)})
    np.testing.assert_array_equal(out["y"], x.reshape(2, 2))
    model.release()


def test_backend_error_reaches_client_as_execution_failed(dev: nn.Device) -> None:
    from npumanager.errors import ExecutionFailed

    model = dev.prepare_model(reshape_model())
    with pytest.raises(ExecutionFailed):
        model.execute({"x": np.zeros((1, 4), np.float32), "shape": np.array([3, 3], np.int64)})
    model.release()


def test_wrong_input_names_are_invalid_argument(dev: nn.Device) -> None:
    model = dev.prepare_model(add_model())
    with pytest.raises(InvalidArgument):
        model.execute({"nope": np.zeros((1, 4), np.float32)})
    model.release()


def test_bad_model_bytes_are_invalid_argument(dev: nn.Device) -> None:
    with pytest.raises(InvalidArgument):
        dev.prepare_model(b"not an onnx model")


def test_token_must_be_32_bytes(dev: nn.Device, tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument):
        dev.prepare_model(add_model(), cache_dir=tmp_path, token=b"short")


def test_second_prepare_loads_from_cache(dev: nn.Device, tmp_path: Path) -> None:
    token = bytes(range(32))
    first = dev.prepare_model(add_model(4, bias=3.0), cache_dir=tmp_path, token=token)
    assert not first.loaded_from_cache
    second = dev.prepare_model(add_model(4, bias=3.0), cache_dir=tmp_path, token=token)
    assert second.loaded_from_cache
    x = np.ones((1, 4), np.float32)
    np.testing.assert_array_equal(second.execute({"x": x})["y"], x + 3.0)
    first.release()
    second.release()


def test_enforced_admission_refuses_without_grant(runtime_dir: Path, state_dir: Path) -> None:
    with running_driver("reference", runtime_dir, state_dir):
        dev = nn.device("reference", runtime_dir)
        try:
            with pytest.raises(GrantRequired):
                dev.prepare_model(add_model(), grant=None)
            with pytest.raises(GrantRequired):
                dev.prepare_model(add_model(), grant="0" * 32)
        finally:
            dev.close()


def test_staged_inputs_and_output_views_skip_copies(dev: nn.Device) -> None:
    shape = (256, 1024)
    model = dev.prepare_model(relu_model(shape))
    bufs = model.input_buffers()
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    bufs["x"][...] = x
    out = model.execute(bufs, copy_outputs=False)
    np.testing.assert_array_equal(out["y"], np.maximum(x, 0))
    pool = model._staging
    assert pool is not None
    assert model._staged_offset(pool, out["y"]) is not None, "the output is a pool view"
    bufs["x"][...] = -x  # in place: the next call sees the new values, nothing re-sent
    np.testing.assert_array_equal(model.execute(bufs)["y"], np.maximum(-x, 0))
    del out, bufs
    model.release()
