"""npud's admin settings on disk: what an admin set survives a restart.

An admin's policy (and its bundle), importance overrides and thermal override
are written to ``STATE/npud/settings.json`` after every change and restored
when npud starts (API "Manager restart"). The file is written atomically
(a temporary file in the same directory, fsync, rename, fsync of the
directory), so a crash leaves the old settings or the new ones, never half.

A file that cannot be read or does not hold valid settings is reported (the
log and ``npu status``), moved aside to ``settings.json.bad`` for the admin to
look at, and ignored: npud starts with its configured defaults, never fails.

Which npud persists: the one on the default runtime dir, or any given a state
dir explicitly (``npu serve --state-dir``, ``$NPU_STATE_DIR``). An npud on a
temporary runtime dir (a test, ``npu demo``) without one keeps its settings in
memory only, so they never leak into the system npud's.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from npumanager.constants import Policy, ThermalStatus

FILE_NAME = "settings.json"
FORMAT = 1


class SettingsError(Exception):
    """The settings file exists but cannot be used (the message says why)."""


@dataclass(frozen=True, slots=True)
class PolicyChoice:
    """The last ``set_policy`` an admin made (the PolicySet event's fields)."""

    policy: int
    max_budget: int | None = None
    weights: dict[int, int] | None = None
    memory_budget_bytes: int | None = None


@dataclass(slots=True)
class AdminSettings:
    policy: PolicyChoice | None = None
    #: key (uid, or app key) -> importance an admin set
    importance: dict[int, int] = field(default_factory=dict)
    thermal_override: ThermalStatus | None = None

    @property
    def empty(self) -> bool:
        return self.policy is None and not self.importance and self.thermal_override is None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"format": FORMAT}
        if self.policy is not None:
            p = self.policy
            out["policy"] = {
                "policy": Policy(p.policy).name, "max_budget": p.max_budget,
                "weights": ({str(k): v for k, v in p.weights.items()}
                            if p.weights is not None else None),
                "memory_budget_bytes": p.memory_budget_bytes,
            }
        out["importance"] = {str(k): v for k, v in sorted(self.importance.items())}
        out["thermal_override"] = (self.thermal_override.name
                                   if self.thermal_override is not None else None)
        return out

    @classmethod
    def from_json(cls, data: object) -> AdminSettings:
        """Parse what :meth:`to_json` wrote; anything else raises :class:`SettingsError`."""
        if not isinstance(data, dict):
            raise SettingsError("not a JSON object")
        if data.get("format") != FORMAT:
            raise SettingsError(f"unknown format {data.get('format')!r} (this npud writes "
                                f"{FORMAT})")
        out = cls()
        p = data.get("policy")
        if p is not None:
            if not isinstance(p, dict):
                raise SettingsError("policy is not an object")
            try:
                policy = Policy[str(p.get("policy"))]
            except KeyError:
                raise SettingsError(f"unknown policy {p.get('policy')!r}") from None
            weights = p.get("weights")
            if weights is not None:
                if not isinstance(weights, dict):
                    raise SettingsError("policy weights is not an object")
                weights = {_int(k, "weight size"): _int(v, "weight") for k, v in weights.items()}
            out.policy = PolicyChoice(
                int(policy), _opt_int(p.get("max_budget"), "max_budget"), weights,
                _opt_int(p.get("memory_budget_bytes"), "memory_budget_bytes"))
        imp = data.get("importance", {})
        if not isinstance(imp, dict):
            raise SettingsError("importance is not an object")
        out.importance = {_int(k, "uid"): _int(v, "importance") for k, v in imp.items()}
        t = data.get("thermal_override")
        if t is not None:
            try:
                out.thermal_override = ThermalStatus[str(t)]
            except KeyError:
                raise SettingsError(f"unknown thermal status {t!r}") from None
        return out


def _int(v: object, what: str) -> int:
    if isinstance(v, bool):
        raise SettingsError(f"{what} {v!r} is not an integer")
    if not isinstance(v, int | str):
        raise SettingsError(f"{what} {v!r} is not an integer")
    try:
        return int(v)  # JSON object keys are strings
    except ValueError:
        raise SettingsError(f"{what} {v!r} is not an integer") from None


def _opt_int(v: object, what: str) -> int | None:
    return None if v is None else _int(v, what)


class SettingsStore:
    """``STATE/npud/settings.json``: :meth:`load` at start, :meth:`save` after a change."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self.path = self.directory / FILE_NAME

    def __repr__(self) -> str:
        return f"<SettingsStore {self.path}>"

    def load(self) -> AdminSettings:
        """The saved settings (empty when there is no file). A bad file is moved aside to
        ``settings.json.bad`` and :class:`SettingsError` raised naming the path and why."""
        try:
            text = self.path.read_bytes()
        except FileNotFoundError:
            return AdminSettings()
        except OSError as exc:
            raise SettingsError(f"cannot read {self.path}: {exc.strerror or exc}") from None
        try:
            return AdminSettings.from_json(json.loads(text))
        except (ValueError, SettingsError) as exc:  # JSONDecodeError and UnicodeError too
            bad = self.path.with_name(FILE_NAME + ".bad")
            with contextlib.suppress(OSError):
                os.replace(self.path, bad)
            raise SettingsError(f"{self.path} is not valid settings ({exc}); ignored and "
                                f"moved to {bad}") from None

    def save(self, settings: AdminSettings) -> None:
        """Write atomically: tmp file, fsync, rename over the old one, fsync the directory."""
        from npumanager.paths import ensure_private_dir

        ensure_private_dir(self.directory)
        data = (json.dumps(settings.to_json(), indent=1) + "\n").encode()
        tmp = self.path.with_name(f".{FILE_NAME}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        dfd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
