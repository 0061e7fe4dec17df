"""Usage errors exit 2 with one line naming the problem; runtime failures exit 1; never a
traceback. Most need no npud: the mistake is found before anything is asked of it."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cli.conftest import npu, npu_process

USAGE = [
    ["nosuch"],
    [],
    ["run"],
    ["run", "/nonexistent/model.onnx"],
    ["run", "/tmp"],
    ["run", "--builtin", "add", "--repeat", "0"],
    ["run", "--builtin", "add", "--job-priority", "5000"],
    ["run", "--builtin", "add", "--steps", "0"],
    ["run", "--builtin", "add", "--wait", "-1"],
    ["run", "--builtin", "nosuch"],
    ["run", "x.onnx", "--builtin", "add"],
    ["run", "x.onnx", "--save", "y.onnx"],
    ["importance", "set", "1000", "99999"],
    ["importance", "set", "1000", "bogus"],
    ["importance", "set", "-5", "cached"],
    ["thermal", "override", "hot"],
    ["thermal", "override", "7"],
    ["policy", "set", "nosuch"],
    ["policy", "set", "budget", "--max-budget", "0"],
    ["policy", "set", "budget", "--weight", "5=2"],
    ["policy", "set", "budget", "--weight", "x"],
    ["policy", "set", "budget", "--weight", "2=0"],
    ["status", "--story", "a:b"],
    ["bench", "nosuch"],
    ["cache", "gc", "--max-entries", "-1"],
    ["run", "--builtin", "add", "--size", "3"],
    ["chaos", "--duration", "1"],  # with --runtime-dir: it starts its own npud
    ["run", "--builtin", "add", "--seed", "-1"],  # was numpy's ValueError traceback
    ["trace", "record", "--duration", "1e12"],  # was an OverflowError traceback, at the end
    ["run", "--builtin", "add", "--wait", "1e300"],
    ["top", "--interval", "1e12"],
    ["demo", "--manager-only"],  # with --runtime-dir: a traceback (its own npud there)
    ["policy", "set", "budget", "--max-budget", "99999999999999999999"],  # npud said, exit 1
    ["policy", "set", "budget", "--weight", "2=99999999999999999999"],
    ["policy", "set", "memory", "--memory-budget-bytes", "99999999999999999999"],
    ["run", "--builtin", "conv", "--save", "/proc/x.onnx"],  # was exit 1, 'No such file'
    ["run", "--builtin", "conv", "--save", "/tmp"],
]


@pytest.mark.parametrize("argv", USAGE, ids=lambda a: " ".join(a) or "(none)")
def test_usage_errors_exit_2(argv: list[str], runtime_dir: Path,
                             capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = npu(capsys, "--runtime-dir", str(runtime_dir), *argv)
    assert rc == 2, (out, err)
    assert "Traceback" not in err and err.strip(), err


def test_messages_name_the_problem(runtime_dir: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    rt = ["--runtime-dir", str(runtime_dir)]
    _, _, err = npu(capsys, *rt, "run", "/nonexistent/model.onnx")
    assert "no such file: /nonexistent/model.onnx" in err
    _, _, err = npu(capsys, *rt, "run", "/tmp")
    assert "/tmp is a directory" in err
    _, _, err = npu(capsys, *rt, "run", "--builtin", "add", "--repeat", "0")
    assert "--repeat: 0 is out of range (>= 1)" in err
    _, _, err = npu(capsys, *rt, "run", "--builtin", "add", "--job-priority", "5000")
    assert "out of range (0..1000)" in err
    _, _, err = npu(capsys, *rt, "importance", "set", "1000", "99999")
    assert "importance 99999 is out of range 0..1000" in err
    empty = runtime_dir / "empty.onnx"
    empty.write_bytes(b"")
    rc, _, err = npu(capsys, *rt, "run", str(empty))
    assert (rc, err) == (2, f"npu run: {empty} is empty; name an .onnx file\n")


@pytest.mark.parametrize("argv", [["status"], ["thermal", "status"], ["policy", "set", "budget"],
                                  ["importance", "set", "1000", "cached"],
                                  ["run", "--builtin", "add"]])
def test_without_npud_exit_1_with_a_hint(argv: list[str], runtime_dir: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = npu(capsys, *argv, "--runtime-dir", str(runtime_dir))
    assert rc == 1
    assert "is `npu serve` running?" in err and "Traceback" not in err


def test_serve_on_a_file_names_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """API.md: exit 1 and a message naming the path (no FileExistsError traceback)."""
    f = tmp_path / "afile"
    f.write_text("")
    for rt in (f, f / "sub"):
        rc, _, err = npu(capsys, "serve", "--runtime-dir", str(rt), "--no-drivers")
        assert rc == 1 and str(f) in err and "not a directory" in err.lower(), err
        assert "Traceback" not in err


def test_builtin_models_listed_and_saved(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = npu(capsys, "run", "--builtin", "list")
    assert rc == 0
    for name in ("add", "mlp", "conv", "decode"):
        assert f"  {name}" in out
    dest = tmp_path / "m.onnx"
    rc, out, _ = npu(capsys, "run", "--builtin", "mlp", "--save", str(dest))
    assert rc == 0 and dest.stat().st_size > 100_000

    import onnx

    onnx.checker.check_model(onnx.load(str(dest)))


def test_broken_pipe_is_quiet() -> None:
    """`npu ... | head`: the reader is gone before we write; no BrokenPipeError trace."""
    r, w = os.pipe()
    os.close(r)
    try:
        proc = npu_process("run", "--builtin", "list", stdout=w)
    finally:
        os.close(w)
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr, proc.stderr
    assert proc.returncode == 1


def test_examples_without_npud(runtime_dir: Path, tmp_path: Path) -> None:
    """A clear sentence when npud is absent, exit 1, and nothing left behind."""
    root = Path(__file__).resolve().parents[2] / "examples"
    cache = tmp_path / "cache"
    for script, extra in (("run_model.py", ["--cache-dir", str(cache)]),
                          ("llm_decode_loop.py", []), ("foreground_app.py", []),
                          ("background_llm.py", [])):
        proc = subprocess.run([sys.executable, str(root / script), "--runtime-dir",
                               str(runtime_dir), *extra], capture_output=True, text=True,
                              timeout=60)
        assert proc.returncode == 1, (script, proc.stdout, proc.stderr)
        assert "Traceback" not in proc.stderr, (script, proc.stderr)
        assert f"{runtime_dir}/" in proc.stderr and "Unavailable" in proc.stderr, proc.stderr
    assert not cache.exists()


def test_no_xdg_runtime_dir_is_one_line(runtime_dir: Path) -> None:
    """A user without $XDG_RUNTIME_DIR (`runuser -u`, cron) gets the one line about the
    socket, not platformdirs' two-line RuntimeDirWarning with its source line first."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("XDG_RUNTIME_DIR", "NPU_RUNTIME_DIR")}
    env["HOME"] = str(runtime_dir)
    # As root the default is /run/npu, not platformdirs': run as another uid.
    user = {"user": 65534, "group": 65534} if os.getuid() == 0 else {}
    proc = subprocess.run([str(Path(sys.executable).with_name("npu")), "status"], env=env,
                          capture_output=True, text=True, timeout=60, **user)  # type: ignore[call-overload]
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and "is `npu serve` running?" in lines[0], proc.stderr


def test_outputs_checked_before_the_run(runtime_dir: Path, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    """`npu demo --out DIR` and `npu trace record -o FILE` write at the end of the run: a
    place they cannot write is one line at once (exit 2), not a run thrown away after it
    (the demo ran its 11 s, then said 'No such file or directory: /proc/x')."""
    afile = tmp_path / "afile"
    afile.write_text("")
    rc, _, err = npu(capsys, "demo", "--fast", "--out", str(afile / "out"))
    assert rc == 2 and err.startswith(f"npu demo: --out {afile}/out: cannot create it"), err
    assert len(err.splitlines()) == 1
    for flag in ("-o", "--summary", "--png"):
        rc, _, err = npu(capsys, "trace", "record", "--runtime-dir", str(runtime_dir), flag,
                         str(afile / "t.json"))
        assert (rc, err) == (2, f"npu trace: {flag} {afile}/t.json: {afile} is not a "
                                "directory\n"), err


def test_bench_hands_options_to_the_one_named(capfd: pytest.CaptureFixture[str]) -> None:
    """`npu bench contention --repeat 3` was argparse's 'unrecognized arguments' although the
    README has the contention bench's --repeat; the options now go to that script (a flag it
    does not know shows the script's own usage error)."""
    from npumanager.cli.main import main

    rc = main(["bench", "contention", "--no-such-flag"])
    out, err = capfd.readouterr()
    assert rc == 2 and "contention.py: error: unrecognized arguments: --no-such-flag" in err, \
        (out, err)
    with pytest.raises(SystemExit) as exc:  # not a command that hands options on
        main(["status", "--no-such-flag"])
    assert exc.value.code == 2
    assert "npu: error: unrecognized arguments: --no-such-flag" in capfd.readouterr().err
    rc = main(["bench", "cache", "contention", "--repeat", "3"])
    assert rc == 2 and capfd.readouterr().err == (
        "npu bench: --repeat 3: options go to one benchmark; name it (npu bench contention "
        "--repeat 3)\n")


def _options(parser: argparse.ArgumentParser, path: str) -> Iterator[tuple[str, Any]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _options(sub, f"{path} {name}")
        elif action.option_strings and action.nargs != 0 and action.help != argparse.SUPPRESS:
            yield path, action


def test_every_option_says_what_it_takes_and_does() -> None:
    """`npu X --help`: every option that takes a value names it as the others do (DIR, FILE,
    N, NAME, S ...) and says what it is for: 'npu run --seed N' had no help line, and a
    dozen options showed argparse's own metavar ('--state-dir STATE_DIR', '--max-entries
    MAX_ENTRIES', '--max-budget MAX_BUDGET', npu driver's '--config CONFIG')."""
    from npumanager.cli.main import build_parser

    found = list(_options(build_parser(), "npu"))
    assert len(found) > 40  # not vacuous: every command's options were walked
    unnamed = [f"{path} {a.option_strings[-1]}" for path, a in found
               if a.metavar is None and a.choices is None]
    silent = [f"{path} {a.option_strings[-1]}" for path, a in found if not a.help]
    assert (unnamed, silent) == ([], [])
