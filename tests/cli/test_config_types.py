"""A config value of the wrong type is refused when the config is loaded, naming the key and
its section or [[driver]] entry: npud exits 1 with that one line instead of starting a
driver host that fails on it (``int("x")``) and is restarted without end, or running with
a value nobody meant (``bool("no")`` is True, ``str(3)`` is "3")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from npumanager.config import CHOICES, Config, _defaults
from npumanager.drivers.bg_threads import BACKGROUND_SCHED
from npumanager.errors import InvalidArgument
from tests.cli.conftest import npu, npu_process

TEMPLATE: dict[str, Any] = _defaults()["driver"][0]


def _wrong(default: Any) -> Any:
    """A value of another type than ``default``'s."""
    if isinstance(default, bool):
        return "yes"
    if isinstance(default, int | float):
        return "x"
    if isinstance(default, str):
        return 3
    return 3  # a table or a list


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    return f'"{value}"' if isinstance(value, str) else str(value)


def _driver_config(tmp_path: Path, key: str, value: Any) -> Path:
    entry = {"name": "reference", "plugin": "reference", key: value}
    cfg = tmp_path / "npud.toml"
    cfg.write_text("[[driver]]\n" + "".join(f"{k} = {_toml(v)}\n" for k, v in entry.items()))
    return cfg


@pytest.mark.parametrize("key", sorted(TEMPLATE))
def test_every_driver_key_of_the_wrong_type_is_named(tmp_path: Path, key: str) -> None:
    value = _wrong(TEMPLATE[key])
    cfg = _driver_config(tmp_path, key, value)
    where = "[[driver]] #1" if key == "name" else "[[driver]] #1 ('reference')"
    with pytest.raises(InvalidArgument) as exc:
        Config.load(cfg)
    message = str(exc.value)
    assert message.startswith(f"config file {cfg}: {key} in {where} must be "), message
    kind = "an integer" if value == 3 else "a string"
    assert message.endswith(f"not {value!r} ({kind})"), message


@pytest.mark.parametrize("key,value", [("channels", True), ("quiet_window_us", 1.5),
                                       ("background_sched", "bogus"),
                                       ("background_cpus", "some"),
                                       ("background_cgroup", "on"),
                                       ("background_compile", "fork"),
                                       ("background_ends", "loop"),
                                       ("background_load", "idle"),
                                       ("background_lower", "step"),
                                       ("compile_malloc", "huge"),
                                       ("load_cpus", "first")])
def test_driver_values_of_the_right_type_but_no_meaning_are_named(
        tmp_path: Path, key: str, value: Any) -> None:
    """A bool is an int to Python, never to this config; a word key takes its words."""
    cfg = _driver_config(tmp_path, key, value)
    with pytest.raises(InvalidArgument, match=rf"{key} in \[\[driver\]\] #1 \('reference'\) "
                                              "must be "):
        Config.load(cfg)


def test_values_of_the_right_type_load(tmp_path: Path) -> None:
    """Every default written back loads; an integer is a number; a second entry is named
    by its position."""
    cfg = tmp_path / "npud.toml"
    body = "".join(f"{k} = {_toml(v)}\n" for k, v in TEMPLATE.items()
                   if k not in ("options", "grant_wait_s", "inline_run_us"))
    cfg.write_text(f"[[driver]]\n{body}grant_wait_s = 1\ninline_run_us = 12.5\n"
                   "[[driver]]\nname = \"second\"\nchannels = \"4\"\n"
                   "[manager]\nunload_deadline_s = 2\nadmin_group = 0\n")
    with pytest.raises(InvalidArgument, match=r"channels in \[\[driver\]\] #2 \('second'\)"):
        Config.load(cfg)
    cfg.write_text(cfg.read_text().replace('channels = "4"', "channels = 4"))
    drivers = Config.load(cfg).drivers()
    assert drivers[0]["grant_wait_s"] == 1 and drivers[1]["channels"] == 4


@pytest.mark.parametrize("section,key,value", [("manager", "max_frame", "big"),
                                               ("manager", "enforce_admission", "no"),
                                               ("policy", "max_budget", 2.5),
                                               ("thermal", "sources", "driver"),
                                               ("cache", "max_entries", "many")])
def test_other_sections_name_the_key_too(tmp_path: Path, section: str, key: str,
                                         value: Any) -> None:
    cfg = tmp_path / "npud.toml"
    cfg.write_text(f"[{section}]\n{key} = {_toml(value)}\n")
    with pytest.raises(InvalidArgument, match=rf"{key} in \[{section}\] must be "):
        Config.load(cfg)


def test_the_word_keys_are_the_drivers_own_words() -> None:
    assert CHOICES[("driver", "background_sched")] == BACKGROUND_SCHED


def test_npud_refuses_to_start_with_one_line(tmp_path: Path, runtime_dir: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    cfg = _driver_config(tmp_path, "quiet_window_us", "x")
    rc, out, err = npu(capsys, "serve", "--runtime-dir", str(runtime_dir), "--config",
                       str(cfg))
    assert rc == 1 and "ready" not in out, (out, err)
    assert err.strip() == (f"npu serve: InvalidArgument: config file {cfg}: quiet_window_us "
                           "in [[driver]] #1 ('reference') must be an integer, not 'x' "
                           "(a string)"), err
    # The console script in a process of its own, as systemd runs it: the same line.
    cfg = _driver_config(tmp_path, "background_sched", 3)
    proc = npu_process("serve", "--runtime-dir", str(runtime_dir), "--config", str(cfg))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "background_sched in [[driver]] #1 ('reference') must be a string, not 3" \
        in proc.stderr, proc.stderr
