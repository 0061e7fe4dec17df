"""Importance from what the kernel says about REAL child processes: nice, sched policy, cgroup."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from npumanager.config import Config
from npumanager.constants import Importance
from npumanager.errors import InvalidArgument
from npumanager.service.importance import ProcessImportance, parse_cgroup, unit_from_cgroup

CGROUP2 = Path("/sys/fs/cgroup/unified")
if not (CGROUP2 / "cgroup.procs").exists():
    CGROUP2 = Path("/sys/fs/cgroup")


def provider(**overrides: Any) -> ProcessImportance:
    section = dict(Config().section("importance"))
    section.update(overrides)
    return ProcessImportance(section)


@pytest.fixture
def child() -> Iterator[int]:
    """A real process that just sleeps; killed and reaped afterwards."""
    p = subprocess.Popen(["sleep", "60"])
    try:
        yield p.pid
    finally:
        p.kill()
        p.wait()


@pytest.fixture
def proc_root() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="npu-proc-", dir="/tmp"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def fake_cgroup(root: Path, pid: int, path: str) -> None:
    (root / str(pid)).mkdir(parents=True, exist_ok=True)
    (root / str(pid) / "cgroup").write_text(f"1:name=systemd:{path}\n0::{path}\n")


def test_default_process_matches_no_rule(child: int) -> None:
    # nice 0, SCHED_OTHER, and a cgroup with no configured component.
    p = provider(cgroup={"definitely-not-here.slice": "cached"})
    assert p.importance_of(child) is None
    assert p.explain(child) is None


@pytest.mark.parametrize(
    ("nice", "expected"),
    [(19, Importance.CACHED), (10, Importance.CACHED), (7, Importance.SERVICE), (3, None)],
)
def test_nice_of_real_child(child: int, nice: int, expected: int | None) -> None:
    os.setpriority(os.PRIO_PROCESS, child, nice)
    assert os.getpriority(os.PRIO_PROCESS, child) == nice
    p = provider(cgroup={})
    assert p.importance_of(child) == expected


@pytest.mark.skipif(os.geteuid() != 0, reason="a negative nice needs CAP_SYS_NICE")
def test_negative_nice_is_foreground_service(child: int) -> None:
    os.setpriority(os.PRIO_PROCESS, child, -5)
    v = provider(cgroup={}).explain(child)
    assert v is not None
    assert (v.importance, v.signal, v.detail) == (Importance.FOREGROUND_SERVICE, "nice", "nice=-5")


def test_sched_idle_child_is_cached(child: int) -> None:
    os.sched_setscheduler(child, os.SCHED_IDLE, os.sched_param(0))
    v = provider().explain(child)
    assert v is not None
    assert (v.importance, v.signal, v.detail) == (Importance.CACHED, "sched", "policy=idle")


def test_sched_batch_child_is_service(child: int) -> None:
    os.sched_setscheduler(child, os.SCHED_BATCH, os.sched_param(0))
    assert provider().importance_of(child) == Importance.SERVICE


def test_custom_nice_mapping(child: int) -> None:
    os.setpriority(os.PRIO_PROCESS, child, 2)
    p = provider(nice=[{"min": 1, "max": 4, "importance": 325}], cgroup={})
    assert p.importance_of(child) == Importance.TOP_SLEEPING


def test_cgroup_from_fake_proc_tree_for_real_child(child: int, proc_root: Path) -> None:
    fake_cgroup(
        proc_root,
        child,
        "/user.slice/user-1000.slice/user@1000.service/background.slice/indexer.service",
    )
    v = provider(proc_root=str(proc_root)).explain(child)
    assert v is not None
    assert (v.importance, v.signal) == (Importance.CACHED, "cgroup")
    assert v.detail == "cgroup component background.slice"


def test_deepest_matching_cgroup_component_wins(child: int, proc_root: Path) -> None:
    path = "/user.slice/user-1000.slice/user@1000.service/app.slice/app-firefox-4242.scope"
    fake_cgroup(proc_root, child, path)
    p = provider(proc_root=str(proc_root))
    assert p.importance_of(child) == Importance.VISIBLE
    p = provider(
        proc_root=str(proc_root),
        cgroup={"app.slice": "visible", "app-firefox-*.scope": "foreground"},
    )
    assert p.importance_of(child) == Importance.FOREGROUND
    assert p.unit_of(child) == "app-firefox-4242.scope"


def test_precedence_first_signal_wins_by_default(child: int, proc_root: Path) -> None:
    fake_cgroup(proc_root, child, "/user.slice/user@1000.service/app.slice/x.scope")
    os.setpriority(os.PRIO_PROCESS, child, 12)
    # nice (CACHED) comes before cgroup (VISIBLE) in the default precedence.
    assert provider(proc_root=str(proc_root)).importance_of(child) == Importance.CACHED
    # Reordered: the cgroup decides.
    p = provider(proc_root=str(proc_root), precedence=["cgroup", "sched", "nice"])
    assert p.importance_of(child) == Importance.VISIBLE


def test_least_important_combination_never_promotes(child: int, proc_root: Path) -> None:
    fake_cgroup(proc_root, child, "/background.slice/batch.service")
    os.setpriority(os.PRIO_PROCESS, child, 6)  # SERVICE by nice
    p = provider(proc_root=str(proc_root), combine="least_important")
    assert p.importance_of(child) == Importance.CACHED  # the cgroup's CACHED wins
    os.sched_setscheduler(child, os.SCHED_BATCH, os.sched_param(0))
    assert p.importance_of(child) == Importance.CACHED


def test_real_cgroup_of_real_child(child: int) -> None:
    """Create a real cgroup v2 hierarchy, move the child in, read /proc/PID/cgroup."""
    top = CGROUP2 / f"npu-test-{uuid.uuid4().hex[:8]}"
    leaf = top / "background.slice" / "indexer.service"
    try:
        leaf.mkdir(parents=True)
        (leaf / "cgroup.procs").write_text(str(child))
    except OSError as exc:
        for d in (leaf, leaf.parent, top):  # cgroup dirs go with rmdir, never unlink
            if d.exists():
                d.rmdir()
        pytest.skip(f"cannot create a cgroup here: {exc}")
    try:
        p = provider()
        assert p.cgroup_of(child) == f"/{top.name}/background.slice/indexer.service"
        assert p.importance_of(child) == Importance.CACHED
        assert p.unit_of(child) == "indexer.service"
    finally:
        try:
            (CGROUP2 / "cgroup.procs").write_text(str(child))  # back to the root, then remove
            for d in (leaf, leaf.parent, top):
                d.rmdir()
        except OSError:
            os.kill(child, 9)  # a cgroup with a live process cannot go; retry once it is dead
            os.waitpid(child, 0)
            for d in (leaf, leaf.parent, top):
                if d.exists():
                    d.rmdir()


def test_gone_process_has_no_importance() -> None:
    p = subprocess.Popen(["true"])
    p.wait()
    prov = provider()
    assert prov.importance_of(p.pid) is None
    assert prov.unit_of(p.pid) is None


def test_parse_cgroup_prefers_the_line_that_says_more() -> None:
    hybrid = "12:memory:/x\n1:name=systemd:/system.slice/foo.service\n0::/\n"
    assert parse_cgroup(hybrid) == "/system.slice/foo.service"
    assert parse_cgroup("0::/user.slice/app.slice/a.scope\n") == "/user.slice/app.slice/a.scope"
    assert parse_cgroup("") is None
    assert unit_from_cgroup("/system.slice/foo.service") == "foo.service"
    assert unit_from_cgroup("/user.slice/user-1000.slice/session-2.scope") == "session-2.scope"
    assert unit_from_cgroup("/user.slice/user@1000.service/app.slice/a-1.scope") == "a-1.scope"
    assert unit_from_cgroup("/") is None


def test_bad_rules_are_rejected() -> None:
    with pytest.raises(InvalidArgument, match="combine"):
        provider(combine="average")
    with pytest.raises(InvalidArgument, match="precedence"):
        provider(precedence=["nice", "moon"])
    with pytest.raises(InvalidArgument, match="unknown policy"):
        provider(sched_policy={"deadline-ish": "cached"})
    with pytest.raises(InvalidArgument, match=r"nice\[0\]"):
        provider(nice=[{"importance": "cached"}])
    with pytest.raises(InvalidArgument, match="unknown importance"):
        provider(cgroup={"a.slice": "sleepy"})
