"""Where a background load's work runs (``load_cpus``: drivers/load_place.py) and glibc's
tunables for the compile child (``compile_malloc``: hal/malloc_tune.py): real threads,
a real compile child, real ONNX Runtime. What the camera gains is bench/contention.py's."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from npumanager.drivers.load_place import LoadPlace, Placed
from npumanager.drivers.prepare import Preparer
from npumanager.drivers.reference import ReferenceDriver
from npumanager.hal.host_config import HostConfig
from npumanager.hal.malloc_tune import tunables_env
from tests.drivers.test_compile_worker import mlp, prepare

CPUS = sorted(os.sched_getaffinity(0))
two_cpus = pytest.mark.skipif(len(CPUS) < 2, reason="needs two CPUs")


def test_all_places_nothing_and_bad_modes_are_refused() -> None:
    place = LoadPlace("all")
    assert place.load_cpus is None and place.foreground_cpus() is None
    with pytest.raises(ValueError, match="load_cpus must be one of all, last, split"):
        LoadPlace("first")


@two_cpus
def test_last_and_split() -> None:
    last = LoadPlace("last")
    assert last.load_cpus == {CPUS[-1]}
    assert last.foreground_cpus() is None  # the foreground is not placed
    split = LoadPlace("split")
    assert split.load_cpus == {CPUS[-1]}
    assert split.foreground_cpus() == frozenset(CPUS)
    with split.loading():
        assert split.foreground_cpus() == frozenset(CPUS[:-1])
    assert split.loads == 0 and split.foreground_cpus() == frozenset(CPUS)


@two_cpus
def test_a_foreground_burst_thread_keeps_off_the_load_cpu_while_a_load_runs() -> None:
    place = LoadPlace("split")
    seen: list[Any] = []
    step = threading.Event()
    done = threading.Event()

    def thread() -> None:  # a burst thread's calls, before each wait for a request
        placed = Placed(place)
        for foreground in (True, True, False, True):
            step.wait(10)
            step.clear()
            placed.update(foreground)
            seen.append(os.sched_getaffinity(0))
            done.set()

    t = threading.Thread(target=thread)
    t.start()

    def next_step() -> None:
        done.clear()
        step.set()
        assert done.wait(10)

    next_step()  # no load: left alone
    with place.loading():
        next_step()  # a load and a FOREGROUND stream: off the load's CPU
        next_step()  # a BACKGROUND stream: anywhere
        next_step()
    t.join(10)
    assert seen == [set(CPUS), set(CPUS[:-1]), set(CPUS), set(CPUS[:-1])]


def _preparer(tmp_path: Path, **keys: Any) -> Iterator[Preparer]:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    # (nice, not SCHED_IDLE: tests/drivers/test_compile_worker.py's preparer says why)
    hc = HostConfig("reference", background_sched="nice", **keys)
    driver = ReferenceDriver({})
    p = Preparer(hc, driver, driver.get_number_of_cache_files_needed(), state)
    try:
        yield p
    finally:
        p.close()


@pytest.fixture
def pinned(tmp_path: Path) -> Iterator[Preparer]:
    yield from _preparer(tmp_path, load_cpus="split", compile_malloc="keep")


def _affinity(pid: int) -> set[str]:
    out = set()
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/status") as f:
            out |= {ln.split(":")[1].strip() for ln in f if ln.startswith("Cpus_allowed_list")}
    return out


@two_cpus
def test_the_compile_child_and_the_session_build_run_on_the_last_cpu(
        pinned: Preparer) -> None:
    hook, loads = pinned._worker_hook, []
    assert hook is not None

    def counting(*a: Any) -> Any:  # (the real hook, on the session build's thread)
        loads.append((pinned.place.loads, os.sched_getaffinity(0)))
        return hook(*a)

    pinned._worker_hook = counting
    done = prepare(pinned, mlp())
    assert done.model is not None
    assert loads == [(1, {CPUS[-1]})] and pinned.place.loads == 0
    worker = pinned.worker
    assert worker is not None and worker.pid is not None
    assert _affinity(worker.pid) == {str(CPUS[-1])}  # every thread of the child
    with open(f"/proc/{worker.pid}/environ", "rb") as f:
        env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
    assert b"glibc.malloc.mmap_max=0" in env[b"GLIBC_TUNABLES"]


def _minflt(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rpartition(")")[2].split()[7])


def _second_compile_faults(tmp_path: Path, mode: str) -> int:
    gen = _preparer(tmp_path / mode, compile_malloc=mode)
    p = next(gen)
    try:
        model = mlp(1024)  # a 4 MiB weight: each compile maps its buffers
        prepare(p, model)
        assert p.worker is not None and p.worker.pid is not None
        before = _minflt(p.worker.pid)
        prepare(p, model)
        return _minflt(p.worker.pid) - before
    finally:
        gen.close()


def test_keep_reuses_the_last_compiles_memory(tmp_path: Path) -> None:
    (tmp_path / "default").mkdir()
    (tmp_path / "keep").mkdir()
    default = _second_compile_faults(tmp_path, "default")
    keep = _second_compile_faults(tmp_path, "keep")
    # The default child faults each model-sized buffer in again (4 MiB: 1024 pages each);
    # "keep" finds them in its heap.
    assert keep < default / 2, (keep, default)


def test_tunables_are_added_to_any_already_set() -> None:
    assert tunables_env("default", {"A": "1"}) == {"A": "1"}
    env = tunables_env("hugepages", {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"})
    assert env["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"
    with pytest.raises(ValueError, match="compile_malloc must be one of"):
        tunables_env("huge", {})


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(ln.split()[1]) for ln in f if ln.startswith("VmRSS:"))


def test_a_keep_child_gives_its_memory_back_once_idle(tmp_path: Path) -> None:
    gen = _preparer(tmp_path, compile_malloc="keep")
    p = next(gen)
    try:
        prepare(p, mlp(1024))
        assert p.worker is not None and p.worker.pid is not None
        kept = _rss_kib(p.worker.pid)
        deadline = time.monotonic() + 30
        while _rss_kib(p.worker.pid) > kept - 8 * 1024 and time.monotonic() < deadline:
            time.sleep(0.2)  # (trimmed KEEP_IDLE_S after the compile)
        assert _rss_kib(p.worker.pid) <= kept - 8 * 1024, (kept, _rss_kib(p.worker.pid))
    finally:
        gen.close()
