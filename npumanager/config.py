"""Configuration: embedded TOML defaults overlaid by the user's file.

Each section is a plain dict here; the module that owns a section reads its
keys (``cfg.section("thermal")``). Unknown top-level sections are an error so a
typo does not silently fall back to defaults.
"""

from __future__ import annotations

import copy
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from npumanager.errors import InvalidArgument

KNOWN_SECTIONS = {"manager", "policy", "driver", "thermal", "importance", "cache", "app"}


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
            unknown = set(user) - KNOWN_SECTIONS
            if unknown:
                raise InvalidArgument(
                    f"config file {path}: unknown section(s) {sorted(unknown)}; "
                    f"known: {sorted(KNOWN_SECTIONS)}"
                )
            # Lists of tables ([[driver]], [[app]]) replace the defaults wholesale.
            data = _merge(data, user)
            source = str(path)
        if overrides:
            data = _merge(data, overrides)
        return cls(data=data, source=source)
