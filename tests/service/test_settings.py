"""Admin settings survive an npud restart: written atomically to the state dir, restored at
start; a corrupt file is reported and ignored, never fatal."""

from __future__ import annotations

import asyncio
import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from npumanager import Policy, ThermalStatus
from npumanager.cli.status import render
from npumanager.client import AsyncNpuManager
from npumanager.config import Config
from npumanager.constants import KEY_MAX_BUDGET, KEY_MODEL_SIZE_WEIGHTS
from npumanager.service.admin_settings import persistent_state_dir
from npumanager.service.daemon import Daemon
from npumanager.service.driver_link import NoDrivers
from npumanager.service.settings_store import (
    AdminSettings,
    PolicyChoice,
    SettingsError,
    SettingsStore,
)
from npumanager.testing import VirtualClock


def run_daemon(runtime_dir: Path, state_dir: Path | None, body: Any) -> dict[str, Any]:
    """Start an in-process npud on ``state_dir``, run ``body(mgr)``, return its last dump."""
    cfg = Config.load(overrides={"manager": {"drivers": False}})

    async def main() -> dict[str, Any]:
        d = Daemon(cfg, runtime_dir, clock=VirtualClock(), drivers=NoDrivers(),
                   state_dir=state_dir)
        await d.start()
        mgr = await AsyncNpuManager.connect(runtime_dir)
        try:
            await body(mgr)
            return await mgr.dump()
        finally:
            await mgr.close()
            await asyncio.sleep(0)
            await d.stop()

    return asyncio.run(main())


async def nothing(mgr: AsyncNpuManager) -> None:
    pass


def test_store_round_trips_and_writes_a_private_file(state_dir: Path) -> None:
    store = SettingsStore(state_dir / "npud")
    s = AdminSettings(PolicyChoice(int(Policy.BUDGET), 6, {0: 1, 1: 3, 2: 5}, None),
                      {1000: 400, 1001: 100}, ThermalStatus.SEVERE)
    store.save(s)
    assert stat.S_IMODE(os.stat(store.path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(store.directory).st_mode) == 0o700
    assert store.load() == s
    # No temporary file left behind by the atomic write.
    assert sorted(p.name for p in store.directory.iterdir()) == ["settings.json"]
    assert SettingsStore(state_dir / "absent").load() == AdminSettings()


@pytest.mark.parametrize("text", [
    b"{not json", b"[]", b'{"format": 99}', b'{"format": 1, "policy": {"policy": "NOPE"}}',
    b'{"format": 1, "importance": {"x": 1}}', b'{"format": 1, "thermal_override": "HOT"}',
    b"\xff\xfe",
])
def test_a_corrupt_file_is_refused_and_moved_aside(state_dir: Path, text: bytes) -> None:
    store = SettingsStore(state_dir)
    store.path.write_bytes(text)
    with pytest.raises(SettingsError, match="not valid settings"):
        store.load()
    assert not store.path.exists()
    assert (state_dir / "settings.json.bad").read_bytes() == text


def test_policy_importance_and_thermal_override_survive_a_restart(
        runtime_dir: Path, state_dir: Path) -> None:
    async def set_all(mgr: AsyncNpuManager) -> None:
        await mgr.set_policy(Policy.BUDGET, {KEY_MAX_BUDGET: 7,
                                             KEY_MODEL_SIZE_WEIGHTS: {"0": 1, "1": 2, "2": 3}})
        await mgr.set_uid_importance(1234, 400)
        await mgr.set_uid_importance(1235, 125)
        await mgr.override_thermal_status(ThermalStatus.MODERATE)

    before = run_daemon(runtime_dir, state_dir, set_all)
    after = run_daemon(runtime_dir, state_dir, nothing)
    for dump in (before, after):
        assert dump["policy"]["name"] == "budget"
        assert dump["policy"]["max_budget"] == 7
        assert dump["uids"]["1234"]["importance"] == 400
        assert dump["uids"]["1235"]["importance"] == 125
        assert dump["thermal"]["status"] == "MODERATE"
        assert dump["thermal"]["overridden"] is True
    assert after["daemon"]["settings"] == {
        "path": str(state_dir / "npud" / "settings.json"), "persisted": True, "error": None}

    async def reset(mgr: AsyncNpuManager) -> None:
        await mgr.reset_thermal_status()

    run_daemon(runtime_dir, state_dir, reset)
    assert run_daemon(runtime_dir, state_dir, nothing)["thermal"]["overridden"] is False


def test_a_corrupt_file_is_reported_in_status_and_npud_starts_with_defaults(
        runtime_dir: Path, state_dir: Path) -> None:
    (state_dir / "npud").mkdir(mode=0o700)
    (state_dir / "npud" / "settings.json").write_text('{"format": 1, "importance": [')
    dump = run_daemon(runtime_dir, state_dir, nothing)
    error = dump["daemon"]["settings"]["error"]
    assert "not valid settings" in error and "settings.json.bad" in error
    assert dump["policy"]["name"] == "budget" and dump["policy"]["max_budget"] == 4
    assert "settings: PROBLEM:" in render(dump, width=400)


def test_a_saved_value_npud_refuses_is_skipped_and_the_rest_restored(
        runtime_dir: Path, state_dir: Path) -> None:
    store = SettingsStore(state_dir / "npud")
    store.save(AdminSettings(PolicyChoice(int(Policy.BUDGET), -3), {1234: 300}))
    dump = run_daemon(runtime_dir, state_dir, nothing)
    assert "saved policy not restored" in dump["daemon"]["settings"]["error"]
    assert dump["uids"]["1234"]["importance"] == 300
    assert dump["policy"]["max_budget"] == 4


def test_without_a_state_dir_nothing_is_written(runtime_dir: Path, state_dir: Path) -> None:
    async def set_policy(mgr: AsyncNpuManager) -> None:
        await mgr.set_policy(Policy.TURN_TAKING)

    dump = run_daemon(runtime_dir, None, set_policy)
    assert dump["daemon"]["settings"] == {"path": None, "persisted": False, "error": None}
    assert "admin settings kept" not in render(dump)


def test_which_npud_persists(runtime_dir: Path, state_dir: Path,
                             monkeypatch: pytest.MonkeyPatch) -> None:
    from npumanager.paths import system_runtime_dir

    monkeypatch.delenv("NPU_STATE_DIR", raising=False)
    assert persistent_state_dir(runtime_dir, state_dir) == state_dir
    # A temporary runtime dir (tests, the demo) keeps settings in memory only...
    assert persistent_state_dir(runtime_dir, None) is None
    # ... even when $NPU_RUNTIME_DIR points at it; the system's npud persists.
    monkeypatch.setenv("NPU_RUNTIME_DIR", str(runtime_dir))
    assert persistent_state_dir(runtime_dir, None) is None
    assert persistent_state_dir(system_runtime_dir(), None) is not None
    monkeypatch.setenv("NPU_STATE_DIR", str(state_dir))
    assert persistent_state_dir(runtime_dir, None) == state_dir


def test_saved_file_is_readable_json(state_dir: Path) -> None:
    store = SettingsStore(state_dir)
    store.save(AdminSettings(None, {5: 100}, None))
    assert json.loads(store.path.read_text()) == {
        "format": 1, "importance": {"5": 100}, "thermal_override": None}
