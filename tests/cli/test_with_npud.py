"""The `npu` commands against a real npud in a temp runtime dir, as a newcomer runs them."""

from __future__ import annotations

import json
import os
import re
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from npumanager import (
    LoadStatus,
    ModelLoadRequest,
    ModelLoadRequestCallback,
    ModelPriority,
    ModelSize,
    NpuManager,
    ThermalStatus,
)
from npumanager.config import Config
from npumanager.errors import InvalidArgument
from npumanager.testing.daemon import DaemonProcess
from tests.cli.conftest import npu, npu_process

pytestmark = pytest.mark.slow


class Hold(ModelLoadRequestCallback):
    """Reports loaded at once and ignores unload requests (so deadlines show)."""

    def __init__(self) -> None:
        self.granted = threading.Event()

    def on_can_load_model(self, request: Any, status: Any, listener: Any) -> None:
        if status == LoadStatus.CAN_LOAD_NOW:
            listener.notify_model_loaded(request)
            self.granted.set()


def test_runtime_dir_before_or_after_the_command(npud: DaemonProcess,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    rt = str(npud.runtime_dir)
    for argv in (["--runtime-dir", rt, "status", "--json"], ["status", "--runtime-dir", rt,
                                                              "--json"]):
        rc, out, err = npu(capsys, *argv)
        assert rc == 0, err
        assert json.loads(out)["daemon"]["runtime_dir"] == rt
    for argv in (["--runtime-dir", rt, "policy", "set", "budget"],
                 ["policy", "--runtime-dir", rt, "set", "budget"],
                 ["policy", "set", "--runtime-dir", rt, "budget", "--max-budget", "4"],
                 ["thermal", "--runtime-dir", rt, "status"],
                 ["--runtime-dir", rt, "importance", "set", "50001", "cached"]):
        rc, _, err = npu(capsys, *argv)
        assert rc == 0, (argv, err)
    proc = npu_process("status", env={"NPU_RUNTIME_DIR": rt})
    assert proc.returncode == 0 and "npud" in proc.stdout


@pytest.mark.timeout(60)
def test_the_socket_given_for_its_directory_is_named(npud: DaemonProcess,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """--runtime-dir .../npu.sock (the socket's path typed for its directory): each command
    says what the path is and what to pass (its parent); npu serve never advises removing
    the socket a live npud serves (it said 'not a directory; remove it'), and the npud
    goes on serving."""
    rt, sock = npud.runtime_dir, npud.runtime_dir / "npu.sock"
    want = f"{sock} is a socket npud serves, not a directory: pass the directory that holds " \
        f"it ({rt})"
    rc, _, err = npu(capsys, "serve", "--runtime-dir", str(sock), "--no-drivers")
    assert rc == 1 and want in err and "remove" not in err, err  # exit 1: API.md
    rc, _, err = npu(capsys, "serve", "--runtime-dir", str(sock), "--check-config")
    assert rc == 1 and want in err and "remove" not in err, err
    rc, _, err = npu(capsys, "status", "--runtime-dir", str(sock))
    assert rc == 2 and err == f"npu status: --runtime-dir {want} or another path\n", err
    proc = npu_process("status", env={"NPU_RUNTIME_DIR": str(sock)})
    assert proc.returncode == 1 and want in proc.stderr, proc.stderr  # was 'Not a directory'
    assert sock.is_socket()
    rc, out, _ = npu(capsys, "status", "--runtime-dir", str(rt))
    assert rc == 0 and "npud" in out
    assert npud.proc is not None
    npud.proc.kill()  # a stopped npud's socket left behind (a clean stop removes it)
    npud.proc.wait(10)
    rc, _, err = npu(capsys, "serve", "--runtime-dir", str(sock), "--no-drivers")
    assert rc == 1 and f"{sock} is a socket nothing answers on, not a directory" in err, err


def test_status_reads_as_a_person_expects(npud: DaemonProcess,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    rt = str(npud.runtime_dir)
    with NpuManager(npud.runtime_dir) as mgr:
        held = Hold()
        mgr.request_can_load_model(
            ModelLoadRequest(1, ModelSize.GREATER_THAN_2G, ModelPriority.BACKGROUND), held)
        assert held.granted.wait(10)
        mgr.request_can_load_model(ModelLoadRequest(2, ModelSize.LESS_THAN_1GB), Hold())
        mgr.override_thermal_status(ThermalStatus.SEVERE)
        rc, out, err = npu(capsys, "status", "--runtime-dir", rt)
        mgr.reset_thermal_status()
    assert rc == 0, err
    assert "weights <1GB 1, 1-2GB 2, >2GB 4" in out
    assert "SEVERE (admin override" in out
    # Sizes by name, the unload reason with a countdown, the queue position.
    assert re.search(r"\b1\s+unload_requested\s+>2GB\s+background\b", out), out
    assert re.search(r"THERMAL, revoke in \d+(\.\d)? s", out), out
    assert re.search(r"\b2\s+waiting\s+<1GB\s+normal\b.*#1", out), out
    # No raw internals.
    for raw in ('{"0"', "[[", "queue:", "parked:", "deadline=", "memory_bytes"):
        assert raw not in out, (raw, out)
    assert re.search(r"reference|devices: none", out)


def test_story_defaults_to_the_callers_uid(npud: DaemonProcess,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    rt = str(npud.runtime_dir)
    with NpuManager(npud.runtime_dir) as mgr:
        held = Hold()
        mgr.request_can_load_model(ModelLoadRequest(7), held)
        assert held.granted.wait(10)
        rc, out, _ = npu(capsys, "status", "--runtime-dir", rt, "--story", "7")
        rc2, out2, _ = npu(capsys, "status", "--runtime-dir", rt, "--story", f"{os.getuid()}:7")
    assert rc == rc2 == 0
    assert out.startswith(f"request 7 of uid {os.getuid()}:") and "granted" in out
    assert out == out2


@pytest.mark.timeout(60)
def test_a_second_npud_on_the_runtime_dir_is_one_line_naming_the_first(
        npud: DaemonProcess) -> None:
    """It logged its foreground protection line and 'npud stopped' (it never started)
    before the refusal, which did not say which process serves the socket."""
    sock = npud.runtime_dir / "npu.sock"
    proc = npu_process("serve", "--runtime-dir", str(npud.runtime_dir), "--no-drivers")
    assert proc.returncode == 1
    assert proc.stderr == (f"npu serve: ServiceError: another npud (pid {npud.pid}) is "
                           f"already serving {sock}; stop it first, or give this one another "
                           f"--runtime-dir\n"), proc.stderr


@pytest.mark.timeout(60)
def test_an_unknown_story_is_a_usage_error_naming_those_there_are(
        npud: DaemonProcess, capsys: pytest.CaptureFixture[str]) -> None:
    """`npu status --story ID` of a request npud never saw exited 0 ('no decisions about
    ...'); it is a lookup of a name that does not exist, as `npu run --device NAME` and
    `--builtin NAME` are: exit 2, naming the ones there are (an admin: every key in the
    decision log; another uid: its own live requests)."""
    rt = str(npud.runtime_dir)
    me = os.getuid()
    rc, _, err = npu(capsys, "status", "--runtime-dir", rt, "--story", "5")
    assert rc == 2 and err.startswith(f"npu status: --story {me}:5: npud has no decision about "
                                      f"request 5 of uid {me}"), err
    with NpuManager(npud.runtime_dir) as mgr:
        for rid in (3, 4):
            held = Hold()
            mgr.request_can_load_model(ModelLoadRequest(rid), held)
            assert held.granted.wait(10)
        for argv in (["--story", "5"], ["--story", "5", "--json"]):
            rc, out, err = npu(capsys, "status", "--runtime-dir", rt, *argv)
            assert (rc, out) == (2, ""), (rc, out)
            assert (f"requests in its log: {me}:3, {me}:4" if me == 0 else
                    f"requests of uid {me} live: {me}:3, {me}:4") in err, err
        rc, _, err = npu(capsys, "status", "--runtime-dir", rt, "--story", "99999999999999999999")
        assert rc == 2 and "no uid or request id is that large" in err, err  # was a traceback
        if me == 0:  # another uid is offered its own live requests only
            import subprocess
            import sys

            npu_bin = str(Path(sys.executable).with_name("npu"))
            other = subprocess.run([npu_bin, "status", "--runtime-dir", rt, "--story", "5"],
                                   capture_output=True, text=True, timeout=60, user=65534,
                                   group=65534)
            assert other.returncode == 2, other
            assert "npud has no request of uid 65534 live" in other.stderr, other.stderr


def test_grant_timeout_names_the_status(npud: DaemonProcess,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    rt = str(npud.runtime_dir)
    with NpuManager(npud.runtime_dir) as mgr:
        held = Hold()
        mgr.request_can_load_model(ModelLoadRequest(1, ModelSize.GREATER_THAN_2G), held)
        assert held.granted.wait(10)
        rc, _out, err = npu(capsys, "run", "--builtin", "add", "--size", "2", "--wait", "0.3",
                           "--runtime-dir", rt)
    assert rc == 1
    assert "npud did not grant the load within 0.3 s" in err
    assert re.search(r"last answer (NOT_PRIORITIZED|WAIT_FOR_UNLOAD)\)", err), err


def test_admin_commands_say_what_they_set(npud: DaemonProcess,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """In the words `npu status` uses, not a Python dict of protobuf keys ('policy set to
    BUDGET {'maxBudget': 4, 'modelSizeWeights': {'2': 4}}') or a bare number."""
    rt = ["--runtime-dir", str(npud.runtime_dir)]
    rc, out, err = npu(capsys, *rt, "policy", "set", "budget", "--max-budget", "4",
                       "--weight", "2=4", "--weight", "1=2")
    assert (rc, out) == (0, "policy set to BUDGET (max budget 4, weights >2GB 4, 1-2GB 2)\n"), \
        err
    rc, out, err = npu(capsys, *rt, "policy", "set", "turn_taking")
    assert (rc, out) == (0, "policy set to TURN_TAKING\n"), err
    rc, out, err = npu(capsys, *rt, "importance", "set", "50001", "cached")
    assert (rc, out) == (0, "uid 50001: importance cached (400)\n"), err


def test_status_through_a_closed_pipe(npud: DaemonProcess) -> None:
    r, w = os.pipe()
    os.close(r)
    try:
        proc = npu_process("status", "--runtime-dir", str(npud.runtime_dir), stdout=w)
    finally:
        os.close(w)
    assert "Traceback" not in proc.stderr and proc.returncode == 1, proc.stderr


def test_unknown_config_key_suggests_the_right_one(tmp_path: Path, runtime_dir: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "npud.toml"
    cfg.write_text("[manager]\nunload_deadine_s = 2.0\n")
    with pytest.raises(InvalidArgument, match="did you mean 'unload_deadline_s'"):
        Config.load(cfg)
    rc, _, err = npu(capsys, "serve", "--runtime-dir", str(runtime_dir), "--config", str(cfg))
    assert rc == 1 and "unknown key 'unload_deadine_s' in [manager]" in err
    cfg.write_text('[[driver]]\nname = "x"\nchanels = 2\n')
    with pytest.raises(InvalidArgument, match="did you mean 'channels'"):
        Config.load(cfg)
    cfg.write_text("[metrix]\nlisten = ':0'\n")
    with pytest.raises(InvalidArgument, match="did you mean 'metrics'"):
        Config.load(cfg)
    cfg.write_text('[driver.options]\nanything = 1\n[[app]]\nuid = 5\nimportance = "cached"\n')
    cfg.write_text('[metrics]\nlisten = "127.0.0.1:0"\n[thermal]\nsources = []\n')
    assert Config.load(cfg).section("metrics")["listen"] == "127.0.0.1:0"


def test_run_builtin_models(npud_drivers: DaemonProcess,
                            capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rt = str(npud_drivers.runtime_dir)
    rc, out, err = npu(capsys, "run", "--builtin", "add", "--repeat", "3", "--runtime-dir", rt)
    assert rc == 0, err
    assert "y: shape (1, 4) float32" in out and "3 executions" in out
    # Sizes as people read them (was "1048656 bytes"): the reference driver's 1 MiB of
    # workspace and the weights.
    assert re.search(r"prepared in [0-9.]+ ms, 1\.0 MiB of device memory\n", out), out
    rc, out, err = npu(capsys, "--runtime-dir", rt, "run", "--builtin", "decode", "--steps",
                       "4", "--repeat", "1")
    assert rc == 0, err
    assert re.search(r"state_out: shape \(1, 64\) float32 \[[0-9.]+", out)
    model = tmp_path / "conv.onnx"
    rc, out, err = npu(capsys, "run", "--builtin", "conv", "--save", str(model))
    assert rc == 0 and re.fullmatch(rf"wrote conv to {model} \([0-9.]+ KiB\)\n", out), (out, err)
    rc, out, err = npu(capsys, "run", str(model), "--repeat", "1", "--runtime-dir", rt)
    assert rc == 0 and "scores: shape (1, 10)" in out, err


def test_driver_without_a_state_dir_is_reported_down(runtime_dir: Path, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]
                                                     ) -> None:
    """The state dir is fine for npud but the host's own dir under it cannot be made
    (here STATE/drivers is a file). npud, which makes that dir for the driver's user, says
    so in one line naming NPU_STATE_DIR; its ready line and `npu status` show the driver
    DOWN with that reason, and nobody prints a traceback."""
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    (state / "drivers").write_text("")
    env = dict(os.environ, NPU_STATE_DIR=str(state))
    with DaemonProcess(runtime_dir, drivers=True, env=env, ready_timeout=60) as d:
        assert d.ready_line is not None
        assert "reference (DOWN: cannot create its state dir" \
            in d.ready_line
        assert "NPU_STATE_DIR" in d.ready_line
        rc, out, _ = npu(capsys, "status", "--runtime-dir", str(runtime_dir), "--json")
        dev = json.loads(out)["devices"][0]
        assert dev["available"] is False and "NPU_STATE_DIR" in dev["down_reason"]
        rc, out, _ = npu(capsys, "status", "--runtime-dir", str(runtime_dir))
        assert rc == 0 and "DOWN: cannot create its state dir" in out
    assert "Traceback" not in d.output, d.output


def test_run_on_the_device_named(runtime_dir: Path, state_dir: Path,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    """`npu run --device NAME` asks npud for a grant on NAME (a grant is valid on its device
    only: asking for npud's first and preparing on the second was refused GrantRequired),
    and a name npud does not serve is a usage error naming the ones it does."""
    cfg = {"driver": [{"name": "ref", "plugin": "reference", "channels": 1,
                       "options": {"devices": ["a", "b"]}}]}
    env = dict(os.environ, NPU_STATE_DIR=str(state_dir))
    with DaemonProcess(runtime_dir, cfg, drivers=True, env=env, ready_timeout=60):
        rt = str(runtime_dir)
        rc, out, err = npu(capsys, "run", "--builtin", "add", "--repeat", "1", "--device",
                           "ref:b", "--runtime-dir", rt)
        assert rc == 0, err
        assert out.startswith("device ref:b ") and "1 execution:" in out, out
        rc, _, err = npu(capsys, "run", "--builtin", "add", "--device", "b", "--runtime-dir",
                         rt)
    assert rc == 2
    assert err == "npu run: --device b: npud serves no such device (devices: ref:a, ref:b)\n"


def test_serve_warns_of_a_misspelt_driver_option(runtime_dir: Path, state_dir: Path) -> None:
    """The plugin never reads an option it does not know: `npu serve` ran with the typo
    silently ignored, only `--check-config` named it. Now npud's log says so once."""
    cfg = {"driver": [{"name": "reference", "plugin": "reference",
                       "options": {"intra_op_thread": 2}}]}
    env = dict(os.environ, NPU_STATE_DIR=str(state_dir))
    with DaemonProcess(runtime_dir, cfg, drivers=True, env=env, ready_timeout=60) as d:
        pass
    said = [ln for ln in d.lines if "unknown option 'intra_op_thread'" in ln]
    assert len(said) == 1, d.output
    assert "warning driver[reference]" in said[0] and "[[driver]] 'reference' options:" \
        in said[0] and "did you mean 'intra_op_threads'?" in said[0], said


def test_a_plugin_that_is_not_installed_is_the_reason_it_is_down(
        runtime_dir: Path, state_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`npu status` said "DOWN: did not become ready"; the host's reason went to npud's
    log only."""
    cfg = {"driver": [{"name": "reference", "plugin": "nosuch"}]}
    env = dict(os.environ, NPU_STATE_DIR=str(state_dir))
    with DaemonProcess(runtime_dir, cfg, drivers=True, env=env, ready_timeout=60) as d:
        assert d.ready_line is not None
        assert "reference (DOWN: no driver plugin 'nosuch'" in d.ready_line, d.ready_line
        rc, out, _ = npu(capsys, "status", "--runtime-dir", str(runtime_dir), "--json")
    assert rc == 0
    dev = json.loads(out)["devices"][0]
    assert dev["available"] is False and dev["down_reason"].startswith(
        "no driver plugin 'nosuch' in entry-point group 'npumanager.drivers' (installed: "), dev


def test_a_non_admin_is_told_with_the_type_the_other_commands_use(npud: DaemonProcess) -> None:
    """`npu thermal override` as a non-admin says PermissionDenied; `npu trace` said a bare
    NpuError."""
    if os.getuid() != 0:
        pytest.skip("needs root to run as another uid")
    import subprocess
    import sys

    npu_bin = str(Path(sys.executable).with_name("npu"))
    rt = str(npud.runtime_dir)
    said = [subprocess.run([npu_bin, *argv, "--runtime-dir", rt], capture_output=True,
                           text=True, timeout=60, user=65534, group=65534)
            for argv in (["trace", "record", "--duration", "1", "-o", "/tmp/npu-trace-x.json"],
                         ["thermal", "override", "severe"])]
    assert [p.returncode for p in said] == [1, 1], said
    assert said[0].stderr.startswith("npu trace: PermissionDenied: npu trace needs admin rights")
    assert said[1].stderr.startswith("npu thermal: PermissionDenied: ")


def _identity_model(path: Path, value_info: Any, op: str = "Identity",
                    output: Any = None, **attrs: Any) -> Path:
    from onnx import ValueInfoProto, helper

    if output is None:  # Identity: the input's type, named y
        output = ValueInfoProto()
        output.CopyFrom(value_info)
        output.name = "y"
    g = helper.make_graph([helper.make_node(op, ["x"], ["y"], **attrs)], "g", [value_info],
                          [output])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    path.write_bytes(m.SerializeToString())
    return path


def test_run_feeds_strings_and_names_what_it_cannot_feed(
        npud_drivers: DaemonProcess, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A string input got integers (refused by the driver); a sequence input was a
    TypeError traceback in npu run; a sequence output an AttributeError one."""
    from onnx import TensorProto, helper

    rt = ["--runtime-dir", str(npud_drivers.runtime_dir), "--repeat", "1"]
    strings = _identity_model(tmp_path / "s.onnx", helper.make_tensor_value_info(
        "x", TensorProto.STRING, [2]))
    rc, out, err = npu(capsys, "run", str(strings), *rt)
    assert rc == 0 and re.search(r"y: shape \(2,\) object \[w\d+, w\d+\]", out), (out, err)
    seq_in = _identity_model(
        tmp_path / "q.onnx", helper.make_tensor_sequence_value_info("x", TensorProto.FLOAT, [2]),
        "SequenceLength", helper.make_tensor_value_info("y", TensorProto.INT64, []))
    rc, _, err = npu(capsys, "run", str(seq_in), *rt)
    assert (rc, err) == (1, "npu run: InvalidArgument: input 'x' is seq(tensor(float)[2]): "
                            "npu run feeds random tensors only; run this model from your "
                            "own code (nn)\n")
    seq_out = _identity_model(
        tmp_path / "o.onnx", helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 2]),
        "SplitToSequence", helper.make_tensor_sequence_value_info("y", TensorProto.FLOAT, [2]),
        keepdims=0)
    rc, out, err = npu(capsys, "run", str(seq_out), *rt)
    assert rc == 0 and "  y: a sequence of 3\n" in out, (out, err)


@pytest.mark.timeout(90)
def test_run_interrupted_says_what_ran(npud_drivers: DaemonProcess) -> None:
    """Ctrl-C during npu run's executions: exit 130, as the README says, with the timing of
    those that ran and how many of --repeat (it printed nothing of them)."""
    import signal
    import subprocess
    import sys

    proc = subprocess.Popen(
        [str(Path(sys.executable).with_name("npu")), "run", "--builtin", "add", "--repeat",
         "100000000", "--runtime-dir", str(npud_drivers.runtime_dir)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    first = proc.stdout.readline()  # "device ...; prepared ...": executing from here on
    assert first.startswith("device reference"), first
    time.sleep(1.0)  # some executions (0.1 ms each); none is said as such (below)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, (out, err)
    assert re.search(r"^(\d+ executions? of 100000000 \(interrupted\): p50 [\d.]+ ms|"
                     r"no execution \(interrupted\); unloaded)", out, re.M), (out, err)


def test_run_passes_bfloat16_and_float8_and_names_the_types_it_cannot(
        npud_drivers: DaemonProcess, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """An Identity model of bfloat16 or float8 failed inside ONNX Runtime's Python API
    ('ExecutionFailed: RuntimeError: Numpy_type 256 can't be converted to MLDataType'): the
    CPU provider runs them, ``session.run`` takes no ml_dtypes array. The reference driver
    passes them as OrtValues of their ONNX type (drivers/ort_values.py); the packed 4-bit
    types are refused at prepare naming the type and what is passed (was ONNX Runtime's
    'NOT_IMPLEMENTED : Could not find an implementation for Identity(21)')."""
    from onnx import TensorProto, helper

    def identity(name: str) -> Path:
        t = getattr(TensorProto, name.upper())
        g = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", t, [2, 3])],
                              [helper.make_tensor_value_info("y", t, [2, 3])])
        path = tmp_path / f"{name}.onnx"
        path.write_bytes(helper.make_model(
            g, opset_imports=[helper.make_opsetid("", 21)]).SerializeToString())
        return path

    rt = ["--runtime-dir", str(npud_drivers.runtime_dir), "--repeat", "2"]
    for onnx_name, dtype in (("bfloat16", "bfloat16"), ("float8e4m3fn", "float8_e4m3fn"),
                             ("float8e5m2fnuz", "float8_e5m2fnuz")):
        rc, out, err = npu(capsys, "run", str(identity(onnx_name)), *rt)
        assert rc == 0 and f"  y: shape (2, 3) {dtype} [" in out, (onnx_name, out, err)
        assert "2 executions: p50" in out
    rc, _, err = npu(capsys, "run", str(identity("int4")), *rt)
    assert rc == 1 and err.startswith(
        "npu run: InvalidArgument: the model's 'x' is int4: ONNX Runtime's Python API packs "
        "that type several elements to a byte"), err
    assert "bfloat16, float8_e4m3fn" in err


@pytest.mark.parametrize("body", [
    '[[app]]\nuid = 1000\nimportance = "bogus"\n',
    '[thermal]\ndevices = { "nosuch" = "zone:x" }\n',
], ids=["app", "thermal-devices"])
def test_a_config_npud_refuses_starts_no_driver_host(body: str, runtime_dir: Path,
                                                     state_dir: Path, tmp_path: Path) -> None:
    """npud refused these only once its driver hosts were up: they were left orphaned for
    orphan_grace_s, their 'npud went away' lines before npud's own one-line reason."""
    import subprocess
    import sys

    cfg = tmp_path / "npud.toml"
    cfg.write_text(body)
    npu_bin = str(Path(sys.executable).with_name("npu"))
    proc = subprocess.run([npu_bin, "serve", "--runtime-dir", str(runtime_dir), "--config",
                           str(cfg), "--protect-foreground", "off"], capture_output=True,
                          text=True, timeout=60, env=dict(os.environ, NPU_STATE_DIR=str(state_dir)))
    assert proc.returncode == 1, proc.stderr
    assert "driver[" not in proc.stderr and "driver reference" not in proc.stderr, proc.stderr
    assert proc.stderr.splitlines()[-1].startswith("npu serve: InvalidArgument: "), proc.stderr


def test_npuds_start_lines_read_as_words(npud: DaemonProcess) -> None:
    """Not a Python dict: "optional components: {'thermal_monitor': True, ...}"."""
    assert npud.count_output("optional components: thermal monitor on, process importance "
                             "off, [[app]] table off, unit identity off") == 1, npud.output


def test_npud_warns_of_importance_rules_it_does_not_read(runtime_dir: Path) -> None:
    cfg = {"importance": {"nice": [{"min": 3, "importance": "cached"}]}}
    with DaemonProcess(runtime_dir, cfg) as d:
        assert d.count_output("warning npumanager.npud: [importance] sets nice, which npud "
                              "reads only with from_process = true (it is false): they are "
                              "not used") == 1, d.output


def test_an_unknown_admin_group_is_said_once(runtime_dir: Path, state_dir: Path) -> None:
    """npud and each of its driver hosts said it ("only root is admin", three lines with a
    background lane, which was wrong too: npud's own uid is an admin as well)."""
    cfg = {"manager": {"admin_group": "npu-no-such-group"}}
    env = dict(os.environ, NPU_STATE_DIR=str(state_dir))
    with DaemonProcess(runtime_dir, cfg, drivers=True, env=env, ready_timeout=60,
                       protect_foreground="on") as d:
        assert d.wait_for_output("(background lane) is up", 30), d.output
    said = [ln for ln in d.lines if "npu-no-such-group" in ln]
    assert len(said) == 1 and said[0].endswith(
        "[manager] admin_group 'npu-no-such-group' does not exist: only root and npud's own "
        "uid are admins"), d.output
