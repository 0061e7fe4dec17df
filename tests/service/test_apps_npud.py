"""npud loads the [[app]] table: static importances, and a bad entry stops it with a clear error."""

from __future__ import annotations

from pathlib import Path

import pytest

from npumanager.client import NpuManager
from npumanager.testing.daemon import DaemonProcess

pytestmark = pytest.mark.slow


def test_app_entries_set_importance_in_npud(runtime_dir: Path) -> None:
    config = {
        "app": [
            {"uid": 50081, "importance": "foreground", "max_priority": 300},
            {"uid": 50082, "importance": 350, "direct_access": False},
        ]
    }
    with DaemonProcess(runtime_dir, config), NpuManager(runtime_dir) as mgr:
        uids = mgr.dump()["uids"]
        assert uids["50081"]["importance"] == 100
        assert uids["50082"]["importance"] == 350
        assert uids["50082"]["app_priority"] == 350


def test_bad_app_entry_stops_npud_naming_it(runtime_dir: Path) -> None:
    config = {"app": [{"uid": 50081}, {"uid": 50083, "app_priority": 2000}]}
    with pytest.raises(RuntimeError) as info:
        DaemonProcess(runtime_dir, config).start()
    assert "[[app]] #2 (uid=50083)" in str(info.value)
    assert "app_priority=2000 is outside 0..1000" in str(info.value)
