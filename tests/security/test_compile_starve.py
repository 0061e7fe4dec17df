"""The compile child's starvation bound under a real driver user (drivers/compile_starve.py).

A host started by npud as root sets its RLIMIT_NICE to 20 before it becomes its driver
user (``npu driver --run-as``): then, and only then, it can raise its SCHED_IDLE compile
child back to normal priority when a background prepare starves, and never above nice 0.
Each case runs in a process under a real unprivileged uid; the child's policy is read with
``os.sched_getscheduler`` and ``os.getpriority`` per thread."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from npumanager.testing import procs
from npumanager.testing.daemon import driver_hosts
from npumanager.testing.onnx_models import matmul_model
from npumanager.testing.thread_sched import thread_scheds
from tests.security.conftest import StartDaemon
from tests.security.harness import ATTACKER, needs_root

pytestmark = needs_root

DRIVER_UID = ATTACKER  # an unprivileged uid standing in for the driver user


def _policies(pid: int) -> set[tuple[int, int]]:
    """(policy, nice) of every thread of ``pid``."""
    return set(thread_scheds(pid).values())


def _compile_starved(allow: bool) -> dict[str, object]:
    """In a forked process (as the driver user, RLIMIT_NICE 20 when ``allow`` as root set
    it before dropping root; or as root itself): compile in a lowered child whose CPU time
    is reported as not moving (starved, deterministically), recording the child's threads'
    policies at each raise and lower."""
    from npumanager.drivers import compile_worker as cw
    from npumanager.drivers.compile_starve import set_process_sched

    seen: list[tuple[bool, set[tuple[int, int]]]] = []

    def recorded(pid: int, sched: str, nice: int) -> None:
        set_process_sched(pid, sched, nice)
        seen.append((sched == "normal", _policies(pid)))

    cw.set_process_sched = recorded  # type: ignore[assignment]
    cw.process_cpu_s = lambda pid: 0.0  # type: ignore[assignment]
    worker = cw.CompileWorker("starve-test", "idle", 10, starve_ms=5)
    try:
        worker.compile(matmul_model(dim=512, depth=8), level=99, threads=1, n_model=1,
                       n_data=1, max_bytes=1 << 30)
        pid = worker.pid or 0
        after = _policies(pid)
        below_0 = "allowed"
        try:
            os.setpriority(os.PRIO_PROCESS, pid, -1)
        except PermissionError:
            below_0 = "refused"
        return {"bound_s": worker.starve.starve_s, "seen": seen, "after": after,
                "below_0": below_0, "uid": os.getuid()}
    finally:
        worker.close()


def _as_driver_user(allow: bool) -> dict[str, object]:
    import resource

    limit = 20 if allow else 0
    resource.setrlimit(resource.RLIMIT_NICE, (limit, limit))  # inherited by the fork
    try:
        got: dict[str, object] = procs.run_as(DRIVER_UID, None, _compile_starved, allow,
                                              timeout=120)
        return got
    finally:
        resource.setrlimit(resource.RLIMIT_NICE, (0, 0))


IDLE, OTHER = os.SCHED_IDLE, os.SCHED_OTHER


def _root_can_raise_the_limit() -> bool:
    """Whether root here may set RLIMIT_NICE 20 (CAP_SYS_RESOURCE; a container's root may
    lack it, and then only a limit set from outside, systemd's LimitNICE=+0, gives it)."""
    import resource

    old = resource.getrlimit(resource.RLIMIT_NICE)
    try:
        resource.setrlimit(resource.RLIMIT_NICE, (20, 20))
    except (OSError, ValueError):
        return False
    resource.setrlimit(resource.RLIMIT_NICE, old)
    return True


needs_the_limit = pytest.mark.skipif(
    not (os.geteuid() == 0 and _root_can_raise_the_limit()),
    reason="root here cannot raise RLIMIT_NICE (no CAP_SYS_RESOURCE)")


def _check_raised_and_lowered(got: dict[str, object]) -> None:
    seen = got["seen"]
    assert isinstance(seen, list) and seen, got
    raised = [p for up, p in seen if up]
    assert raised and all(p == {(OTHER, 0)} for p in raised), seen
    assert all(p == {(IDLE, 0)} for up, p in seen if not up), seen
    assert got["after"] == {(IDLE, 0)}, got  # lowered again when the compile ended


def test_a_host_allowed_to_raises_its_starved_compile_child_to_nice_0_and_lowers_it() -> None:
    """As root (CAP_SYS_NICE stands in for the limit): every thread of the child goes to
    SCHED_OTHER nice 0 while it starves, and back to SCHED_IDLE after."""
    got: dict[str, object] = procs.run_as(None, None, _compile_starved, True, timeout=120)
    assert got["bound_s"] == 0.005, got
    _check_raised_and_lowered(got)


@needs_the_limit
def test_with_the_limit_a_starved_compile_child_is_raised_to_nice_0_and_lowered_again(
        ) -> None:
    got = _as_driver_user(allow=True)
    assert got["uid"] == DRIVER_UID and got["bound_s"] == 0.005, got
    _check_raised_and_lowered(got)
    assert got["below_0"] == "refused", got  # nice 0 is as far as the limit goes


def test_without_the_limit_the_child_stays_idle_and_cannot_be_raised() -> None:
    got = _as_driver_user(allow=False)
    assert got["bound_s"] == 0.0 and got["seen"] == [], got  # the bound is off
    assert got["after"] == {(IDLE, 0)}, got


@needs_the_limit
def test_npuds_driver_host_runs_with_the_limit(start_npud: StartDaemon,
                                               runtime_dir: Path) -> None:
    """npud as root starts the reference host, which becomes its driver user with
    RLIMIT_NICE 20 (and not more)."""
    start_npud(drivers=True)
    [host] = driver_hosts(runtime_dir)
    limits = Path(f"/proc/{host}/limits").read_text().splitlines()
    [nice] = [line for line in limits if line.startswith("Max nice priority")]
    assert nice.split()[3:5] == ["20", "20"], nice
    assert os.stat(f"/proc/{host}").st_uid != 0  # it runs as its driver user
