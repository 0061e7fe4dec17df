"""Configuration: embedded TOML defaults overlaid by the user's file.

Each section is a plain dict here; the module that owns a section reads its
keys (``cfg.section("thermal")``). Unknown sections and unknown keys are an
error that suggests the closest known name, so a typo (``unload_deadine_s``)
does not silently fall back to the default: every key a section accepts is in
``defaults.toml``. Tables under a key (a driver's ``options``, thresholds) are
free-form or checked by their owner.
"""

from __future__ import annotations

import copy
import difflib
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from npumanager.errors import InvalidArgument

KNOWN_SECTIONS = {"manager", "policy", "driver", "thermal", "importance", "cache", "app",
                  "metrics", "fleet"}


def _defaults() -> dict[str, Any]:
    text = resources.files("npumanager").joinpath("defaults.toml").read_text()
    return tomllib.loads(text)


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def _suggest(name: str, known: set[str] | list[str]) -> str:
    close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def check_keys(source: str, user: dict[str, Any], defaults: dict[str, Any]) -> None:
    """Refuse unknown sections and keys of a user config, naming the closest known one."""
    for name in user:
        if name not in KNOWN_SECTIONS:
            raise InvalidArgument(
                f"config file {source}: unknown section [{name}]{_suggest(name, KNOWN_SECTIONS)}"
                f" (known: {', '.join(sorted(KNOWN_SECTIONS))})")
    for name, value in user.items():
        if name == "app":  # validated entry by entry by service.apps (with its own messages)
            continue
        if name == "driver":
            template = defaults["driver"][0]
            entries = value if isinstance(value, list) else []
            for i, entry in enumerate(entries):
                if not isinstance(entry, dict):
                    continue
                for key in entry:
                    if key not in template:
                        raise InvalidArgument(
                            f"config file {source}: unknown key {key!r} in [[driver]] #{i + 1}"
                            f"{_suggest(key, set(template))} (plugin settings go in "
                            f"[driver.options])")
            continue
        known = defaults.get(name)
        if not isinstance(value, dict) or not isinstance(known, dict):
            continue
        for key in value:
            if key not in known:
                raise InvalidArgument(
                    f"config file {source}: unknown key {key!r} in [{name}]"
                    f"{_suggest(key, set(known))} (every key is listed in npumanager/"
                    f"defaults.toml)")


@dataclass
class Config:
    data: dict[str, Any] = field(default_factory=_defaults)
    source: str = "<defaults>"

    def section(self, name: str) -> dict[str, Any]:
        value = self.data.get(name, {})
        if not isinstance(value, dict):
            raise InvalidArgument(f"config: [{name}] must be a table")
        return value

    def drivers(self) -> list[dict[str, Any]]:
        """The [[driver]] entries, each with the first entry's defaults filled in."""
        template = _defaults()["driver"][0]
        return [_merge(template, d) for d in self.data.get("driver", [])]

    def apps(self) -> list[dict[str, Any]]:
        return list(self.data.get("app", []))

    @classmethod
    def load(
        cls, path: str | Path | None = None, overrides: dict[str, Any] | None = None
    ) -> Config:
        data = _defaults()
        source = "<defaults>"
        if path is not None:
            try:
                user = tomllib.loads(Path(path).read_text())
            except FileNotFoundError:
                raise InvalidArgument(f"config file {path} does not exist") from None
            except tomllib.TOMLDecodeError as exc:
                raise InvalidArgument(f"config file {path} is not valid TOML: {exc}") from None
            check_keys(str(path), user, data)
            # Lists of tables ([[driver]], [[app]]) replace the defaults wholesale.
            data = _merge(data, user)
            source = str(path)
        if overrides:
            data = _merge(data, overrides)
        return cls(data=data, source=source)
