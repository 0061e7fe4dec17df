"""Tampering with the reference driver's cache files never yields a crash or another model.

The attacks are the public suite (npumanager.testing.cache_security), run here with
(1, 1) and (2, 2) cache files; the openvino and torch drivers run the same suite in
tests/drivers/test_backend_cache_security.py. Below it, what only the reference
driver has: a driver with caching off, and processes racing on an empty cache.
"""

from __future__ import annotations

import multiprocessing
from pathlib import Path
from typing import Any

import pytest

from npumanager.drivers.base import Driver
from npumanager.drivers.cache_store import DriverCache
from npumanager.drivers.reference import ReferenceDriver
from npumanager.errors import GeneralFailure
from npumanager.testing.backend_models import onnx_linear
from npumanager.testing.cache_flow import prepare
from npumanager.testing.cache_security import TA, CacheBackend, CacheSecuritySuite

A = onnx_linear(1)


def make_reference(options: dict[str, Any]) -> Driver:
    return ReferenceDriver(options)


@pytest.fixture(scope="class", params=[(1, 1), (2, 2)], ids=["1+1", "2+2"])
def reference_backend(request: pytest.FixtureRequest) -> CacheBackend:
    return CacheBackend("reference", make_reference, A, onnx_linear(2), counts=request.param)


class TestReferenceCacheSecurity(CacheSecuritySuite):
    @pytest.fixture(scope="class")
    @classmethod
    def cache_backend(cls, reference_backend: CacheBackend) -> CacheBackend:
        return reference_backend


def make(state_dir: Path) -> tuple[ReferenceDriver, DriverCache]:
    driver = ReferenceDriver()
    return driver, DriverCache("reference", driver.version, 1, 1, state_root=state_dir)


def test_load_on_caching_disabled_driver(state_dir: Path) -> None:
    cache = DriverCache("reference", "v", 0, 0, state_root=state_dir)
    try:
        with pytest.raises(GeneralFailure):
            cache.load(TA, [], [], uid=1001)
    finally:
        cache.close()


def _proc_prepare(
    state_dir: str, app: str, rounds: int, q: multiprocessing.Queue[list[tuple[bool, bool]]]
) -> None:
    driver, cache = make(Path(state_dir))
    results = []
    try:
        for _ in range(rounds):
            m, hit = prepare(driver, cache, A.data, TA, app)
            results.append((hit, A.matches(m.run(A.inputs))))
    finally:
        cache.close()
    q.put(results)


@pytest.mark.slow
def test_several_processes_compile_the_same_token(state_dir: Path, tmp_path: Path) -> None:
    """On an empty cache: processes compile, save and load the same token at once."""
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
        m, hit = prepare(driver, cache, A.data, TA, tmp_path)
        assert hit and A.matches(m.run(A.inputs))
    finally:
        cache.close()
