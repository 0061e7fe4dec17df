"""The torch driver: a real transformer block against eager PyTorch, packages loaded only from
private copies, and .pt2 archives that would run code in the driver refused before torch
reads them."""

from __future__ import annotations

import io
import json
import os
import pickle
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from npumanager.drivers.base import CompileOptions
from npumanager.errors import GeneralFailure, InvalidArgument
from npumanager.testing.backend_models import BuiltModel
from tests.drivers.backends import inductor_dir, make_torch, needs_torch

pytestmark = [needs_torch, pytest.mark.timeout(900)]
OPTS = CompileOptions()


@pytest.fixture(scope="module")
def driver() -> Iterator[Any]:
    d = make_torch({"inductor_cache_dir": str(inductor_dir())})
    yield d
    d.close()


@pytest.fixture(scope="module")
def block() -> BuiltModel:
    from npumanager.testing.backend_models import transformer_block

    return transformer_block(d=32, heads=4, seq=8)


class _Marker:
    """Unpickling this would create a file: proof that a pickle ran."""

    path = ""

    def __reduce__(self) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        return (open, (self.path, "w"))


def _rewrite(pt2: bytes, change: Callable[[str, bytes], tuple[str, bytes] | None],
             add: dict[str, bytes] | None = None) -> bytes:
    """A copy of the archive with entries changed (None drops one) or added."""
    src = zipfile.ZipFile(io.BytesIO(pt2))
    top = src.namelist()[0].split("/")[0]
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as dst:
        for info in src.infolist():
            rel = info.filename.split("/", 1)[1]
            changed = change(rel, src.read(info))
            if changed is not None:
                dst.writestr(f"{top}/{changed[0]}", changed[1])
        for rel, data in (add or {}).items():
            dst.writestr(f"{top}/{rel}", data)
    return out.getvalue()


@pytest.mark.slow
def test_transformer_block_matches_eager_torch_compiled_and_from_cache(
        driver: Any, block: BuiltModel) -> None:
    m = driver.compile(block.data, OPTS)
    assert [t.name for t in m.inputs] == ["x"] and [t.name for t in m.outputs] == ["y"]
    assert block.matches(m.run(block.inputs))
    model_blobs, data_blobs = m.artifacts()
    assert data_blobs == []
    loaded = driver.load_artifacts(model_blobs, data_blobs, OPTS)
    assert block.matches(loaded.run(block.inputs))
    # Loaded from a private copy, which is gone once the loader has what it needs.
    assert list(driver.package_dir.iterdir()) == []
    assert os.stat(driver.work_dir).st_mode & 0o777 == 0o700
    with pytest.raises(GeneralFailure):
        driver.load_artifacts([model_blobs[0][:-100]], [], OPTS)


def test_private_dirs_replace_the_temp_dir_until_close() -> None:
    before = (os.environ.get("TMPDIR"), tempfile.tempdir)
    d = make_torch({})
    try:
        assert os.environ["TMPDIR"].startswith(str(d.work_dir))
        assert tempfile.gettempdir().startswith(str(d.work_dir))
        assert d.get_number_of_cache_files_needed() == (1, 0)
        assert d.capabilities().extra["device"] == "cpu"
    finally:
        d.close()
    assert (os.environ.get("TMPDIR"), tempfile.tempdir) == before
    assert not d.work_dir.exists()
    with pytest.raises(InvalidArgument, match="asked for"):
        make_torch({"devices": ["cuda:7"]})


def test_archives_that_would_run_code_are_refused(tmp_path: Path) -> None:
    from npumanager.drivers.torch_package import vet_exported_program
    from npumanager.testing.backend_models import torch_linear

    pt2 = torch_linear(1).data
    vet_exported_program(pt2)  # the genuine program passes

    def pickled_weights(rel: str, data: bytes) -> tuple[str, bytes]:
        if rel.endswith("weights_config.json"):
            config = json.loads(data)
            for meta in config["config"].values():
                meta["use_pickle"] = True
            data = json.dumps(config).encode()
        return rel, data

    marker = tmp_path / "pwned"
    _Marker.path = str(marker)
    evil = pickle.dumps(_Marker())

    def evil_samples(rel: str, data: bytes) -> tuple[str, bytes]:
        return rel, evil if rel.startswith("data/sample_inputs/") else data

    bad = {
        "pickled weights": _rewrite(pt2, pickled_weights),
        "pickled sample inputs": _rewrite(pt2, evil_samples),
        "compiled code": _rewrite(pt2, lambda r, d: (r, d),
                                  {"data/aotinductor/model/x.wrapper.so": b"\x7fELF"}),
        "legacy weights": _rewrite(pt2, lambda r, d: (r, d), {"data/weights/model.pt": evil}),
        "no program": _rewrite(pt2, lambda r, d: None if r.startswith("models/") else (r, d)),
        "not a zip": b"PK\x03\x04 not really",
    }
    for what, data in bad.items():
        with pytest.raises(InvalidArgument):
            vet_exported_program(data)
        assert not marker.exists(), f"{what}: a pickle ran"
    traversal = io.BytesIO()
    with zipfile.ZipFile(traversal, "w") as z:
        z.writestr("pkg/../../evil.so", b"x")
        z.writestr("pkg/models/model.json", b"{}")
    with pytest.raises(InvalidArgument, match="unsafe"):
        vet_exported_program(traversal.getvalue())


def test_driver_refuses_bad_programs_before_compiling(driver: Any) -> None:
    for junk in (b"", b"garbage", b"PK\x05\x06" + bytes(18)):
        with pytest.raises(InvalidArgument):
            driver.compile(junk, OPTS)


def test_private_copy_and_package_names(tmp_path: Path) -> None:
    from npumanager.drivers.torch_package import check_package_names, write_private_copy

    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    p = write_private_copy(private, b"bytes")
    assert p.parent == private and p.read_bytes() == b"bytes"
    assert os.stat(p).st_mode & 0o777 == 0o600
    assert write_private_copy(private, b"bytes") != p  # a new name every time
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    with pytest.raises(GeneralFailure, match="not a private directory"):
        write_private_copy(shared, b"bytes")
    z = io.BytesIO()
    with zipfile.ZipFile(z, "w") as zf:
        zf.writestr("pkg/data/aotinductor/model/../../../../x.so", b"x")
    with pytest.raises(GeneralFailure):
        check_package_names(z.getvalue())
    with pytest.raises(GeneralFailure):
        check_package_names(b"not a zip")
