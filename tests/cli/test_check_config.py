"""`npu serve --check-config [PATH]`: the config validated as `npu serve` would (the file,
the owners of each section, plugins and extras, paths), without starting anything. Every
problem is printed (not only the first) and the exit status is 1; a clean config prints
what differs from the defaults and exits 0."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.cli.conftest import npu, npu_process


def _write(tmp_path: Path, body: str) -> Path:
    cfg = tmp_path / "npud.toml"
    cfg.write_text(body)
    return cfg


def _check(capsys: pytest.CaptureFixture[str], runtime_dir: Path, *argv: str
           ) -> tuple[int, str, list[str]]:
    rc, out, err = npu(capsys, "serve", "--runtime-dir", str(runtime_dir), *argv)
    return rc, out, err.splitlines()


def test_a_clean_config_prints_what_differs_and_exits_0(
        tmp_path: Path, runtime_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = _write(tmp_path, "[manager]\nunload_deadline_s = 2.0\nsocket_mode = 0o660\n"
                           "[policy]\nweights = { \"2\" = 8 }\n"
                           "[[driver]]\nname = \"reference\"\nchannels = 4\n"
                           "[[app]]\nuid = 1000\nimportance = \"foreground\"\n")
    rc, out, err = _check(capsys, runtime_dir / "rt", "--check-config", str(cfg),
                          "--protect-foreground", "off")
    assert rc == 0 and err == [], err
    assert out.splitlines() == [
        f"{cfg}: OK (npud would serve {runtime_dir / 'rt' / 'npu.sock'})",
        "differs from the defaults:",
        "  [manager] socket_mode = 0o660 (default 0o666)",
        "  [manager] unload_deadline_s = 2.0 (default 5.0)",
        '  [policy] weights = { "0" = 1, "1" = 2, "2" = 8 } (default { "0" = 1, "1" = 2, '
        '"2" = 4 })',
        "  [[driver]] #1 'reference' (plugin 'reference'): channels = 4 (default 3)",
        '  [[app]] #1: uid = 1000, importance = "foreground"',
        "devices: reference",
        'foreground protection: off (protect_foreground = "off")',
    ], out
    assert not (runtime_dir / "rt").exists()  # nothing was started or created


def test_the_defaults_and_the_config_flag(tmp_path: Path, runtime_dir: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = _check(capsys, runtime_dir, "--check-config", "--protect-foreground", "off")
    assert rc == 0 and err == [], err
    assert out.splitlines()[1:] == ["differs from the defaults: nothing", "devices: reference",
                                    'foreground protection: off (protect_foreground = "off")']
    # Without PATH, --config's file is the one checked; --no-drivers as serve takes it.
    cfg = _write(tmp_path, "[manager]\nmax_budget = 3\n")
    rc, _, err = _check(capsys, runtime_dir, "--config", str(cfg), "--check-config")
    assert rc == 1 and err[0].startswith(f"config file {cfg}: unknown key 'max_budget' in "
                                         "[manager]"), err
    cfg = _write(tmp_path, "[manager]\ndrivers = false\n")
    rc, out, err = _check(capsys, runtime_dir, "--check-config", str(cfg))
    assert rc == 0 and out.splitlines()[-2].startswith("devices: none (a pure manager"), out
    assert out.splitlines()[-1] == ("foreground protection: auto; in this process: off (npud "
                                    "runs no drivers)"), out


def test_every_problem_is_printed_and_the_exit_is_1(
        tmp_path: Path, runtime_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = _write(tmp_path, "[manager]\nunload_deadlin_s = 2.0\nhello_timeout_s = 0\n"
                           "[policy]\nmax_budget = \"4\"\n"
                           "[[driver]]\nname = \"reference\"\nquiet_window_us = -5\n"
                           "[thermal]\nthresholds_c = { severe = 99.0 }\n"
                           "devices = { \"nosuch\" = \"file:/x\" }\n")
    rc, out, err = _check(capsys, runtime_dir, "--check-config", str(cfg))
    assert rc == 1 and out == "", out
    where = f"config file {cfg}: "
    assert err == [
        where + "unknown key 'unload_deadlin_s' in [manager]; did you mean "
                "'unload_deadline_s'? (every key is listed in npumanager/defaults.toml)",
        where + "max_budget in [policy] must be an integer, not '4' (a string)",
        where + "hello_timeout_s in [manager] must be > 0, not 0",
        where + "quiet_window_us in [[driver]] #1 ('reference') must be >= 0 (0 = off), "
                "not -5",
        where + "thresholds_c in [thermal] must not decrease from light to shutdown, not "
                "critical = 90 below severe = 99",
        "npu serve --check-config: 5 problems found",
    ], err


def test_the_owners_of_clean_sections_are_run(
        tmp_path: Path, runtime_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """What npud's start would refuse beyond the file's keys: the [[app]] table, the
    importance rules, device sensors of a device npud does not have."""
    cfg = _write(tmp_path, "[[app]]\nuid = 1000\nunit = \"cam.service\"\n"
                           "[importance]\nnice = [{ min = 5, importance = \"sleepy\" }]\n"
                           "[thermal]\ndevices = { \"nosuch\" = \"file:/x\" }\n")
    rc, _, err = _check(capsys, runtime_dir, "--check-config", str(cfg))
    assert rc == 1, err
    where = f"config file {cfg}: "
    assert err == [
        where + "[importance] nice[0]: unknown importance 'sleepy'; use a number or one of "
                "foreground, foreground_service, visible, perceptible, service, "
                "top_sleeping, cant_save_state, cached, gone",
        where + 'config [[app]] #1 (unit=cam.service): give exactly one of uid = N or '
                'unit = "name.service"',
        where + "[thermal] devices names nosuch; npud's devices are reference",
        "npu serve --check-config: 3 problems found"], err


@pytest.mark.parametrize("plugin", ["openvino", "torch"])
def test_a_plugin_whose_extra_is_missing_names_the_extra(
        tmp_path: Path, runtime_dir: Path, capsys: pytest.CaptureFixture[str],
        plugin: str) -> None:
    cfg = _write(tmp_path, f"[[driver]]\nname = \"dev\"\nplugin = \"{plugin}\"\n")
    rc, out, err = _check(capsys, runtime_dir, "--check-config", str(cfg))
    if importlib.util.find_spec(plugin) is not None:  # CI installs both extras
        assert rc == 0 and "devices: dev" in out.splitlines(), (out, err)
        return
    assert rc == 1 and err == [
        f"config file {cfg}: plugin {plugin!r} in [[driver]] #1 ('dev') needs the {plugin} "
        f"extra, which is not installed (module {plugin!r} is not importable): pip install "
        f"'npumanager[{plugin}]'",
        "npu serve --check-config: 1 problem found"], err


def test_an_unknown_plugin_and_an_unimportable_module_are_named(
        tmp_path: Path, runtime_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = _write(tmp_path, "[[driver]]\nname = \"a\"\nplugin = \"refrence\"\n"
                           "[[driver]]\nname = \"b\"\nplugin = \"no_such_mod:Driver\"\n")
    rc, _, err = _check(capsys, runtime_dir, "--check-config", str(cfg))
    assert rc == 1, err
    assert err[0].startswith(f"config file {cfg}: plugin 'refrence' in [[driver]] #1 ('a') "
                             "is not an installed driver plugin; did you mean 'reference'? "
                             "(installed: "), err  # the closest installed name (was not said)
    assert err[1] == (f"config file {cfg}: plugin 'no_such_mod:Driver' in [[driver]] #2 "
                      "('b'): module 'no_such_mod' is not importable"), err


def test_paths_that_cannot_work(tmp_path: Path, runtime_dir: Path,
                                capsys: pytest.CaptureFixture[str]) -> None:
    """A socket path longer than a Unix socket takes: --check-config says so, and `npu
    serve` refuses with that line before it starts anything. A runtime dir others may
    write is named as `npu serve` would refuse it."""
    long_rt = tmp_path / ("r" * 120)
    rc, _, err = _check(capsys, long_rt, "--check-config")
    sock = long_rt / "npu.sock"
    line = (f"socket path {sock} is {len(str(sock))} bytes, more than a Unix socket takes "
            "(108): choose a shorter --runtime-dir or driver name")
    assert rc == 1 and err[0] == f"config: {line}", err
    rc, out, serr = npu(capsys, "serve", "--runtime-dir", str(long_rt), "--no-drivers")
    assert rc == 1 and "ready" not in out and serr == f"npu serve: InvalidArgument: {line}\n"
    open_rt = tmp_path / "open"
    open_rt.mkdir()
    open_rt.chmod(0o777)
    rc, _, err = _check(capsys, open_rt, "--check-config")
    assert rc == 1 and err[0].startswith(f"config: runtime dir {open_rt} "), err
    assert "writable" in err[0], err


def test_a_file_that_cannot_be_read(tmp_path: Path, runtime_dir: Path,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = _check(capsys, runtime_dir, "--check-config", str(tmp_path / "none.toml"))
    assert rc == 1 and err == [f"config file {tmp_path / 'none.toml'} does not exist",
                               "npu serve --check-config: 1 problem found"], err
    bad = _write(tmp_path, "[manager\n")
    rc, _, err = _check(capsys, runtime_dir, "--check-config", str(bad))
    assert rc == 1 and err[0].startswith(f"config file {bad} is not valid TOML: "), err
    rc, _, err = _check(capsys, runtime_dir, "--check-config", str(tmp_path))
    assert rc == 1 and err[0].startswith(f"config file {tmp_path} cannot be read: "), err


def test_the_console_script(tmp_path: Path, runtime_dir: Path) -> None:
    """As an operator runs it: its own process, exit status and output."""
    cfg = _write(tmp_path, "[[driver]]\nname = \"reference\"\nchannels = 0\n")
    proc = npu_process("serve", "--check-config", str(cfg), "--runtime-dir", str(runtime_dir))
    assert proc.returncode == 1 and proc.stdout == "", proc.stderr
    assert proc.stderr.splitlines() == [
        f"config file {cfg}: channels in [[driver]] #1 ('reference') must be >= 1, not 0",
        "npu serve --check-config: 1 problem found"]
    cfg.write_text("[[driver]]\nname = \"reference\"\nchannels = 2\n")
    proc = npu_process("serve", "--check-config", str(cfg), "--runtime-dir", str(runtime_dir))
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert "channels = 2 (default 3)" in proc.stdout, proc.stdout


def test_each_plugins_options_are_checked(
        tmp_path: Path, runtime_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """[[driver]] options: unknown keys (with the nearest known one), types and ranges, per
    built-in plugin; checked whether or not the plugin's extra is installed."""
    cfg = _write(tmp_path, "[[driver]]\nname = \"reference\"\n"
                           "options = { intra_op_thread = 2, memory_bytes = \"1G\", "
                           "compile_mode = \"lazy\", ambient_c = 90.0, max_c = 80.0 }\n"
                           "[[driver]]\nname = \"ov\"\nplugin = \"openvino\"\n"
                           "options = { num_stream = 2, inference_num_threads = -1, "
                           "devices = 7 }\n"
                           "[[driver]]\nname = \"pt\"\nplugin = \"torch\"\n"
                           "options = { runners = 0, state_dir = \"\" }\n"
                           "[[driver]]\nname = \"fake\"\n"
                           "plugin = \"npumanager.testing.fake_driver:FakeDriver\"\n"
                           "options = { latency_ms = 3, anything = true }\n")
    rc, _, err = _check(capsys, runtime_dir, "--check-config", str(cfg))
    assert rc == 1
    where = f"config file {cfg}: [[driver]] "
    mine = [e for e in err if " options: " in e]
    assert mine == [
        where + "#1 ('reference') options: unknown option 'intra_op_thread' for plugin "
                "'reference' (did you mean 'intra_op_threads'? known: ambient_c, "
                "compile_mode, data_cache_files, device_queue_lock, devices, "
                "graph_optimization_background, "
                "intra_op_spinning, intra_op_spinning_background, "
                "intra_op_spinning_foreground, intra_op_threads, "
                "intra_op_threads_background, intra_op_threads_foreground, max_c, "
                "mem_arena_background, mem_pattern_background, memory_bytes, "
                "model_cache_files, recompile_after, thermal_tau_s)",
        where + "#1 ('reference') options: memory_bytes = '1G' must be an integer",
        where + "#1 ('reference') options: compile_mode = 'lazy' must be one of 'eager', "
                "'jit', 'multistage'",
        where + "#1 ('reference') options: ambient_c = 90.0 must be below max_c = 80.0",
        where + "#2 ('ov') options: unknown option 'num_stream' for plugin 'openvino' (did "
                "you mean 'num_streams'? known: devices, execution_mode, "
                "inference_num_threads, memory_bytes, model_cache_files, num_streams)",
        where + "#2 ('ov') options: inference_num_threads = -1 must be at least 0",
        where + "#2 ('ov') options: devices = 7 must be a name or a list of names",
        where + "#3 ('pt') options: runners = 0 must be at least 1",
        where + "#3 ('pt') options: state_dir = '' must be a non-empty string",
    ], err  # a module:Class plugin's options are its own (not checked)
    good = _write(tmp_path, "[[driver]]\nname = \"reference\"\n"
                            "options = { intra_op_threads = 2, compile_mode = \"jit\", "
                            "devices = [\"a\", \"b\"] }\n")
    rc, _, err = _check(capsys, runtime_dir, "--check-config", str(good))
    assert rc == 0, err


def test_each_plugins_table_lists_every_option_it_reads() -> None:
    """drivers/option_specs.py against the plugins' sources: an option a plugin reads that
    the table lacks would be refused by --check-config as unknown."""
    import re

    from npumanager.drivers.option_specs import PLUGIN_OPTIONS

    root = Path(__file__).resolve().parents[2] / "npumanager" / "drivers"
    sources = {"reference": ["reference.py", "cache_artifacts.py"],
               "openvino": ["openvino.py"], "torch": ["torch_aot.py"]}
    for plugin, files in sources.items():
        text = "".join((root / f).read_text() for f in files)
        read = set(re.findall(r"options\.get\(\"(\w+)\"", text)) | set(
            re.findall(r"options\[\"(\w+)\"\]", text))
        assert read, plugin
        assert read <= set(PLUGIN_OPTIONS[plugin]), (plugin, read - set(PLUGIN_OPTIONS[plugin]))


def test_the_metrics_port_must_be_free(
        tmp_path: Path, runtime_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--metrics or [metrics] listen: a port another process listens on is named; a free
    one (or port 0) passes; a malformed address is the usage error serve would give."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cfg = _write(tmp_path, f"[metrics]\nlisten = \"127.0.0.1:{port}\"\n")
        rc, _, err = _check(capsys, runtime_dir, "--check-config", str(cfg))
        assert rc == 1 and err[0] == (
            f"config file {cfg}: metrics listen address '127.0.0.1:{port}': port {port} is "
            "in use (another process listens on it): stop it, or choose another port (port "
            "0 picks a free one)"), err
        rc, _, err = _check(capsys, runtime_dir, "--metrics", f"127.0.0.1:{port}",
                            "--check-config")
        assert rc == 1 and f"port {port} is in use" in err[0], err
    # Let go: the same port passes now (nothing listens), and so does port 0.
    rc, _, err = _check(capsys, runtime_dir, "--check-config", str(cfg))
    assert rc == 0, err
    rc, _, err = _check(capsys, runtime_dir, "--metrics", "127.0.0.1:0", "--check-config")
    assert rc == 0, err
    rc, _, err = _check(capsys, runtime_dir, "--metrics", "127.0.0.1", "--check-config")
    assert rc == 1 and "is not HOST:PORT" in err[0], err
    rc, _, err = _check(capsys, runtime_dir, "--metrics", "192.0.2.1:9464", "--check-config")
    assert rc == 1 and "192.0.2.1 is not an address of this machine" in err[0], err


@pytest.mark.parametrize(("value", "problem"), [
    ("300", None), ("0", None),
    ("50", "must be 0 (the kernel's own) or between 100 and 100000, not 50"),
    ("200000", "must be 0 (the kernel's own) or between 100 and 100000, not 200000"),
    ("\"short\"", "must be an integer, not 'short' (a string)")])
def test_foreground_slice_us_is_checked(
        tmp_path: Path, runtime_dir: Path, capsys: pytest.CaptureFixture[str],
        value: str, problem: str | None) -> None:
    """``foreground_slice_us``: 0 or the kernel's clamp for a slice, 100-100000 µs."""
    cfg = _write(tmp_path, f"[[driver]]\nname = \"reference\"\nforeground_slice_us = {value}\n")
    rc, _, err = _check(capsys, runtime_dir, "--check-config", str(cfg))
    if problem is None:
        assert rc == 0, err
    else:
        assert rc == 1
        assert any(line.endswith(f"foreground_slice_us in [[driver]] #1 ('reference') "
                                 f"{problem}") for line in err), err


def test_importance_rules_without_from_process_are_a_note(
        tmp_path: Path, runtime_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """npud reads [importance]'s rules only with from_process = true: a config that set
    them without it ran them never, and neither check-config nor npud said so."""
    rules = "[importance]\nnice = [ { min = 3, importance = \"cached\" } ]\n"
    cfg = _write(tmp_path, rules)
    rc, out, err = _check(capsys, runtime_dir / "rt", "--check-config", str(cfg),
                          "--protect-foreground", "off")
    assert rc == 0 and err == [], err
    assert ("note: [importance] sets nice, which npud reads only with from_process = true "
            "(it is false): they are not used") in out.splitlines(), out
    cfg = _write(tmp_path, rules + "from_process = true\n")
    rc, out, err = _check(capsys, runtime_dir / "rt", "--check-config", str(cfg),
                          "--protect-foreground", "off")
    assert rc == 0 and "note: [importance]" not in out, out
