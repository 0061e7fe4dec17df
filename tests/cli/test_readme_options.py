"""The READMEs' configuration snippets (README.md's and bench/README.md's) and the option
table (bench/README.md, "Foreground protection: execution classes") are held to the
config's keys (npumanager/defaults.toml, where every key a section accepts is listed) and
to the reference driver's option table (drivers/option_specs.py): a key renamed or
removed, or a default changed, without the READMEs following fails here, naming the
file and line."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

from npumanager.config import CHOICES, _defaults
from npumanager.drivers.option_specs import PLUGIN_OPTIONS

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
#: The benchmark narratives, moved out of README.md with their snippets and the table.
BENCH_README = ROOT / "bench" / "README.md"
#: `[section] key = value` or `[[driver]] key = value` written inline.
SNIPPET = re.compile(r"`\[(\[?)([a-z_]+)\]?\] ([a-z_.]+) = ([^`]+)`")
#: The execution classes' table: | `key` | default | what it does |.
TABLE_HEADER = "| key | default | what it does |"


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


def _where(path: Path, n: int) -> str:
    return f"{path.relative_to(ROOT)}:{n}"


def _section(defaults: dict[str, Any], name: str) -> dict[str, Any]:
    sec = defaults[name]
    return dict(sec[0]) if isinstance(sec, list) else dict(sec)


def _value(text: str) -> Any:
    return tomllib.loads(f"v = {text}")["v"]


def _table_rows() -> list[tuple[int, str, str]]:
    """(line number, key cell, default cell) of each row of the option table."""
    lines = _lines(BENCH_README)
    start = lines.index(TABLE_HEADER)
    rows = []
    for n, line in enumerate(lines[start + 2:], start + 3):
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows.append((n, cells[0], cells[1]))
    return rows


def _check_snippets(path: Path) -> int:
    """Checks every inline snippet of one file; returns how many it found."""
    defaults = _defaults()
    seen = 0
    for n, line in enumerate(_lines(path), 1):
        for m in SNIPPET.finditer(line):
            double, section, key, value = m.groups()
            at = _where(path, n)
            assert section in defaults, f"{at}: no section [{section}]"
            assert bool(double) == isinstance(defaults[section], list), (
                f"{at}: [{section}] written as {'[[ ]]' if double else '[ ]'}")
            known = _section(defaults, section)
            assert key in known, f"{at}: [{section}] has no key {key!r}"
            if value.strip() in ("N", "S", "PATH"):  # a placeholder, not a value
                seen += 1
                continue
            parsed = _value(value)
            assert type(parsed) is type(known[key]) or (
                isinstance(known[key], float) and type(parsed) is int), (
                f"{at}: {key} = {value} is not a {type(known[key]).__name__}")
            words = CHOICES.get((section, key))
            assert words is None or parsed in words, f"{at}: {key} = {value}"
            seen += 1
    return seen


def test_readme_inline_config_snippets_name_known_keys_with_valid_values() -> None:
    assert _check_snippets(README) >= 4  # (the parser still finds README's snippets)


def test_bench_readme_inline_config_snippets_name_known_keys_with_valid_values() -> None:
    assert _check_snippets(BENCH_README) >= 4  # (and bench/README.md's)


def test_readme_option_table_keys_and_defaults_match_the_config() -> None:
    driver = _section(_defaults(), "driver")
    options = PLUGIN_OPTIONS["reference"]
    rows = _table_rows()
    assert len(rows) >= 15
    for n, key_cell, default_cell in rows:
        at = _where(BENCH_README, n)
        keys = re.findall(r"`([a-z_.]+)`", key_cell)
        assert keys, f"{at}: no key in {key_cell!r}"
        first = keys[0]
        if first.startswith("options."):
            # `options.X_foreground` / `_background`: every variant a reference option.
            base = first.removeprefix("options.")
            stem = base.rsplit("_", 1)[0]
            names = [base] + [stem + k if k.startswith("_") else k for k in keys[1:]]
            for name in names:
                assert name in options, f"{at}: reference has no option {name!r}"
            continue
        assert first in driver, f"{at}: [[driver]] has no key {first!r}"
        shown = default_cell.split(" (")[0].strip().strip("`")
        assert _value(shown) == driver[first], (
            f"{at}: {first} defaults to {driver[first]!r} in defaults.toml, the table "
            f"says {shown}")


def test_readme_option_table_lists_the_execution_class_knobs() -> None:
    """Each [[driver]] key that picks how background work is lowered, placed or held
    (background_*, quiet_*, burst_*, hold_loads) has a row: bench/README.md's table is
    where their measurements live."""
    driver = _section(_defaults(), "driver")
    listed = {re.findall(r"`([a-z_.]+)`", key)[0] for _, key, _ in _table_rows()}
    knobs = {k for k in driver
             if k.startswith(("background_", "quiet_", "burst_")) or k == "hold_loads"}
    knobs.discard("background_nice")  # a parameter of background_sched = "nice" (its row)
    missing = sorted(knobs - listed)
    assert not missing, f"bench/README.md's option table lacks {missing}"
