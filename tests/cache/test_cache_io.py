"""Writing and reading cache files through fds of any offset, size and access mode."""

from __future__ import annotations

import fcntl
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from npumanager.drivers.cache_io import dup_fds, locked, read_cache_files, write_cache_files
from npumanager.errors import GeneralFailure, InvalidArgument


@pytest.fixture
def files(tmp_path: Path) -> Iterator[list[int]]:
    fds = [os.open(tmp_path / f"f{i}", os.O_RDWR | os.O_CREAT, 0o600) for i in range(3)]
    yield fds
    for fd in fds:
        os.close(fd)


def test_round_trip_any_offset_any_prior_size(files: list[int]) -> None:
    for fd in files:
        os.write(fd, b"old content that is longer than the new one" * 10)
        os.lseek(fd, 17, os.SEEK_SET)
    blobs = [b"alpha", b"", b"\x00\xffgamma" * 1000]
    write_cache_files(files, blobs)
    for fd in files:
        os.lseek(fd, 5, os.SEEK_SET)
    assert read_cache_files(files, 1 << 20) == blobs
    assert [os.fstat(fd).st_size for fd in files] == [len(b) for b in blobs]


def test_write_count_mismatch_is_general_failure(files: list[int]) -> None:
    with pytest.raises(GeneralFailure):
        write_cache_files(files, [b"a"])


def test_read_bound_is_total(files: list[int]) -> None:
    write_cache_files(files, [b"a" * 10, b"b" * 10, b"c" * 10])
    assert len(b"".join(read_cache_files(files, 30))) == 30
    with pytest.raises(GeneralFailure):
        read_cache_files(files, 29)


def test_write_only_fd_cannot_be_read(tmp_path: Path) -> None:
    (tmp_path / "w").write_bytes(b"data")
    fd = os.open(tmp_path / "w", os.O_WRONLY)
    try:
        with pytest.raises(InvalidArgument):
            read_cache_files([fd], 100)
    finally:
        os.close(fd)


def test_read_only_fd_reads_but_cannot_be_written(tmp_path: Path) -> None:
    (tmp_path / "r").write_bytes(b"data")
    fd = os.open(tmp_path / "r", os.O_RDONLY)
    try:
        assert read_cache_files([fd], 100) == [b"data"]
        with pytest.raises(GeneralFailure):
            write_cache_files([fd], [b"x"])
        assert (tmp_path / "r").read_bytes() == b"data"
    finally:
        os.close(fd)


def test_closed_pipe_and_directory_fds_are_invalid(tmp_path: Path) -> None:
    fd = os.open(tmp_path / "x", os.O_RDWR | os.O_CREAT, 0o600)
    os.close(fd)
    with pytest.raises(InvalidArgument):
        read_cache_files([fd], 100)
    r, w = os.pipe()
    d = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for bad in (r, d):
            with pytest.raises(InvalidArgument):
                read_cache_files([bad], 100)
            with pytest.raises(GeneralFailure):
                write_cache_files([bad], [b"x"])
    finally:
        for x in (r, w, d):
            os.close(x)


def test_lock_wait_is_bounded(tmp_path: Path, files: list[int]) -> None:
    # Another open file description of the same file holds an exclusive lock.
    other = os.open(tmp_path / "f1", os.O_RDWR)
    try:
        fcntl.flock(other, fcntl.LOCK_EX)
        with pytest.raises(GeneralFailure):
            read_cache_files(files, 100, lock_timeout_s=0.02)
        with pytest.raises(GeneralFailure):
            write_cache_files(files, [b"a", b"b", b"c"], lock_timeout_s=0.02)
        # Nothing of the entry stayed locked by the failed attempt.
        fcntl.flock(files[0], fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(files[0], fcntl.LOCK_UN)
    finally:
        os.close(other)


def test_writer_excludes_reader(tmp_path: Path, files: list[int]) -> None:
    write_cache_files(files, [b"1", b"1", b"1"])
    reader = [os.open(tmp_path / f"f{i}", os.O_RDWR) for i in range(3)]
    got: list[list[bytes]] = []
    try:
        with locked(files, exclusive=True):
            write_cache_files(files, [b"2", b"2", b"2"], lock=False)
            t = threading.Thread(target=lambda: got.append(read_cache_files(reader, 10)))
            t.start()
            t.join(0.05)
            assert t.is_alive()  # waits for the writer
            write_cache_files(files, [b"3", b"3", b"3"], lock=False)
        t.join()
        assert got == [[b"3", b"3", b"3"]]
    finally:
        for fd in reader:
            os.close(fd)


def test_dup_fds_outlive_the_originals(tmp_path: Path) -> None:
    fd = os.open(tmp_path / "d", os.O_RDWR | os.O_CREAT, 0o600)
    (dup,) = dup_fds([fd])
    os.close(fd)
    try:
        write_cache_files([dup], [b"later"])
        assert (tmp_path / "d").read_bytes() == b"later"
    finally:
        os.close(dup)


def test_dup_fds_exclude_each_other_in_process(files: list[int]) -> None:
    """flock cannot separate holders of one open file description; the in-process lock does."""
    dups = dup_fds(files)
    entered = threading.Event()
    try:
        with locked(files, exclusive=True):
            t = threading.Thread(target=lambda: _lock_and_flag(dups, entered))
            t.start()
            assert not entered.wait(0.05)  # blocked while we hold the entry
        t.join()
        assert entered.is_set()
        with (
            locked(files, exclusive=True),
            pytest.raises(GeneralFailure),
            locked(dups, exclusive=False, timeout_s=0.02),
        ):
            pass
    finally:
        for fd in dups:
            os.close(fd)


def _lock_and_flag(fds: list[int], flag: threading.Event) -> None:
    with locked(fds, exclusive=True):
        flag.set()


def test_same_file_twice_is_locked_once(tmp_path: Path) -> None:
    a = os.open(tmp_path / "same", os.O_RDWR | os.O_CREAT, 0o600)
    b = os.open(tmp_path / "same", os.O_RDWR)
    try:
        write_cache_files([a, b], [b"x", b"yy"], lock_timeout_s=0.1)  # no self-deadlock
        assert read_cache_files([a, b], 10) == [b"yy", b"yy"]
    finally:
        os.close(a)
        os.close(b)
