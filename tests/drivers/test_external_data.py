"""The confused deputy: a driver resolves a model's external data against the files its
client sent, never against a path named inside the model; every backend and the cache
loader refuse a reference to anything else, naming the tensor and the location."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest

from npumanager.drivers.base import CompileOptions
from npumanager.drivers.external_data import BOUND_PREFIX, SentFile, bind, sent_files
from npumanager.drivers.reference import OrtModel, ReferenceDriver
from npumanager.drivers.reference_cache import DATA_NAME, session_from_artifacts
from npumanager.drivers.reference_external import ort_copies_initializers
from npumanager.errors import GeneralFailure, InvalidArgument
from npumanager.tensorio.onnx_external import external_refs, parse_onnx
from npumanager.testing.external_models import (
    PLACES,
    referencing_model,
    save_external_model,
    set_external,
)
from tests.drivers.backends import make_openvino, needs_openvino

X = np.arange(4, dtype=np.float32).reshape(1, 4)
SECRET = np.full((1, 4), 1234.5, np.float32).tobytes()


@pytest.fixture
def secret_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The driver's working directory holds a "secret" at the location the models name:
    if anything resolved the name against the working directory, it would read it."""
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "shadow").write_bytes(SECRET)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def weights_fd(tmp_path: Path) -> Iterator[tuple[str, int]]:
    model = save_external_model(tmp_path / "m")
    fd = os.open(model.parent / "weights.bin", os.O_RDONLY)
    try:
        yield str(model), fd
    finally:
        os.close(fd)


@pytest.mark.parametrize("where", PLACES)
def test_a_reference_the_client_did_not_send_is_refused_wherever_it_hides(
        where: str, secret_cwd: Path) -> None:
    data = referencing_model("etc/shadow", where)
    with pytest.raises(InvalidArgument, match=r"tensor 'W' refers to external data "
                       r"'etc/shadow', which the client did not send: a driver never opens"):
        bind(data, {}, max_bytes=1 << 30)
    # The backends refuse it themselves too, given the bytes without the host's binding.
    with pytest.raises(InvalidArgument, match="refers to external data 'etc/shadow'"):
        ReferenceDriver().compile(data, CompileOptions())


@needs_openvino
@pytest.mark.parametrize("where", PLACES)
def test_openvino_refuses_an_unbound_reference(where: str, secret_cwd: Path) -> None:
    driver = make_openvino({})
    try:
        with pytest.raises(InvalidArgument, match="refers to external data 'etc/shadow'"):
            driver.compile(referencing_model("etc/shadow", where), CompileOptions())
    finally:
        driver.close()


@pytest.mark.parametrize("location", ["../../../../../../etc/shadow", "/etc/shadow",
                                      "*/_ORT_MEM_ADDR_/*", "npu-external-0"])
def test_no_location_string_is_special(location: str, secret_cwd: Path) -> None:
    """Paths out of the directory, absolute paths, ONNX Runtime's in-memory address tag, the
    driver's own bound names: refused unless sent, and then only the sent bytes count."""
    data = referencing_model(location)
    with pytest.raises(InvalidArgument, match="which the client did not send"):
        bind(data, {}, max_bytes=1 << 30)
    fd = os.memfd_create("w")
    try:
        os.write(fd, np.full((1, 4), 2.0, np.float32).tobytes())
        model, external = bind(data, sent_files([location], [fd]), max_bytes=1 << 30)
    finally:
        os.close(fd)
    m = ReferenceDriver().compile(model, CompileOptions(external_data=external))
    np.testing.assert_array_equal(m.run({"x": X})["y"], X + 2.0)


def test_bound_external_data_comes_from_the_fds_the_client_sent(
        weights_fd: tuple[str, int], secret_cwd: Path) -> None:
    path, fd = weights_fd
    data = Path(path).read_bytes()
    model, external = bind(data, sent_files(["weights.bin"], [fd]), max_bytes=1 << 30)
    proto = parse_onnx(model)
    assert proto is not None
    # The initializer keeps a reference, to the driver's own name; the attribute is inline.
    refs = external_refs(proto)
    assert [(r.name, r.location, r.offset) for r in refs] == [("scale", BOUND_PREFIX + "0", 0)]
    assert set(external) == {BOUND_PREFIX + "0"}
    m = ReferenceDriver().compile(model, CompileOptions(external_data=external))
    np.testing.assert_allclose(m.run({"x": X})["y"], X * 3.0 + 0.5)
    # The session holds its own copy (this ONNX Runtime copies): the driver's is dropped.
    assert isinstance(m, OrtModel) and m.binding is not None
    assert m.binding.released == ort_copies_initializers() and m.binding.arrays == [] \
        if ort_copies_initializers() else m.binding.arrays
    # A compile that also yields cache artifacts keeps the weights in the data cache.
    drv = ReferenceDriver()
    cm = drv.compile_with_artifacts(model, CompileOptions(external_data=external))
    mb, db = cm.artifacts()
    assert sum(len(b) for b in db) >= 16
    loaded = drv.load_artifacts(mb, db, CompileOptions())
    np.testing.assert_allclose(loaded.run({"x": X})["y"], X * 3.0 + 0.5)


def test_ranges_files_and_formats_are_checked(tmp_path: Path) -> None:
    w = tmp_path / "w.bin"
    w.write_bytes(bytes(16))
    fd = os.open(w, os.O_RDONLY)
    r, wr = os.pipe()
    try:
        files = {"w.bin": SentFile("w.bin", fd, 16)}
        model = onnx.ModelProto()
        model.ParseFromString(referencing_model("w.bin"))
        set_external(model.graph.initializer[0], "w.bin", offset=8, length=16)
        with pytest.raises(InvalidArgument, match=r"needs bytes 8\.\.24 of external data "
                           r"'w.bin', which holds 16"):
            bind(model.SerializeToString(), files, max_bytes=1 << 30)
        set_external(model.graph.initializer[0], "w.bin", offset=0, length=12)
        with pytest.raises(InvalidArgument, match=r"'W' needs 16 bytes; its external data "
                           r"reference 'w\.bin' gives 12"):
            bind(model.SerializeToString(), files, max_bytes=1 << 30)
        with pytest.raises(InvalidArgument, match="passes driver d's limit of 8 bytes"):
            bind(referencing_model("w.bin"), files, max_bytes=8, driver="d")
        with pytest.raises(InvalidArgument, match="driver torch takes no external data"):
            bind(referencing_model("w.bin"), files, max_bytes=1 << 30, accepts=False,
                 driver="torch")
        with pytest.raises(InvalidArgument, match="go with an ONNX model; this is not one"):
            bind(b"PK\x03\x04 a torch archive", files, max_bytes=1 << 30)
        with pytest.raises(InvalidArgument, match="is not a regular file"):
            sent_files(["w.bin"], [r])
        with pytest.raises(InvalidArgument, match="sent twice"):
            sent_files(["w.bin", "w.bin"], [fd, fd])
        # A self-contained model passes as it is, bytes and all.
        plain = onnx.ModelProto()
        plain.ParseFromString(referencing_model("w.bin"))
        plain.graph.initializer[0].ClearField("external_data")
        plain.graph.initializer[0].data_location = onnx.TensorProto.DEFAULT
        plain.graph.initializer[0].raw_data = bytes(16)
        raw = plain.SerializeToString()
        assert bind(raw, {}, max_bytes=1 << 30) == (raw, {})
    finally:
        os.close(fd)
        os.close(r)
        os.close(wr)


def test_a_file_that_shrinks_meanwhile_is_a_short_read_not_a_crash(tmp_path: Path) -> None:
    w = tmp_path / "w.bin"
    w.write_bytes(bytes(16))
    fd = os.open(w, os.O_RDWR)
    try:
        files = sent_files(["w.bin"], [fd])
        os.ftruncate(fd, 4)  # after the driver looked at its size
        with pytest.raises(InvalidArgument, match="ended after 4 of the 16 bytes"):
            bind(referencing_model("w.bin"), files, max_bytes=1 << 30)
    finally:
        os.close(fd)


@pytest.mark.parametrize("location", ["etc/shadow", "../" * 8 + "etc/passwd", DATA_NAME + "x"])
def test_the_cache_loader_refuses_any_other_external_data(location: str,
                                                          secret_cwd: Path) -> None:
    with pytest.raises(GeneralFailure, match=f"tensor 'W' refers to external data "
                       f"'{location}'"):
        session_from_artifacts([referencing_model(location)], [bytes(16)])
    for where in ("attribute", "function", "subgraph"):
        with pytest.raises(GeneralFailure, match="refers to external data"):
            session_from_artifacts([referencing_model(location, where)], [bytes(16)])
