"""Configuration: embedded TOML defaults overlaid by the user's file.

Each section is a plain dict here; the module that owns a section reads its
keys (``cfg.section("thermal")``). Unknown sections and unknown keys are an
error that suggests the closest known name, so a typo (``unload_deadine_s``)
does not silently fall back to the default: every key a section accepts is in
``defaults.toml``. A value of another type than its default's is refused too, and
one out of its key's range (config_ranges.py: ``channels = -1``). Tables under a key
(a driver's ``options``, importance rules) are free-form or checked by their owner.
:func:`file_problems` gives every problem of a file (``npu serve --check-config``);
:meth:`Config.load` refuses the first.
"""

from __future__ import annotations

import copy
import difflib
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from npumanager.config_ranges import range_problems
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


def suggest(name: str, known: set[str] | list[str]) -> str:
    """"; did you mean 'x'?" for the known name closest to a mistyped one, else ""."""
    close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def key_problems(user: dict[str, Any], defaults: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """Unknown sections and keys of a user config, each naming the closest known one:
    (section, what is wrong)."""
    for name in user:
        if name not in KNOWN_SECTIONS:
            yield name, (f"unknown section [{name}]{suggest(name, KNOWN_SECTIONS)}"
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
                        yield name, (f"unknown key {key!r} in [[driver]] #{i + 1}"
                                     f"{suggest(key, set(template))} (plugin settings go "
                                     f"in [driver.options])")
                yield from ((name, p) for p in lane_keys_problems(
                    f"[[driver]] #{i + 1}", entry.get("background"), template))
            continue
        known = defaults.get(name)
        if not isinstance(value, dict) or not isinstance(known, dict):
            continue
        for key in value:
            if key not in known:
                yield name, (f"unknown key {key!r} in [{name}]{suggest(key, set(known))} "
                             f"(every key is listed in npumanager/defaults.toml)")


#: [[driver]] keys a [driver.background] table (the background lane's own keys) cannot
#: set: what makes the lane the same device's second host.
LANE_FIXED = frozenset({"name", "plugin", "host", "background_host", "background", "options"})


def lane_keys_problems(where: str, table: Any, template: dict[str, Any]
                       ) -> Iterator[str]:
    """What is wrong with a [[driver]] entry's [driver.background] table: keys it cannot
    have, then values of the wrong type."""
    if not isinstance(table, dict):
        return  # (its own type error, "must be a table", comes from the entry's check)
    for key, v in table.items():
        if key not in template:
            yield (f"unknown key {key!r} in [driver.background] of {where}"
                   f"{suggest(key, set(template) - LANE_FIXED)}")
        elif key in LANE_FIXED:
            yield (f"{key} in [driver.background] of {where}: the background lane keeps its "
                   f"entry's {key} (it is the same device's second host)")
        else:
            bad = _type_error("driver", key, v, template[key])
            if bad is not None:
                yield f"{key} in [driver.background] of {where} {bad}"


#: Keys that take another type besides their default's: (section, key) -> the types.
_ALSO: dict[tuple[str, str], tuple[type, ...]] = {
    ("manager", "admin_group"): (int,),  # a group name or a gid
    ("driver", "inline_run_us"): (float,),
    ("driver", "inline_idle_run_us"): (float,),
}
#: String keys that take one of a few words (drivers/bg_threads.py BACKGROUND_SCHED and
#: drivers/classes.py say what each does).
CHOICES: dict[tuple[str, str], tuple[str, ...]] = {
    ("manager", "protect_foreground"): ("auto", "on", "off"),  # service/protection.py
    ("driver", "background_sched"): ("idle", "nice", "normal", "share"),
    ("driver", "background_compile"): ("process", "thread"),
    ("driver", "background_ends"): ("thread", "worker"),  # drivers/bg_ends.py
    ("driver", "background_load"): ("lowered", "normal"),  # drivers/prepare.py
    ("driver", "compile_raise"): ("self", "npud"),  # drivers/compile_starve.py
    ("driver", "background_lower"): ("thread", "run"),  # drivers/lowering.py
    ("driver", "background_cpus"): ("all", "spare", "lanes", "steer",
                                  "lanes-except-loads"),
    ("driver", "background_cgroup"): ("auto", "off"),  # hal/idle_cgroup.py
    ("driver", "background_burst_here"): ("off", "lowered", "nice", "normal",
                                          "normal-pass"),  # drivers/bg_here.py, bg_pass.py
    ("driver", "compile_malloc"): ("default", "keep", "hugepages",
                                   "keep-hugepages"),  # hal/malloc_tune.py
    ("driver", "load_cpus"): ("all", "last", "split"),  # drivers/load_place.py
}
_KINDS = {bool: "true or false", int: "an integer", float: "a number", str: "a string",
          dict: "a table", list: "a list"}


def _type_error(section: str, key: str, value: Any, default: Any) -> str | None:
    """What is wrong with ``value`` for a key whose default is ``default``, or None.
    (bool is an int to Python, never to a config: ``channels = true`` is refused.)"""
    want: tuple[type, ...] = (type(default), *_ALSO.get((section, key), ()))
    if float in want:
        want = (*want, int)  # 1 for 1.0
    if type(value) not in want:
        kinds = " or ".join(dict.fromkeys(_KINDS.get(t, t.__name__) for t in want
                                          if not (t is int and float in want)))
        shown = str(value).lower() if type(value) is bool else repr(value)  # (as TOML)
        return f"must be {kinds}, not {shown} ({_KINDS.get(type(value), type(value).__name__)})"
    words = CHOICES.get((section, key))
    if words is not None and value not in words:
        return f"must be one of {', '.join(map(repr, words))}, not {value!r}"
    return None


def type_problems(user: dict[str, Any], defaults: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """A user config's values whose type is not their default's (``quiet_window_us =
    "x"``, ``background_sched = 3``), naming the key and its section or [[driver]] entry:
    npud refuses to start, rather than failing later in a driver host it restarts.
    Unknown keys are :func:`key_problems`' and skipped here."""
    for name, value in user.items():
        if name == "app":  # validated entry by entry by service.apps
            continue
        if name == "driver":
            if not isinstance(value, list):
                yield name, "driver must be a list of tables ([[driver]] entries)"
                continue
            template = defaults["driver"][0]
            for i, entry in enumerate(value):
                if not isinstance(entry, dict):
                    yield name, f"[[driver]] #{i + 1} must be a table"
                    continue
                where = f"[[driver]] #{i + 1}"
                if isinstance(entry.get("name"), str):
                    where += f" ({entry['name']!r})"
                for key, v in entry.items():
                    bad = _type_error("driver", key, v, template[key]) \
                        if key in template else None
                    if bad is not None:
                        yield name, f"{key} in {where} {bad}"
            continue
        known = defaults.get(name)
        if not isinstance(known, dict):
            continue
        if not isinstance(value, dict):
            yield name, f"[{name}] must be a table"
            continue
        for key, v in value.items():
            bad = _type_error(name, key, v, known[key]) if key in known else None
            if bad is not None:
                yield name, f"{key} in [{name}] {bad}"


@dataclass
class FileCheck:
    """What :func:`file_problems` found in a config file."""

    #: The config it gives (the defaults overlaid), None when it cannot be read or parsed.
    data: dict[str, Any] | None
    #: Every problem, each "config file PATH: ...".
    problems: list[str]
    #: The sections they are in ("driver" for [[driver]] entries).
    sections: set[str]
    #: The file's own tables as written (no defaults): which keys it sets.
    user: dict[str, Any] = field(default_factory=dict)


def file_problems(path: str | Path) -> FileCheck:
    """Everything wrong with the config file ``path``, not only the first: unknown keys,
    then wrong types, then values out of range (config_ranges.py)."""
    data = _defaults()
    try:
        user = tomllib.loads(Path(path).read_text())
    except FileNotFoundError:
        return FileCheck(None, [f"config file {path} does not exist"], set())
    except (OSError, UnicodeDecodeError) as exc:
        return FileCheck(None, [f"config file {path} cannot be read: {exc}"], set())
    except tomllib.TOMLDecodeError as exc:
        return FileCheck(None, [f"config file {path} is not valid TOML: {exc}"], set())
    found = [*key_problems(user, data), *type_problems(user, data)]
    # Lists of tables ([[driver]], [[app]]) replace the defaults wholesale.
    merged = _merge(data, user)
    template = data["driver"][0]
    entries = merged.get("driver")
    ranged = {**merged, "driver": [_merge(template, d) if isinstance(d, dict) else d
                                   for d in entries] if isinstance(entries, list) else []}
    found += range_problems(ranged, only=user)
    return FileCheck(merged, [f"config file {path}: {p}" for _, p in found],
                     {section for section, _ in found}, user)


@dataclass
class Config:
    data: dict[str, Any] = field(default_factory=_defaults)
    source: str = "<defaults>"
    #: What the file (and ``overrides``) set, as written, without the defaults: a key the
    #: user set explicitly wins over what ``protect_foreground`` implies
    #: (service/protection.py). None (a Config built from data): a key counts as set where
    #: its value differs from the default.
    user: dict[str, Any] | None = None

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
        user: dict[str, Any] = {}
        if path is not None:
            check = file_problems(path)
            if check.problems or check.data is None:
                raise InvalidArgument(check.problems[0])
            data, user = check.data, check.user
            source = str(path)
        if overrides:
            data = _merge(data, overrides)
            user = _merge(user, overrides)
        return cls(data=data, source=source, user=user)
