"""JIT and multi-stage compilation with cache rewrites under file locks."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest

from npumanager.drivers.cache_store import DriverCache
from npumanager.drivers.reference import ReferenceDriver
from npumanager.drivers.reference_cache import artifacts_from_onnx
from npumanager.drivers.staged import CacheRewriter, StagedModel, check_mode
from npumanager.errors import GeneralFailure, InvalidArgument
from npumanager.fds import close_fds
from npumanager.nn.cache_files import cache_file_names, open_cache_files
from tests.cache.flow import OPTS, try_load
from tests.cache.models import LinearModel

TA = bytes(range(32))
A = LinearModel(1)


@pytest.fixture
def cache(state_dir: Path) -> Iterator[DriverCache]:
    c = DriverCache("reference", "test-version", 1, 1, state_root=state_dir)
    yield c
    c.close()


def entry_fds(app: Path, create: bool = True) -> tuple[list[int], list[int]]:
    m, d = cache_file_names(app, TA, 1, 1)
    fds = open_cache_files(m + d, create=create)
    assert fds is not None
    return fds[:1], fds[1:]


def attach(model: StagedModel, cache: DriverCache, app: Path) -> CacheRewriter:
    """What the host does after a prepare with cache fds: dup them, then close its own."""
    m, d = entry_fds(app)
    try:
        rw = CacheRewriter(partial(cache.save, uid=1001), TA, m, d)
        model.attach_cache(rw)
    finally:
        close_fds(m + d)
    return rw


def staged(mode: str, **opts: object) -> tuple[ReferenceDriver, StagedModel]:
    driver = ReferenceDriver({"compile_mode": mode, **opts})
    model = driver.compile(A.onnx_bytes, OPTS)
    assert isinstance(model, StagedModel)
    return driver, model


def test_modes() -> None:
    assert check_mode("multi-stage") == "multistage" and check_mode("JIT") == "jit"
    with pytest.raises(InvalidArgument):
        check_mode("lazy")


def test_jit_compiles_at_first_execution_then_caches(cache: DriverCache, tmp_path: Path) -> None:
    driver, model = staged("jit")
    assert model.stage == 0
    assert [(t.name, t.dtype, t.shape) for t in model.inputs] == [("x", "float32", (-1, 16))]
    with pytest.raises(NotImplementedError):
        model.artifacts()  # the host's save at prepare declines quietly
    attach(model, cache, tmp_path)
    assert try_load(driver, cache, TA, tmp_path) is None  # nothing written yet
    assert A.matches(model.run({"x": A.x}))
    assert model.stage == 2 and model.wait_idle(10)
    loaded = try_load(driver, cache, TA, tmp_path)
    assert loaded is not None and A.matches(loaded.run({"x": A.x}))
    model.release()


def test_jit_run_before_attach_still_caches(cache: DriverCache, tmp_path: Path) -> None:
    driver, model = staged("jit")
    assert A.matches(model.run({"x": A.x}))  # compiled without artifacts
    attach(model, cache, tmp_path)
    assert model.wait_idle(10)
    loaded = try_load(driver, cache, TA, tmp_path)
    assert loaded is not None and A.matches(loaded.run({"x": A.x}))
    model.release()


def test_multistage_recompiles_after_n_runs_and_rewrites(
    cache: DriverCache, tmp_path: Path
) -> None:
    driver, model = staged("multistage", recompile_after=3)
    assert model.stage == 1
    m, d = entry_fds(tmp_path)
    # The host's save at prepare: stage 1.
    assert cache.save(TA, m, d, *model.artifacts(), uid=1001)
    close_fds(m + d)
    rw = attach(model, cache, tmp_path)
    stage1_created = cache.verifier.entries()[0].created
    for _ in range(2):
        assert A.matches(model.run({"x": A.x}))
    assert model.wait_idle(10) and model.stage == 1 and rw.writes == 0
    assert A.matches(model.run({"x": A.x}))  # the third run starts the recompile
    assert model.wait_idle(10)
    assert model.stage == 2 and rw.writes == 1
    assert A.matches(model.run({"x": A.x}))
    (entry,) = cache.verifier.entries()
    assert entry.created >= stage1_created  # re-recorded
    loaded = try_load(driver, cache, TA, tmp_path)
    assert loaded is not None and A.matches(loaded.run({"x": A.x}))
    model.release()


def test_release_closes_the_duplicated_fds(cache: DriverCache, tmp_path: Path) -> None:
    before = len(os.listdir("/proc/self/fd"))
    _, model = staged("multistage")
    attach(model, cache, tmp_path)
    assert len(os.listdir("/proc/self/fd")) == before + 2
    model.release()
    assert len(os.listdir("/proc/self/fd")) == before
    with pytest.raises(GeneralFailure):
        model.run({"x": A.x})


@pytest.mark.slow
def test_rewrites_never_expose_a_half_written_entry(cache: DriverCache, tmp_path: Path) -> None:
    """Two writers alternate stage-1 and stage-2 artifacts (each with its own dup'd fds) while
    readers load: every load verifies, and the entry is consistent at the end."""
    driver = ReferenceDriver({})
    stage1 = artifacts_from_onnx(A.onnx_bytes, "disabled")  # MatMul + Add
    stage2 = artifacts_from_onnx(A.onnx_bytes, "all")  # fused into Gemm
    assert stage1 != stage2
    m, d = entry_fds(tmp_path)
    assert cache.save(TA, m, d, *stage1, uid=1001)
    writers = [CacheRewriter(partial(cache.save, uid=1001), TA, m, d) for _ in range(2)]
    close_fds(m + d)
    stop = threading.Event()
    failures: list[BaseException] = []
    loads = 0

    def write(rw: CacheRewriter, blobs: tuple[list[bytes], list[bytes]]) -> None:
        while not stop.is_set():
            if not rw.write(*blobs):
                failures.append(AssertionError("a rewrite failed"))
            stop.wait(0.005)  # leave the readers windows (locks are not fair)

    def read() -> None:
        nonlocal loads
        while not stop.is_set():
            mm, dd = entry_fds(tmp_path, create=False)
            try:
                bufs = cache.load(TA, mm, dd, uid=1001)
                loads += 1
                if not A.matches(driver.load_artifacts(*bufs, OPTS).run({"x": A.x})):
                    failures.append(AssertionError("wrong outputs"))
            except Exception as exc:
                failures.append(exc)
            finally:
                close_fds(mm + dd)

    threads = [
        threading.Thread(target=write, args=(writers[0], stage1)),
        threading.Thread(target=write, args=(writers[1], stage2)),
        threading.Thread(target=read),
    ]
    for t in threads:
        t.start()
    stop.wait(1.0)
    stop.set()
    for t in threads:
        t.join()
    for w in writers:
        w.close()
    assert failures == []
    assert loads > 0
    loaded = try_load(driver, cache, TA, tmp_path)
    assert loaded is not None and A.matches(loaded.run({"x": A.x}))
