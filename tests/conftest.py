"""Shared fixtures. Each test gets its own runtime dir; nothing uses fixed paths."""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


def pytest_configure(config: pytest.Config) -> None:
    """Cache bytecode outside the tree when the environment says not to write it.

    With PYTHONDONTWRITEBYTECODE set (as in this project's VMs, and in containers built
    the usual way) and no __pycache__ in the tree, every npud, driver host and ``npu``
    process a test starts compiled npumanager from source (0.75 s to import npud's and
    the reference driver's modules instead of 0.42 s), and each xdist worker rewrote
    every test module's asserts again (11 of its 17 s of collection). Bytecode goes to
    .pytest_cache/pycache (PYTHONPYCACHEPREFIX), never beside the sources, for this
    process, the workers and every process the tests start. An explicit
    PYTHONPYCACHEPREFIX is kept."""
    if not sys.dont_write_bytecode or os.environ.get("PYTHONPYCACHEPREFIX"):
        return
    prefix = config.rootpath / ".pytest_cache" / "pycache"
    try:
        prefix.mkdir(parents=True, exist_ok=True)
    except OSError:
        return  # a read-only checkout: compile as before
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    os.environ["PYTHONPYCACHEPREFIX"] = str(prefix)
    sys.pycache_prefix = str(prefix)
    sys.dont_write_bytecode = False


@pytest.fixture(autouse=True)
def _root_log_handlers() -> Iterator[None]:
    """Put the root logger's handlers and level back after each test: `npu serve` run
    in-process (usage-error tests) installs a handler on that test's captured stderr,
    which is closed afterwards, and a later test's log line became a "Logging error"."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.fixture(autouse=True, scope="session")
def _hosts_left_running() -> Iterator[None]:
    """At the end of the session, stop and reap the driver hosts that in-process npuds
    left running for a next npud (SIGTERM is a restart): their tests are over, and a
    Popen collected at exit with its child still running raises the ResourceWarning
    that the "error" warnings filter turns into an "Exception ignored" trace."""
    yield
    from npumanager.service import host_process

    for popen in host_process._LEFT_RUNNING:
        if popen.poll() is None:
            popen.kill()
        popen.wait()
    host_process._LEFT_RUNNING.clear()


@pytest.fixture
def runtime_dir() -> Iterator[Path]:
    """A fresh runtime dir under /tmp, traversable by other uids (pytest's tmp_path is 0700),
    short enough for Unix socket paths."""
    d = Path(tempfile.mkdtemp(prefix="npu-rt-", dir="/tmp"))
    os.chmod(d, 0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def state_dir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="npu-st-", dir="/tmp"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(autouse=True, scope="session")
def _background_work_at_normal_priority() -> Iterator[None]:
    """Driver hosts the test helpers start (npumanager.testing: DaemonProcess's npud,
    running_driver) run BACKGROUND work at normal CPU priority unless a test names a
    ``background_sched``. Those hosts serve root as an unknown uid, so nearly all their
    work is BACKGROUND, which the product's default runs at SCHED_IDLE; on a machine kept
    busy by the rest of the suite (CI: two workers on two cores) such a thread waits
    tens of seconds for a core while holding the host's GIL. A run of tests/nn and
    tests/security beside two busy loops had 14 failures of that kind (hello timeouts,
    apps that never got their work done). The tests about CPU classes (tests/drivers
    test_exec_class*, test_compile_worker, tests/demo/test_contention) name theirs."""
    from npumanager.testing import driver_host

    before, driver_host.BACKGROUND_SCHED = driver_host.BACKGROUND_SCHED, "normal"
    yield
    driver_host.BACKGROUND_SCHED = before


@pytest.fixture(autouse=True)
def _alone_tests_run_alone(request: pytest.FixtureRequest) -> Iterator[None]:
    """Tests marked ``alone`` (or ``fifo``) run with no other test running, across xdist
    workers and across suites run at once on this machine; the others run side by side.

    ``fifo`` tests spin threads at SCHED_FIFO up to RLIMIT_RTTIME's 500 ms hard limit and
    need a main thread that lowers them to get a CPU in time: two of them on two CPUs left
    no CPU for the other's normal threads, and the kernel killed the process at the hard
    limit (a CI run: test_rt_backstop's worker test, while another worker's kill test spun
    for 500 ms); one at a time was not enough beside a busy suite (a later CI run, the same
    test). ``alone`` tests need CPU for work that is by design the first to starve: a host's
    threads in an idle cgroup (test_idle_cgroup: over 120 s beside three busy workers), or
    a stream whose 0.5 ms gaps a loaded machine stretches (test_follow).

    How: every test holds a shared lock while it runs, an alone test the exclusive one. A
    turnstile taken before either keeps new tests from starting while an alone test waits
    for the running ones to end (else a busy worker could keep the shared lock held)."""
    import fcntl

    alone = (request.node.get_closest_marker("alone") is not None
             or request.node.get_closest_marker("fifo") is not None)
    tmp, uid = Path(tempfile.gettempdir()), os.getuid()
    with open(tmp / f"npumanager-tests-turnstile.{uid}.lock", "a") as turn, \
            open(tmp / f"npumanager-tests-running.{uid}.lock", "a") as running:
        fcntl.flock(turn, fcntl.LOCK_EX)
        try:
            fcntl.flock(running, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        finally:
            if not alone:
                fcntl.flock(turn, fcntl.LOCK_UN)
        yield
