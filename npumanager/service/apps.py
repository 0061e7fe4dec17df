"""Per-app configuration (``[[app]]``) and app identity (by uid or systemd unit).

Each ``[[app]]`` entry names an app by ``uid = N`` or by systemd
``unit = "name.service"`` and may set its static importance, its HAL
``SchedulingConfig`` (app priority, job priority range, direct access,
attribution right). The table is validated when it is loaded: a bad entry is
rejected with an ``InvalidArgument`` naming it, never at first use.

Identity (``[importance] identity``):

- ``"uid"`` (default): an app is its uid, as on Android.
- ``"unit"``: an app is its systemd unit (``app-firefox-1234.scope``,
  ``foo.service``), for single-user desktops where every app shares one uid.
  The key is a stable synthetic id in ``[UNIT_ID_BASE, UNIT_ID_BASE +
  UNIT_ID_SPAN)`` = 2_000_000_000 + crc32(unit) % 100_000_000 (well above
  normal uids, below 2**31); :meth:`AppTable.name_of` turns it back into the
  unit name for display. A process in no unit keeps its uid.

The HAL scheduling table is keyed by what the drivers see, the uid:
:meth:`AppTable.scheduling_configs` lists the uid entries (and, with
``identity = "unit"``, the unit entries under their synthetic ids);
:meth:`AppEntry.scheduling_config` builds a row for any uid, so npud can push
a unit entry's row for the uid of a process it found in that unit.
"""

from __future__ import annotations

import pwd
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from npumanager.config import Config
from npumanager.constants import parse_importance
from npumanager.errors import IllegalArgument, InvalidArgument
from npumanager.hal.types import (
    MAX_PRIORITY,
    MIN_PRIORITY,
    UNKNOWN_UID_PRIORITY,
    SchedulingConfig,
    validate_configs,
)
from npumanager.service.importance import ProcessImportance

UNIT_ID_BASE = 2_000_000_000
UNIT_ID_SPAN = 100_000_000
IDENTITIES = ("uid", "unit")

_KEYS = {
    "uid",
    "unit",
    "importance",
    "app_priority",
    "min_priority",
    "max_priority",
    "direct_access",
    "attribute_other_uid",
}


def unit_identity(unit: str) -> int:
    """The stable synthetic app key of a systemd unit."""
    return UNIT_ID_BASE + zlib.crc32(unit.encode()) % UNIT_ID_SPAN


def is_unit_identity(key: int) -> bool:
    return UNIT_ID_BASE <= key < UNIT_ID_BASE + UNIT_ID_SPAN


@dataclass(frozen=True)
class AppEntry:
    index: int  # position in the config, for messages
    uid: int | None
    unit: str | None
    importance: int | None
    app_priority: int | None
    min_priority: int = MIN_PRIORITY
    max_priority: int = MAX_PRIORITY
    direct_access: bool = True
    attribute_other_uid: bool = False

    @property
    def key(self) -> int:
        """The app key under unit identity: the uid, or the unit's synthetic id."""
        if self.unit is not None:
            return unit_identity(self.unit)
        assert self.uid is not None
        return self.uid

    @property
    def label(self) -> str:
        what = f"unit={self.unit}" if self.unit is not None else f"uid={self.uid}"
        return f"[[app]] #{self.index + 1} ({what})"

    def default_priority(self) -> int:
        """app_priority if set, else the importance clamped to 0..1000, else unknown (1000)."""
        if self.app_priority is not None:
            return self.app_priority
        if self.importance is not None:
            return max(MIN_PRIORITY, min(MAX_PRIORITY, self.importance))
        return UNKNOWN_UID_PRIORITY

    def scheduling_config(
        self, uid: int | None = None, app_priority: int | None = None
    ) -> SchedulingConfig:
        """This entry's HAL row for ``uid`` (default: its key), with ``app_priority`` (default:
        :meth:`default_priority`) — npud passes the live importance when it changes."""
        return SchedulingConfig(
            uid=self.key if uid is None else uid,
            app_priority=self.default_priority() if app_priority is None else app_priority,
            min_priority=self.min_priority,
            max_priority=self.max_priority,
            has_direct_access=self.direct_access,
            can_attribute_other_uid=self.attribute_other_uid,
        )


def _int(raw: Mapping[str, Any], key: str, where: str, default: int | None) -> int | None:
    v = raw.get(key, default)
    if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
        raise InvalidArgument(f"{where}: {key} must be an integer, got {v!r}")
    return v


def _bool(raw: Mapping[str, Any], key: str, where: str, default: bool) -> bool:
    v = raw.get(key, default)
    if not isinstance(v, bool):
        raise InvalidArgument(f"{where}: {key} must be true or false, got {v!r}")
    return v


def parse_entry(index: int, raw: Mapping[str, Any]) -> AppEntry:
    if not isinstance(raw, Mapping):
        raise InvalidArgument(f"config [[app]] #{index + 1} must be a table, got {raw!r}")
    uid, unit = raw.get("uid"), raw.get("unit")
    what = f"unit={unit}" if unit is not None else f"uid={uid}"
    where = f"config [[app]] #{index + 1} ({what})"
    unknown = set(raw) - _KEYS
    if unknown:
        raise InvalidArgument(f"{where}: unknown key(s) {sorted(unknown)}; known: {sorted(_KEYS)}")
    if (uid is None) == (unit is None):
        raise InvalidArgument(f'{where}: give exactly one of uid = N or unit = "name.service"')
    if uid is not None and (isinstance(uid, bool) or not isinstance(uid, int) or uid < 0):
        raise InvalidArgument(f"{where}: uid must be a non-negative integer, got {uid!r}")
    if unit is not None and (not isinstance(unit, str) or not unit or "/" in unit):
        raise InvalidArgument(f"{where}: unit must be a systemd unit name, got {unit!r}")
    importance: int | None = None
    if "importance" in raw:
        value = raw["importance"]
        if isinstance(value, bool):
            raise InvalidArgument(f"{where}: importance must be a name or number")
        try:
            importance = parse_importance(str(value))
        except ValueError as exc:
            raise InvalidArgument(f"{where}: {exc}") from None
    entry = AppEntry(
        index=index,
        uid=uid,
        unit=unit,
        importance=importance,
        app_priority=_int(raw, "app_priority", where, None),
        min_priority=_int(raw, "min_priority", where, MIN_PRIORITY) or 0,
        max_priority=_int(raw, "max_priority", where, MAX_PRIORITY) or 0,
        direct_access=_bool(raw, "direct_access", where, True),
        attribute_other_uid=_bool(raw, "attribute_other_uid", where, False),
    )
    if entry.importance is not None and entry.importance < 0:
        raise InvalidArgument(f"{where}: importance must be >= 0, got {entry.importance}")
    try:
        validate_configs([entry.scheduling_config()])
    except IllegalArgument as exc:
        raise InvalidArgument(f"{where}: {exc}") from None
    return entry


class AppTable:
    def __init__(
        self,
        entries: list[AppEntry],
        identity: str = "uid",
        process: ProcessImportance | None = None,
    ) -> None:
        if identity not in IDENTITIES:
            raise InvalidArgument(
                f"[importance] identity must be one of {list(IDENTITIES)}, got {identity!r}"
            )
        self.entries = list(entries)
        self.identity_mode = identity
        self.process = process or ProcessImportance({})
        self._by_uid: dict[int, AppEntry] = {}
        self._by_unit: dict[str, AppEntry] = {}
        self._names: dict[int, str] = {}
        by_key: dict[int, AppEntry] = {}
        for e in self.entries:
            if e.unit is not None:
                if e.unit in self._by_unit:
                    first = self._by_unit[e.unit].label
                    raise InvalidArgument(f"config {e.label}: unit already configured by {first}")
                self._by_unit[e.unit] = e
                self._names[e.key] = e.unit
            else:
                assert e.uid is not None
                if e.uid in self._by_uid:
                    raise InvalidArgument(
                        f"config {e.label}: uid already configured by {self._by_uid[e.uid].label}"
                    )
                self._by_uid[e.uid] = e
            other = by_key.get(e.key)
            if other is not None:  # a crc32 collision, or a uid inside the synthetic range
                raise InvalidArgument(
                    f"config {e.label}: its app key {e.key} collides with {other.label}"
                )
            by_key[e.key] = e
        validate_configs(self.scheduling_configs())  # cannot fail after the checks above

    @classmethod
    def from_config(cls, cfg: Config) -> AppTable:
        section = cfg.section("importance")
        raw = cfg.apps()
        entries = [parse_entry(i, r) for i, r in enumerate(raw)]
        return cls(entries, str(section.get("identity", "uid")), ProcessImportance(section))

    def lookup(self, uid: int, pid: int) -> AppEntry | None:
        """The entry for a client: its systemd unit's entry if there is one, else its uid's."""
        if self._by_unit:
            unit = self.process.unit_of(pid)
            if unit is not None and unit in self._by_unit:
                return self._by_unit[unit]
        return self._by_uid.get(uid)

    def scheduling_configs(self) -> list[SchedulingConfig]:
        """The static HAL table: uid entries, plus unit entries under unit identity."""
        return [
            e.scheduling_config()
            for e in self.entries
            if e.unit is None or self.identity_mode == "unit"
        ]

    def scheduling_table(self) -> list[SchedulingConfig]:
        """Alias of :meth:`scheduling_configs` (the name npud's shell uses)."""
        return self.scheduling_configs()

    def importances(self) -> dict[int, int]:
        """Static importances from the config, by app key: uid entries, plus unit entries
        under unit identity. npud feeds them as ImportanceChanged at start."""
        return {
            e.key: e.importance
            for e in self.entries
            if e.importance is not None and (e.unit is None or self.identity_mode == "unit")
        }

    def identity(self, uid: int, pid: int) -> int:
        """The key npud uses for this client's app: its uid, or (identity = "unit") the
        synthetic id of its systemd unit; a process in no unit keeps its uid."""
        if self.identity_mode == "uid":
            return uid
        unit = self.process.unit_of(pid)
        if unit is None:
            return uid
        key = unit_identity(unit)
        self._names.setdefault(key, unit)
        return key

    def name_of(self, key: int) -> str:
        """A readable name for an app key: ``unit foo.service`` or ``uid 1000 (alice)``."""
        if key in self._names:
            return f"unit {self._names[key]}"
        if is_unit_identity(key):
            return f"unit #{key}"
        try:
            return f"uid {key} ({pwd.getpwuid(key).pw_name})"
        except KeyError:
            return f"uid {key}"

    def __repr__(self) -> str:
        return (
            f"AppTable(identity={self.identity_mode} | {len(self._by_uid)} uid entries, "
            f"{len(self._by_unit)} unit entries)"
        )
