"""What npud keeps of its admins' settings across restarts, and how it gets it back.

:class:`SettingsKeeper` owns the admin settings a running npud holds (policy and its
bundle, importance overrides, thermal override): it restores them at start by feeding
them to the state as the events an admin's calls would have made, writes them to the
store (service/settings_store.py, written atomically) at every change, and says what
went wrong for `npu status`. A bad file, or a value this npud refuses, is reported and
skipped: npud starts with its defaults, never fails.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from npumanager.constants import ThermalStatus
from npumanager.errors import NpuError
from npumanager.paths import default_state_dir, system_runtime_dir
from npumanager.service import events as ev
from npumanager.service.settings_store import (
    AdminSettings,
    PolicyChoice,
    SettingsError,
    SettingsStore,
)

if TYPE_CHECKING:
    from npumanager.service.daemon import Daemon

log = logging.getLogger("npumanager.npud")


def persistent_state_dir(runtime_dir: Path, explicit: Path | None) -> Path | None:
    """Where npud keeps what survives it (admin settings), or None (memory only).

    ``npu serve --state-dir`` or ``$NPU_STATE_DIR`` when given; else the default state
    dir, but only for the npud on the system's runtime dir: an npud on a temporary one
    (a test, ``npu demo``) must not change what the system npud restores."""
    if explicit is not None:
        return explicit
    env = os.environ.get("NPU_STATE_DIR")
    if env:
        return Path(env)
    if os.path.realpath(runtime_dir) == os.path.realpath(system_runtime_dir()):
        return default_state_dir()
    return None


class SettingsKeeper:
    """The admin settings of one npud; ``state_dir`` None keeps them in memory only."""

    def __init__(self, daemon: Daemon, state_dir: Path | None) -> None:
        self.d = daemon
        self.store = SettingsStore(state_dir / "npud") if state_dir is not None else None
        self.current = AdminSettings()
        #: Why the saved settings could not be restored or saved (shown by `npu status`).
        self.error: str | None = None

    def restore(self) -> None:
        """Apply what an admin set before npud last stopped."""
        store, d = self.store, self.d
        if store is None:
            return
        try:
            saved = store.load()
        except SettingsError as exc:
            self._failed(str(exc))
            return
        restored = AdminSettings()
        p = saved.policy
        if p is not None:
            try:
                d.submit(ev.PolicySet(
                    stimulus_id=d.stimulus("restore-policy"), now=d.clock.now(),
                    policy=p.policy, max_budget=p.max_budget, weights=p.weights,
                    memory_budget_bytes=p.memory_budget_bytes))
                restored.policy = p
            except NpuError as exc:
                self._failed(f"saved policy not restored: {exc}")
        for key, importance in saved.importance.items():
            try:
                d.submit(ev.ImportanceChanged(
                    stimulus_id=d.stimulus("restore-importance"), now=d.clock.now(),
                    uid=key, importance=importance))
            except NpuError as exc:
                self._failed(f"saved importance of {key} not restored: {exc}")
                continue
            d.extras.admin_set(key)
            restored.importance[key] = importance
        if saved.thermal_override is not None:
            try:
                d.extras.thermal_override(saved.thermal_override)
                restored.thermal_override = saved.thermal_override
            except NpuError as exc:
                self._failed(f"saved thermal override not restored: {exc}")
        self.current = restored
        if not restored.empty:
            log.info("restored admin settings from %s", store.path)

    def remember_policy(self, event: ev.PolicySet) -> None:
        self.current.policy = PolicyChoice(
            int(event.policy), event.max_budget,
            dict(event.weights) if event.weights is not None else None,
            event.memory_budget_bytes)
        self._save()

    def remember_importance(self, key: int, importance: int) -> None:
        self.current.importance[key] = importance
        self._save()

    def remember_thermal_override(self, status: ThermalStatus | None) -> None:
        self.current.thermal_override = status
        self._save()

    def info(self) -> dict[str, Any]:
        """For npud's dump (`npu status`)."""
        store = self.store
        return {"path": str(store.path) if store is not None else None,
                "persisted": store is not None, "error": self.error}

    def _save(self) -> None:
        if self.store is None:
            return
        try:
            self.store.save(self.current)
        except OSError as exc:
            # The change is applied; only its surviving a restart failed: say so, go on.
            self._failed(f"cannot save {self.store.path}: {exc.strerror or exc}")

    def _failed(self, why: str) -> None:
        log.error("admin settings: %s", why)
        self.error = why
