"""Tensor codecs and shared-memory pools (npumanager.tensorio): bounds, dtypes, seals."""

from __future__ import annotations

import fcntl
import mmap
import os

import numpy as np
import pytest

from npumanager import tensorio
from npumanager.errors import InvalidArgument


def test_inline_round_trip_keeps_dtype_and_shape() -> None:
    for arr in (np.arange(6, dtype=np.int64).reshape(2, 3), np.ones((1, 4), np.float16),
                np.array([True, False])):
        back = tensorio.inline_array(tensorio.inline_msg("t", arr))
        assert back.dtype == arr.dtype and back.shape == arr.shape
        np.testing.assert_array_equal(back, arr)


def test_inline_size_mismatch_and_bad_dtypes_are_invalid() -> None:
    msg = tensorio.inline_msg("t", np.ones(4, np.float32))
    msg.shape[:] = [5]
    with pytest.raises(InvalidArgument):
        tensorio.inline_array(msg)
    for dtype in ("object", "U4", "no-such-type"):
        msg = tensorio.inline_msg("t", np.ones(1, np.float32))
        msg.dtype = dtype
        with pytest.raises(InvalidArgument):
            tensorio.inline_array(msg)
    msg = tensorio.inline_msg("t", np.ones(4, np.float32))
    msg.shape[:] = [-1, -4]
    with pytest.raises(InvalidArgument):
        tensorio.inline_array(msg)


def test_pool_views_are_bounds_checked() -> None:
    pool = tensorio.ClientPool(4096)
    try:
        v = tensorio.view_in(pool.buf, 64, 16, "float32", (4,), "x")
        v[:] = 1.0
        del v
        with pytest.raises(InvalidArgument):
            tensorio.view_in(pool.buf, 4090, 16, "float32", (4,), "x")
        with pytest.raises(InvalidArgument):
            tensorio.view_in(pool.buf, 0, 12, "float32", (4,), "x")
    finally:
        pool.close()


def test_driver_maps_only_sealed_memfds_of_the_claimed_size() -> None:
    pool = tensorio.ClientPool(8192)
    try:
        mapped = tensorio.MappedPool(pool.fd, 8192)
        mapped.buf[:4] = b"abcd"
        assert pool.buf[:4] == b"abcd"  # one shared mapping
        mapped.close()
        with pytest.raises(InvalidArgument):
            tensorio.MappedPool(pool.fd, 1 << 20)  # claims more than the memfd holds
    finally:
        pool.close()
    unsealed = os.memfd_create("x", os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(unsealed, 4096)
        with pytest.raises(InvalidArgument, match="sealed"):
            tensorio.MappedPool(unsealed, 4096)  # could shrink under the driver: SIGBUS
        fcntl.fcntl(unsealed, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
        tensorio.MappedPool(unsealed, 4096).close()
    finally:
        os.close(unsealed)
    fd = os.open("/dev/null", os.O_RDWR)
    try:
        with pytest.raises(InvalidArgument, match="memfd"):
            tensorio.MappedPool(fd, 4096)
    finally:
        os.close(fd)
    assert mmap.PAGESIZE > 0


def test_dtype_names_are_memoized_numpy_names() -> None:
    assert tensorio.dtype_name(np.dtype(np.float32)) == "float32"
    assert tensorio.dtype_name(np.dtype(np.int8)) == "int8"
