"""Models with external data through a real driver host: the client opens the model's
files with the app's own rights and sends fds; the driver binds the data to them. A model
past protobuf's 2 GiB keeps working that way."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from npumanager import nn
from npumanager.errors import InvalidArgument
from npumanager.testing.driver_host import DriverProcess, running_driver
from npumanager.testing.external_models import (
    referencing_model,
    save_big_external_model,
    save_external_model,
)

pytestmark = pytest.mark.slow

X = np.arange(4, dtype=np.float32).reshape(1, 4)


@pytest.fixture(scope="module")
def open_driver() -> Iterator[tuple[DriverProcess, Path]]:
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


def test_a_model_with_external_data_prepares_from_its_path_and_caches(
        dev: nn.Device, tmp_path: Path) -> None:
    path = save_external_model(tmp_path / "m", scale=3.0, bias=0.5)
    model = dev.prepare_model(path)
    np.testing.assert_allclose(model.execute({"x": X})["y"], X * 3.0 + 0.5)
    model.release()
    cache, token = tmp_path / "cache", bytes(range(32))
    cache.mkdir()
    first = dev.prepare_model(path, cache_dir=cache, token=token)
    again = dev.prepare_model(path, cache_dir=cache, token=token)
    assert (first.loaded_from_cache, again.loaded_from_cache) == (False, True)
    np.testing.assert_allclose(again.execute({"x": X})["y"], X * 3.0 + 0.5)


def test_the_same_model_as_bytes_is_refused_by_the_driver(dev: nn.Device,
                                                           tmp_path: Path) -> None:
    # Bytes have no directory to resolve names in: the references reach the driver as
    # they are, and it refuses them (it never looks for the file itself).
    path = save_external_model(tmp_path / "m")
    with pytest.raises(InvalidArgument, match=r"tensor 'scale' refers to external data "
                       r"'weights\.bin', which the client did not send"):
        dev.prepare_model(path.read_bytes())


def test_the_client_keeps_a_models_locations_inside_its_directory(
        dev: nn.Device, tmp_path: Path) -> None:
    for location in ("../outside.bin", "/etc/passwd"):
        path = tmp_path / "evil.onnx"
        path.write_bytes(referencing_model(location))
        with pytest.raises(InvalidArgument, match=f"names external data '{location}' "
                           "outside its directory"):
            dev.prepare_model(path)
    path.write_bytes(referencing_model("missing.bin"))
    with pytest.raises(InvalidArgument, match=r"cannot read external data 'missing\.bin'"):
        dev.prepare_model(path)


@pytest.mark.timeout(600)  # ~10 s on a quiet machine; far more while other tests run
def test_a_model_past_protobufs_2_gib_prepares_through_the_fds(dev: nn.Device) -> None:
    """Two float32 tensors of 1.06 GiB each in one sparse weights file (2.1 GiB: no single
    protobuf could hold them; no disk is used). The client sends the file's fd; the driver
    reads its bytes once (peak: that copy and ONNX Runtime's; then ONNX Runtime's only)."""
    elements = 285_000_000
    d = Path(tempfile.mkdtemp(prefix="npu-big-", dir="/tmp"))
    try:
        path = save_big_external_model(d, elements, tensors=2)
        assert os.path.getsize(d / "big.bin") > 2 << 30 and path.stat().st_size < 4096
        t0 = time.monotonic()
        model = dev.prepare_model(path)
        took = time.monotonic() - t0
        out = model.execute({"idx": np.array([elements - 1], np.int64)})["y"]
        np.testing.assert_array_equal(out, [1.0, 2.0])
        assert model.memory_bytes >= 8 * elements
        model.release()
        print(f"prepared a 2.1 GiB external-data model in {took:.1f} s")
    finally:
        shutil.rmtree(d, ignore_errors=True)
