"""Driver token derivation and NNAPI cache file naming/opening."""

from __future__ import annotations

import hashlib
import os
import struct
from pathlib import Path

import pytest

from npumanager import nn
from npumanager.errors import InvalidArgument
from npumanager.nn.cache_files import cache_file_names, open_cache_files, token_string
from npumanager.nn.token import driver_token

APP = bytes(range(32))


def test_driver_token_is_tokenhasher_sha256() -> None:
    expected = hashlib.sha256(APP + b"reference" + b"1.0" + struct.pack("<iii", 1, 100, 0)).digest()
    assert driver_token(APP, "reference", "1.0", 1, 100) == expected
    assert len(expected) == 32


@pytest.mark.parametrize(
    "change",
    [
        {"device_name": "other"},
        {"device_version": "1.1"},
        {"preference": 0},
        {"priority": 110},
        {"partitioning": 1},
        {"app_token": bytes(31) + b"\x01"},
    ],
)
def test_every_input_changes_the_token(change: dict[str, object]) -> None:
    base: dict[str, object] = {
        "app_token": APP,
        "device_name": "reference",
        "device_version": "1.0",
        "preference": 1,
        "priority": 100,
        "partitioning": 0,
    }
    assert driver_token(**{**base, **change}) != driver_token(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [b"", bytes(31), bytes(33), "x" * 32, None])
def test_token_must_be_32_bytes(bad: object) -> None:
    with pytest.raises(InvalidArgument):
        driver_token(bad, "reference", "1", 1, 100)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument):
        cache_file_names("/tmp", bad, 1, 1)  # type: ignore[arg-type]


def test_file_names_as_nnapi_builds_them() -> None:
    token = bytes([0x12, 0xF0] + [0] * 30)
    letters = token_string(token)
    assert letters.startswith("CBAP")  # 0x12 -> 'A'+2 'A'+1; 0xF0 -> 'A'+0 'A'+15
    assert len(letters) == 64 and letters[4:] == "A" * 60
    model, data = nn.cache_file_names("/some/dir", token, 2, 3)
    assert model == [f"/some/dir/{letters}10", f"/some/dir/{letters}11"]
    assert data == [f"/some/dir/{letters}2{i}" for i in range(3)]
    # A trailing slash is not doubled.
    assert cache_file_names("/some/dir/", token, 1, 0)[0] == [f"/some/dir/{letters}10"]
    assert cache_file_names(Path("/d"), token, 0, 0) == ([], [])
    m, _ = cache_file_names("/d", token, 12, 0)
    assert m[11].endswith(letters + "111")


@pytest.mark.parametrize("n", [-1, 33])
def test_file_counts_bounded(n: int) -> None:
    with pytest.raises(InvalidArgument):
        cache_file_names("/d", APP, n, 0)
    with pytest.raises(InvalidArgument):
        cache_file_names("/d", APP, 0, n)


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_open_never_creates_on_load(tmp_path: Path) -> None:
    model, data = cache_file_names(tmp_path, APP, 1, 2)
    before = _open_fds()
    assert open_cache_files(model + data, create=False) is None
    assert not any(os.path.exists(p) for p in model + data)
    # One present, one missing: still None and nothing leaked.
    Path(model[0]).write_bytes(b"m")
    assert open_cache_files(model + data, create=False) is None
    assert _open_fds() == before


def test_open_creates_rdwr_0600(tmp_path: Path) -> None:
    model, data = cache_file_names(tmp_path, APP, 1, 1)
    fds = open_cache_files(model + data, create=True)
    assert fds is not None
    try:
        for fd, path in zip(fds, model + data, strict=True):
            assert os.stat(path).st_mode & 0o777 == 0o600
            import fcntl

            assert fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDWR
    finally:
        for fd in fds:
            os.close(fd)
    again = open_cache_files(model + data, create=False)
    assert again is not None
    for fd in again:
        os.close(fd)


def test_open_failure_closes_what_it_opened(tmp_path: Path) -> None:
    before = _open_fds()
    paths = [str(tmp_path / "ok"), str(tmp_path / "missing-dir" / "x")]
    assert open_cache_files(paths, create=True) is None
    assert _open_fds() == before
