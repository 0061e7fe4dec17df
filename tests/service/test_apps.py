"""[[app]] entries -> SchedulingConfig table, lookup, and identity by uid or systemd unit."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from npumanager.config import Config
from npumanager.constants import Importance
from npumanager.errors import InvalidArgument
from npumanager.hal.types import SchedulingConfig
from npumanager.service.apps import (
    UNIT_ID_BASE,
    UNIT_ID_SPAN,
    AppTable,
    is_unit_identity,
    unit_identity,
)


@pytest.fixture
def proc_root() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="npu-proc-", dir="/tmp"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def child() -> Iterator[int]:
    p = subprocess.Popen(["sleep", "60"])
    try:
        yield p.pid
    finally:
        p.kill()
        p.wait()


def place(proc_root: Path, pid: int, cgroup: str) -> None:
    (proc_root / str(pid)).mkdir(parents=True, exist_ok=True)
    (proc_root / str(pid) / "cgroup").write_text(f"0::{cgroup}\n")


def table(
    apps: list[dict[str, Any]], proc_root: Path | None = None, identity: str = "uid"
) -> AppTable:
    importance: dict[str, Any] = {"identity": identity}
    if proc_root is not None:
        importance["proc_root"] = str(proc_root)
    return AppTable.from_config(Config.load(overrides={"app": apps, "importance": importance}))


def test_config_file_entries_become_the_scheduling_table(tmp_path: Path) -> None:
    cfg_file = tmp_path / "npu.toml"
    cfg_file.write_text(
        """
[[app]]
uid = 1000
importance = "foreground"
min_priority = 10
max_priority = 200

[[app]]
uid = 1001
app_priority = 700
direct_access = false

[[app]]
uid = 1002
importance = 1200          # above 1000: the app priority is clamped

[[app]]
uid = 1003
attribute_other_uid = true

[[app]]
unit = "camera.service"
importance = "foreground_service"
"""
    )
    t = AppTable.from_config(Config.load(cfg_file))
    assert t.scheduling_configs() == [
        SchedulingConfig(1000, 100, 10, 200, True, False),
        SchedulingConfig(1001, 700, 0, 1000, False, False),
        SchedulingConfig(1002, 1000, 0, 1000, True, False),
        SchedulingConfig(1003, 1000, 0, 1000, True, True),
    ]  # the unit entry has no uid under identity = "uid"
    e = t.lookup(1000, 1)
    assert e is not None and e.importance == Importance.FOREGROUND
    assert t.lookup(4242, 1) is None
    assert len(t.entries) == 5
    assert t.scheduling_table() == t.scheduling_configs()
    assert t.importances() == {1000: 100, 1002: 1200}  # the unit entry needs unit identity


def test_no_apps_by_default() -> None:
    t = AppTable.from_config(Config())
    assert t.scheduling_configs() == []
    assert t.identity(1000, 1) == 1000


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"uid": 5, "app_priority": 2000}, r"#1 \(uid=5\).*app_priority=2000 is outside 0..1000"),
        ({"uid": 5, "min_priority": 600, "max_priority": 500}, r"#1 \(uid=5\).*min_priority"),
        ({"uid": 5, "importance": "sleepy"}, r"#1 \(uid=5\).*unknown importance"),
        ({"uid": 5, "colour": "red"}, r"#1 \(uid=5\).*unknown key.*colour"),
        ({"uid": 5, "unit": "a.service"}, r"exactly one of uid"),
        ({"app_priority": 5}, r"exactly one of uid"),
        ({"uid": -1}, r"uid must be a non-negative integer"),
        ({"uid": "1000"}, r"uid must be a non-negative integer"),
        ({"unit": "a/b.service"}, r"unit must be a systemd unit name"),
        ({"uid": 5, "direct_access": "yes"}, r"direct_access must be true or false"),
        ({"uid": 5, "max_priority": 1.5}, r"max_priority must be an integer"),
        ("uid = 5", r"#1 must be a table"),
    ],
)
def test_bad_entry_is_rejected_at_load_naming_it(entry: Any, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        table([entry])


def test_duplicates_are_rejected_naming_both() -> None:
    with pytest.raises(InvalidArgument, match=r"#2 \(uid=7\): uid already configured by .*#1"):
        table([{"uid": 7}, {"uid": 7, "app_priority": 1}])
    with pytest.raises(InvalidArgument, match=r"#3 \(unit=a.service\).*#1"):
        table([{"unit": "a.service"}, {"uid": 1}, {"unit": "a.service"}])


def test_uid_in_synthetic_range_colliding_with_a_unit_is_rejected() -> None:
    key = unit_identity("a.service")
    with pytest.raises(InvalidArgument, match="collides"):
        table([{"unit": "a.service"}, {"uid": key}], identity="unit")


def test_bad_identity_is_rejected() -> None:
    with pytest.raises(InvalidArgument, match="identity"):
        table([], identity="session")


def test_lookup_prefers_the_units_entry(child: int, proc_root: Path) -> None:
    place(proc_root, child, "/system.slice/camera.service")
    t = table(
        [{"uid": 0, "importance": "cached"}, {"unit": "camera.service", "importance": 100}],
        proc_root,
    )
    e = t.lookup(0, child)
    assert e is not None and e.unit == "camera.service" and e.importance == 100
    other = t.lookup(0, 999_999_999)  # no such process: its uid's entry
    assert other is not None and other.uid == 0
    # A unit entry's HAL row for the uid npud saw the process under.
    assert e.scheduling_config(uid=0) == SchedulingConfig(0, 100)
    assert e.scheduling_config(uid=0, app_priority=230).app_priority == 230


def test_unit_identity_keys_apps_sharing_one_uid_apart(child: int, proc_root: Path) -> None:
    other = subprocess.Popen(["sleep", "60"])
    try:
        place(proc_root, child, "/user.slice/user@1000.service/app.slice/app-firefox-1.scope")
        place(proc_root, other.pid, "/user.slice/user@1000.service/app.slice/app-gimp-2.scope")
        t = table([{"unit": "app-gimp-2.scope", "importance": "foreground"}], proc_root, "unit")
        a, b = t.identity(1000, child), t.identity(1000, other.pid)
        assert a != b
        assert a == unit_identity("app-firefox-1.scope") and is_unit_identity(a)
        assert UNIT_ID_BASE <= b < UNIT_ID_BASE + UNIT_ID_SPAN < 2**31
        assert t.identity(1000, child) == a  # stable
        assert t.name_of(a) == "unit app-firefox-1.scope"
        assert t.name_of(b) == "unit app-gimp-2.scope"
        # Under unit identity, unit entries are in the static table under their key.
        assert t.scheduling_configs() == [SchedulingConfig(b, 100)]
        assert t.importances() == {b: 100}
        # A process in no unit keeps its uid.
        assert t.identity(1000, 999_999_999) == 1000
        assert t.name_of(0) == "uid 0 (root)"
    finally:
        other.kill()
        other.wait()


def test_uid_identity_ignores_units(child: int, proc_root: Path) -> None:
    place(proc_root, child, "/system.slice/foo.service")
    t = table([], proc_root, "uid")
    assert t.identity(1234, child) == 1234
    assert t.name_of(1234) == "uid 1234"


def test_unit_identity_is_deterministic() -> None:
    # crc32 is stable across runs and machines (unlike hash()).
    assert unit_identity("foo.service") == 2_072_631_511  # 2e9 + crc32 % 1e8
    assert unit_identity("foo.service") == unit_identity("foo.service")
    assert unit_identity("foo.service") != unit_identity("bar.service")
