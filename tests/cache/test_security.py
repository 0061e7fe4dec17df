"""Tampering with cache files never yields a crash or another model.

Everything here runs the exact driver-side code: DriverCache (fd I/O, keyed
verification, SQLite map) and the reference driver's artifact hooks. Every case
asserts the model's outputs against the numpy reference.
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from npumanager.drivers.cache_store import DriverCache
from npumanager.drivers.reference import ReferenceDriver
from npumanager.errors import GeneralFailure, InvalidArgument
from npumanager.fds import close_fds
from npumanager.nn.cache_files import cache_file_names, open_cache_files
from tests.cache.flow import OPTS, compile_and_save, prepare, try_load
from tests.cache.models import LinearModel

TA = bytes(range(32))
TB = bytes(range(1, 33))
A = LinearModel(1)
B = LinearModel(2)

Setup = tuple[ReferenceDriver, DriverCache, Path]


def make(
    state_dir: Path, counts: tuple[int, int] = (1, 1), version: str | None = None
) -> tuple[ReferenceDriver, DriverCache]:
    driver = ReferenceDriver({"model_cache_files": counts[0], "data_cache_files": counts[1]})
    cache = DriverCache(
        "reference", version or driver.version, *counts, state_root=state_dir, lock_timeout_s=0.5
    )
    return driver, cache


@pytest.fixture(params=[(1, 1), (2, 2)], ids=["1+1", "2+2"])
def setup(request: pytest.FixtureRequest, state_dir: Path, tmp_path: Path) -> Iterator[Setup]:
    driver, cache = make(state_dir, request.param)
    app = tmp_path / "app-cache"
    app.mkdir()
    yield driver, cache, app
    cache.close()


def paths(cache: DriverCache, app: Path, token: bytes = TA) -> tuple[list[str], list[str]]:
    return cache_file_names(app, token, cache.n_model, cache.n_data)


def all_paths(cache: DriverCache, app: Path, token: bytes = TA) -> list[str]:
    model, data = paths(cache, app, token)
    return model + data


def test_second_prepare_skips_compilation(setup: Setup) -> None:
    driver, cache, app = setup
    m1, hit1 = prepare(driver, cache, A.onnx_bytes, TA, app)
    m2, hit2 = prepare(driver, cache, A.onnx_bytes, TA, app)
    assert (hit1, hit2) == (False, True)
    assert A.matches(m1.run({"x": A.x})) and A.matches(m2.run({"x": A.x}))
    assert cache.verifier.entries()[0].hits == 1


def _flip(pos: Callable[[int], int]) -> Callable[[bytes], bytes]:
    def f(b: bytes) -> bytes:
        if not b:
            return b"\x01"
        i = pos(len(b))
        return b[:i] + bytes([b[i] ^ 0x01]) + b[i + 1 :]

    return f


TAMPERS: dict[str, Callable[[bytes], bytes]] = {
    "flip-first-bit": _flip(lambda n: 0),
    "flip-middle-bit": _flip(lambda n: n // 2),
    "flip-last-bit": _flip(lambda n: n - 1),
    "append": lambda b: b + b"\x00",
    "append-garbage": lambda b: b + os.urandom(4096),
    "truncate": lambda b: b[: len(b) // 2],
    "truncate-one": lambda b: b[:-1],
    "empty": lambda b: b"",
}


@pytest.mark.parametrize("kind", ["model", "data"])
@pytest.mark.parametrize("tamper", list(TAMPERS))
def test_tampered_file_falls_back_to_compile(setup: Setup, kind: str, tamper: str) -> None:
    driver, cache, app = setup
    prepare(driver, cache, A.onnx_bytes, TA, app)
    model_paths, data_paths = paths(cache, app)
    for p in model_paths if kind == "model" else data_paths:  # every file of that kind
        original = Path(p).read_bytes()
        Path(p).write_bytes(TAMPERS[tamper](original))
        assert try_load(driver, cache, TA, app) is None
        m, hit = prepare(driver, cache, A.onnx_bytes, TA, app)  # falls back and rewrites
        assert not hit and A.matches(m.run({"x": A.x}))
        m, hit = prepare(driver, cache, A.onnx_bytes, TA, app)
        assert hit and A.matches(m.run({"x": A.x}))


def test_swapped_model_and_data_files(setup: Setup) -> None:
    driver, cache, app = setup
    prepare(driver, cache, A.onnx_bytes, TA, app)
    model_paths, data_paths = paths(cache, app)
    a, b = Path(model_paths[0]), Path(data_paths[0])
    ab, bb = a.read_bytes(), b.read_bytes()
    a.write_bytes(bb)
    b.write_bytes(ab)
    m, hit = prepare(driver, cache, A.onnx_bytes, TA, app)
    assert not hit and A.matches(m.run({"x": A.x}))


def test_other_models_cache_copied_over(setup: Setup) -> None:
    driver, cache, app = setup
    prepare(driver, cache, A.onnx_bytes, TA, app)
    mb, hit = prepare(driver, cache, B.onnx_bytes, TB, app)
    assert not hit and B.matches(mb.run({"x": B.x}))
    for src, dst in zip(all_paths(cache, app, TB), all_paths(cache, app, TA), strict=True):
        shutil.copyfile(src, dst)
    assert try_load(driver, cache, TA, app) is None
    m, hit = prepare(driver, cache, A.onnx_bytes, TA, app)
    assert not hit and A.matches(m.run({"x": A.x})) and not B.matches(m.run({"x": A.x}))


def test_flipped_token(setup: Setup) -> None:
    driver, cache, app = setup
    prepare(driver, cache, A.onnx_bytes, TA, app)
    flipped = bytes([TA[0] ^ 0x80]) + TA[1:]
    # The same (genuine) files presented under another token do not verify.
    for src, dst in zip(all_paths(cache, app, TA), all_paths(cache, app, flipped), strict=True):
        shutil.copyfile(src, dst)
    assert try_load(driver, cache, flipped, app) is None
    m, hit = prepare(driver, cache, A.onnx_bytes, flipped, app)
    assert not hit and A.matches(m.run({"x": A.x}))


def _open(cache: DriverCache, app: Path, flags: int) -> tuple[list[int], list[int]]:
    model_paths, data_paths = paths(cache, app)
    fds = [os.open(p, flags) for p in model_paths + data_paths]
    return fds[: cache.n_model], fds[cache.n_model :]


def test_wrong_number_of_fds(setup: Setup) -> None:
    driver, cache, app = setup
    prepare(driver, cache, A.onnx_bytes, TA, app)
    m, d = _open(cache, app, os.O_RDWR)
    try:
        for mm, dd in ((m[:-1], d), (m, d[:-1]), (m + d[:1], d), ([], []), (m, d + m)):
            with pytest.raises(InvalidArgument):
                cache.load(TA, mm, dd)
        assert not cache.save(TA, m[:-1], d, [b""] * (len(m) - 1), [b""] * len(d))
        assert cache.load(TA, m, d)  # the failed save changed nothing
        with pytest.raises(InvalidArgument):
            cache.load(TA[:31], m, d)
    finally:
        close_fds(m + d)


def test_read_only_fds_load_but_do_not_save(setup: Setup) -> None:
    driver, cache, app = setup
    prepare(driver, cache, A.onnx_bytes, TA, app)
    m, d = _open(cache, app, os.O_RDONLY)
    try:
        mb, db = cache.load(TA, m, d)
        assert A.matches(driver.load_artifacts(mb, db, OPTS).run({"x": A.x}))
        model = driver.compile(B.onnx_bytes, OPTS)
        assert not cache.save(TA, m, d, *model.artifacts())  # fails quietly
        assert B.matches(model.run({"x": B.x}))
        assert cache.load(TA, m, d)  # A's entry is intact
    finally:
        close_fds(m + d)


def test_write_only_fds_are_invalid(setup: Setup) -> None:
    driver, cache, app = setup
    prepare(driver, cache, A.onnx_bytes, TA, app)
    m, d = _open(cache, app, os.O_WRONLY)
    try:
        with pytest.raises(InvalidArgument):
            cache.load(TA, m, d)
    finally:
        close_fds(m + d)


def test_nonzero_offsets_and_stale_sizes(setup: Setup) -> None:
    driver, cache, app = setup
    model_paths, data_paths = paths(cache, app)
    for p in model_paths + data_paths:
        Path(p).write_bytes(os.urandom(100_000))  # larger than any artifact here
    fds = open_cache_files(model_paths + data_paths, create=False)
    assert fds is not None
    try:
        for i, fd in enumerate(fds):
            os.lseek(fd, 1234 + i, os.SEEK_SET)
        model = driver.compile(A.onnx_bytes, OPTS)
        n = cache.n_model
        assert cache.save(TA, fds[:n], fds[n:], *model.artifacts())
        for i, fd in enumerate(fds):
            os.lseek(fd, 77 * (i + 1), os.SEEK_SET)
        mb, db = cache.load(TA, fds[:n], fds[n:])
        assert A.matches(driver.load_artifacts(mb, db, OPTS).run({"x": A.x}))
    finally:
        close_fds(fds)


class Rewriter:
    """A thread that keeps overwriting A's cache files (no locks, as an attacker would)
    with B's genuine artifacts, garbage, and half-written copies."""

    def __init__(self, targets: list[str], sources: list[bytes]) -> None:
        self.targets, self.sources = targets, sources
        self.stop = threading.Event()
        self.rounds = 0
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        while not self.stop.is_set():
            for target, src in zip(self.targets, self.sources, strict=True):
                with open(target, "r+b") as f:
                    f.truncate(0)
                    f.write(src[: len(src) // 2])
                    f.flush()
                    f.write(src[len(src) // 2 :])
            self.rounds += 1

    def __enter__(self) -> Rewriter:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


@pytest.mark.slow
def test_rewriter_during_save_and_load(setup: Setup) -> None:
    driver, cache, app = setup
    compile_and_save(driver, cache, B.onnx_bytes, TB, app)
    b_blobs = [Path(p).read_bytes() for p in all_paths(cache, app, TB)]
    prepare(driver, cache, A.onnx_bytes, TA, app)
    targets = all_paths(cache, app, TA)
    hits = 0
    with Rewriter(targets, b_blobs) as rw:
        for _ in range(12):
            m, hit = prepare(driver, cache, A.onnx_bytes, TA, app)  # saves and loads race
            hits += hit
            out = m.run({"x": A.x})
            assert A.matches(out) and not B.matches(out)
    assert rw.rounds > 0
    # Once the rewriter is gone the driver recovers: compile, save, then a hit.
    prepare(driver, cache, A.onnx_bytes, TA, app)
    m, hit = prepare(driver, cache, A.onnx_bytes, TA, app)
    assert hit and A.matches(m.run({"x": A.x}))


def test_restart_persistence_and_version_change(state_dir: Path, tmp_path: Path) -> None:
    driver, cache = make(state_dir)
    prepare(driver, cache, A.onnx_bytes, TA, tmp_path)
    cache.close()
    driver, cache = make(state_dir)  # a restarted driver host
    m, hit = prepare(driver, cache, A.onnx_bytes, TA, tmp_path)
    assert hit and A.matches(m.run({"x": A.x}))
    cache.close()
    driver, cache = make(state_dir, version=driver.version + "+backend-update")
    assert cache.verifier.entries() == []
    m, hit = prepare(driver, cache, A.onnx_bytes, TA, tmp_path)
    assert not hit and A.matches(m.run({"x": A.x}))
    m, hit = prepare(driver, cache, A.onnx_bytes, TA, tmp_path)
    assert hit
    cache.close()


def test_load_on_caching_disabled_driver(state_dir: Path, tmp_path: Path) -> None:
    _, cache = make(state_dir, (0, 0))
    try:
        with pytest.raises(GeneralFailure):
            cache.load(TA, [], [])
    finally:
        cache.close()


def _proc_prepare(
    state_dir: str, app: str, rounds: int, q: multiprocessing.Queue[list[tuple[bool, bool]]]
) -> None:
    driver, cache = make(Path(state_dir))
    results = []
    try:
        for _ in range(rounds):
            m, hit = prepare(driver, cache, A.onnx_bytes, TA, app)
            results.append((hit, A.matches(m.run({"x": A.x}))))
    finally:
        cache.close()
    q.put(results)


@pytest.mark.slow
def test_several_processes_prepare_the_same_token(state_dir: Path, tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("forkserver")
    q = ctx.Queue()
    procs = [
        ctx.Process(target=_proc_prepare, args=(str(state_dir), str(tmp_path), 6, q))
        for _ in range(3)
    ]
    for p in procs:
        p.start()
    results = [q.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    q.close()
    q.join_thread()
    flat = [r for rs in results for r in rs]
    assert all(ok for _, ok in flat)
    assert any(hit for hit, _ in flat)
    driver, cache = make(state_dir)
    try:
        m, hit = prepare(driver, cache, A.onnx_bytes, TA, tmp_path)
        assert hit and A.matches(m.run({"x": A.x}))
    finally:
        cache.close()
