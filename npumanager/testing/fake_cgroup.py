"""Cgroups for tests: a fake group of plain files, and whether a real one can be made.

:func:`fake_group` makes a directory with the files :class:`~npumanager.hal.idle_cgroup.
IdleGroup` writes (``tasks``, ``cgroup.procs``) and ``cpu.idle``: a write appends a line,
so a test reads which thread or process ids the host moved, without root or a cgroup fs.
:func:`real_cgroup_reason` says why a real ``cpu.idle`` group cannot be made here (None:
it can), for the tests that need one to skip with that reason.
"""

from __future__ import annotations

import os
from pathlib import Path

from npumanager.hal import idle_cgroup


def fake_group(parent: Path, name: str = "npumanager-bg.fake") -> Path:
    group = parent / name
    group.mkdir(parents=True, exist_ok=True)
    for f in (*idle_cgroup.HANDED_OVER, "cpu.idle"):
        (group / f).touch()
    (group / "cpu.idle").write_text("1\n")
    return group


def written(group: Path, name: str = "tasks") -> list[int]:
    """The ids written to a fake group's ``name``, in order."""
    return [int(x) for x in (group / name).read_text().split()]


def real_cgroup_reason() -> str | None:
    """Why no real cpu.idle group can be made here, or None when one can (as root, with
    a writable cgroup-v1 cpu hierarchy that has cpu.idle: a probe group is made and
    removed)."""
    if os.geteuid() != 0:
        return "not root: only root may make a cgroup"
    try:
        group = idle_cgroup.create("probe", 0, 0)
    except OSError as exc:
        return f"no writable cgroup-v1 cpu hierarchy with cpu.idle here ({exc})"
    idle_cgroup.remove(group)
    return None
