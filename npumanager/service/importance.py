"""Importance on Linux: what the kernel says about a client's process.

Linux has no ActivityManager, but it does know how the user or the session
manager treats a process. :class:`ProcessImportance` turns three kernel
signals into an Android importance value, from rules in ``[importance]``:

- ``sched``: the scheduling policy (``os.sched_getscheduler``):
  ``{ idle = "cached", batch = "service" }`` by default. SCHED_IDLE and
  SCHED_BATCH are only ever set on purpose, so they are strong signals.
- ``nice``: the nice value (``os.getpriority(PRIO_PROCESS, pid)``), a list of
  ``{ min = N, importance = ... }`` / ``{ max = N, importance = ... }`` rules
  (bounds inclusive), first match wins. Default: nice >= 10 -> CACHED,
  >= 5 -> SERVICE, < 0 -> FOREGROUND_SERVICE; nice 0..4 matches nothing.
- ``cgroup``: the process's cgroup path (``/proc/PID/cgroup``; the unified
  ``0::`` line, else systemd's ``name=systemd`` line). Keys are shell patterns
  matched against each path component; the deepest component that matches
  wins (``app-firefox-*.scope`` beats the ``app.slice`` that contains it).

Precedence (``precedence``, default ``["sched", "nice", "cgroup"]``): with
``combine = "first"`` (default) the first signal in that order that has a
matching rule decides — the deliberate, per-process settings (policy, nice)
before the session-wide placement (cgroup). With ``combine =
"least_important"`` every matching rule counts and the least important (the
highest number) wins, so no single signal can promote a process. No rule
matches -> ``None`` (npud then keeps the importance it has from the admin API,
the ``[[app]]`` table, or the default).

The ``/proc`` root is configurable (``proc_root``) for the cgroup file; the
policy and nice value always come from the kernel for the real pid.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from npumanager.constants import parse_importance
from npumanager.errors import InvalidArgument

SIGNALS = ("sched", "nice", "cgroup")

_POLICY_NAMES: dict[int, str] = {
    getattr(os, "SCHED_OTHER", 0): "other",
    getattr(os, "SCHED_FIFO", 1): "fifo",
    getattr(os, "SCHED_RR", 2): "rr",
    getattr(os, "SCHED_BATCH", 3): "batch",
    getattr(os, "SCHED_IDLE", 5): "idle",
}

DEFAULT_SCHED = {"idle": "cached", "batch": "service"}
DEFAULT_NICE: list[dict[str, Any]] = [
    {"min": 10, "importance": "cached"},
    {"min": 5, "importance": "service"},
    {"max": -1, "importance": "foreground_service"},
]
DEFAULT_CGROUP = {
    "background.slice": "cached",
    "app.slice": "visible",
    "session.slice": "foreground_service",
}


def _importance(value: object, where: str) -> int:
    if isinstance(value, bool):
        raise InvalidArgument(f"{where}: importance must be a name or a number, got {value!r}")
    try:
        n = parse_importance(str(value))
    except ValueError as exc:
        raise InvalidArgument(f"{where}: {exc}") from None
    if n < 0:
        raise InvalidArgument(f"{where}: importance must be >= 0, got {n}")
    return n


@dataclass(frozen=True)
class NiceRule:
    min: int | None
    max: int | None
    importance: int

    def matches(self, nice: int) -> bool:
        return (self.min is None or nice >= self.min) and (self.max is None or nice <= self.max)


@dataclass(frozen=True)
class Verdict:
    """Which signal decided, for logs and ``npu status``."""

    importance: int
    signal: str  # "sched", "nice" or "cgroup"
    detail: str  # "policy=idle", "nice=10", "cgroup component app.slice"


def parse_cgroup(text: str) -> str | None:
    """The cgroup path from /proc/PID/cgroup: the unified (v2) line, else systemd's v1 line."""
    v2: str | None = None
    systemd: str | None = None
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hid, controllers, path = parts
        if hid == "0" and controllers == "":
            v2 = path
        elif controllers == "name=systemd":
            systemd = path
    # On hybrid hierarchies the v2 line can be a bare "/" while systemd's v1 tree has the
    # real placement; prefer whichever says more.
    candidates = [p for p in (v2, systemd) if p is not None]
    if not candidates:
        return None
    return max(candidates, key=lambda p: len([c for c in p.split("/") if c]))


def unit_from_cgroup(path: str) -> str | None:
    """The systemd unit a cgroup path belongs to: its deepest ``.service`` or ``.scope``."""
    for comp in reversed([c for c in path.split("/") if c]):
        if comp.endswith((".service", ".scope")):
            return comp
    return None


class ProcessImportance:
    def __init__(self, section: Mapping[str, Any]) -> None:
        self.proc_root = Path(str(section.get("proc_root", "/proc")))
        self.combine = str(section.get("combine", "first"))
        if self.combine not in ("first", "least_important"):
            raise InvalidArgument(
                f"[importance] combine must be 'first' or 'least_important', got {self.combine!r}"
            )
        precedence = list(section.get("precedence", SIGNALS))
        bad = [p for p in precedence if p not in SIGNALS]
        if bad or len(set(precedence)) != len(precedence):
            raise InvalidArgument(
                f"[importance] precedence must list distinct signals of {list(SIGNALS)}, "
                f"got {precedence!r}"
            )
        self.precedence: list[str] = precedence
        self.sched = self._parse_sched(section.get("sched_policy", DEFAULT_SCHED))
        self.nice = self._parse_nice(section.get("nice", DEFAULT_NICE))
        self.cgroup = {
            str(pat): _importance(v, f"[importance] cgroup.{pat!r}")
            for pat, v in dict(section.get("cgroup", DEFAULT_CGROUP)).items()
        }

    @staticmethod
    def _parse_sched(table: Mapping[str, object]) -> dict[str, int]:
        out: dict[str, int] = {}
        known = set(_POLICY_NAMES.values())
        for name, value in table.items():
            key = name.strip().lower().removeprefix("sched_")
            if key not in known:
                raise InvalidArgument(
                    f"[importance] sched_policy: unknown policy {name!r}; known: {sorted(known)}"
                )
            out[key] = _importance(value, f"[importance] sched_policy.{name}")
        return out

    @staticmethod
    def _parse_nice(rules: Sequence[Mapping[str, object]]) -> list[NiceRule]:
        out: list[NiceRule] = []
        for i, rule in enumerate(rules):
            where = f"[importance] nice[{i}]"
            if not isinstance(rule, Mapping):
                raise InvalidArgument(
                    f'{where} must be a table like {{ min = 10, importance = "cached" }}'
                )
            extra = set(rule) - {"min", "max", "importance"}
            if extra or "importance" not in rule or ("min" not in rule and "max" not in rule):
                raise InvalidArgument(
                    f"{where} needs 'importance' and 'min' and/or 'max' (got keys {sorted(rule)})"
                )
            bounds: list[int | None] = []
            for k in ("min", "max"):
                v = rule.get(k)
                if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
                    raise InvalidArgument(f"{where}.{k} must be an integer, got {v!r}")
                bounds.append(v)
            out.append(NiceRule(bounds[0], bounds[1], _importance(rule["importance"], where)))
        return out

    # --- what the kernel says ------------------------------------------------

    def cgroup_of(self, pid: int) -> str | None:
        try:
            text = (self.proc_root / str(pid) / "cgroup").read_text()
        except OSError:
            return None
        return parse_cgroup(text)

    def unit_of(self, pid: int) -> str | None:
        """The systemd unit of ``pid`` (``app-firefox-1234.scope``, ``foo.service``), if any."""
        path = self.cgroup_of(pid)
        return None if path is None else unit_from_cgroup(path)

    def _from_sched(self, pid: int) -> Verdict | None:
        if not self.sched:
            return None
        try:
            policy = os.sched_getscheduler(pid)
        except OSError:
            return None
        # SCHED_RESET_ON_FORK may be or-ed into the reported policy.
        name = _POLICY_NAMES.get(policy & ~getattr(os, "SCHED_RESET_ON_FORK", 0x40000000))
        if name is None or name not in self.sched:
            return None
        return Verdict(self.sched[name], "sched", f"policy={name}")

    def _from_nice(self, pid: int) -> Verdict | None:
        if not self.nice:
            return None
        try:
            nice = os.getpriority(os.PRIO_PROCESS, pid)
        except OSError:
            return None
        for rule in self.nice:
            if rule.matches(nice):
                return Verdict(rule.importance, "nice", f"nice={nice}")
        return None

    def _from_cgroup(self, pid: int) -> Verdict | None:
        if not self.cgroup:
            return None
        path = self.cgroup_of(pid)
        if path is None:
            return None
        for comp in reversed([c for c in path.split("/") if c]):
            for pattern, importance in self.cgroup.items():
                if fnmatch.fnmatchcase(comp, pattern):
                    return Verdict(importance, "cgroup", f"cgroup component {comp}")
        return None

    def explain(self, pid: int) -> Verdict | None:
        """The importance of ``pid`` with the signal that decided it; None if no rule applies
        (or the process is gone)."""
        found: list[Verdict] = []
        for signal in self.precedence:
            if signal == "sched":
                v = self._from_sched(pid)
            elif signal == "nice":
                v = self._from_nice(pid)
            else:
                v = self._from_cgroup(pid)
            if v is None:
                continue
            if self.combine == "first":
                return v
            found.append(v)
        return max(found, key=lambda v: v.importance, default=None)

    def importance_of(self, pid: int) -> int | None:
        v = self.explain(pid)
        return None if v is None else v.importance

    def __repr__(self) -> str:
        return (
            f"ProcessImportance(combine={self.combine}, precedence={self.precedence}, "
            f"{len(self.sched)} sched, {len(self.nice)} nice, {len(self.cgroup)} cgroup rules)"
        )


__all__ = [
    "NiceRule",
    "ProcessImportance",
    "Verdict",
    "parse_cgroup",
    "unit_from_cgroup",
]


#: The [importance] keys that only the process provider reads.
RULE_KEYS = ("sched_policy", "nice", "cgroup", "precedence", "combine")


def unused_rules(user_section: Mapping[str, Any], from_process: bool) -> str | None:
    """The warning for rules a config sets while ``from_process`` is off: npud reads
    them only with it on, so they did nothing, and nothing said so."""
    rules = [k for k in RULE_KEYS if k in user_section]
    if not rules or from_process:
        return None
    return (f"[importance] sets {', '.join(rules)}, which npud reads only with "
            "from_process = true (it is false): they are not used")
