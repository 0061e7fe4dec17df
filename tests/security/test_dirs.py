"""Attack 4: a runtime, drivers or state directory another local user controls.

An attacker who owns (or can write) the runtime dir can replace npu.sock or
drivers/*.sock and receive every app's hello, models, tensors and cache fds; a
`drivers` symlink made npud chmod its target 0755 and bind there. npud and the
driver host now accept a directory only if lstat shows a real directory owned
by their uid that nobody else can write, set modes through an O_NOFOLLOW fd,
and otherwise exit 1 naming the path and what is wrong."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from npumanager.errors import UnsafePath
from npumanager.paths import ensure_private_dir, ensure_runtime_dir, secure_dir
from tests.security.conftest import StartDaemon
from tests.security.harness import (
    ATTACKER,
    assert_served,
    needs_root,
)

pytestmark = needs_root


@pytest.fixture
def scratch() -> Iterator[Path]:
    """A root-owned 0755 directory to build attacker-controlled layouts in."""
    d = Path(tempfile.mkdtemp(prefix="npu-sec-", dir="/tmp"))
    os.chmod(d, 0o755)
    try:
        yield d
    finally:
        subprocess.run(["rm", "-rf", str(d)], check=False)


def npu(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "npumanager", *args], capture_output=True,
                          text=True, timeout=60, env=env, stdin=subprocess.DEVNULL)


def serve_refused(rt: Path, *, want: str, drivers: bool = False,
                  env: dict[str, str] | None = None) -> str:
    """`npu serve` on ``rt`` exits 1 at once with a message naming the path."""
    args = ["serve", "--runtime-dir", str(rt)] + ([] if drivers else ["--no-drivers"])
    r = npu(*args, env=env)
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    assert "ready" not in r.stdout
    assert "UnsafePath" in r.stderr and want in r.stderr, r.stderr
    return r.stderr


def test_runtime_dir_owned_by_another_user_is_refused(
        scratch: Path, start_npud: StartDaemon, runtime_dir: Path) -> None:
    rt = scratch / "npu"
    rt.mkdir(mode=0o755)
    os.chown(rt, ATTACKER, ATTACKER)
    fake = rt / "npu.sock"  # the attacker's own listener, waiting for hellos
    err = serve_refused(rt, want=f"runtime dir {rt} is owned by uid {ATTACKER}")
    assert "not by uid 0" in err
    assert os.lstat(rt).st_uid == ATTACKER and not fake.exists()  # untouched, nothing bound
    start_npud()  # on a safe dir, the other user's app is served
    assert_served(runtime_dir)


def test_drivers_symlink_to_a_root_only_dir_is_refused(scratch: Path) -> None:
    secret = scratch / "root-only"
    secret.mkdir(mode=0o700)
    rt = scratch / "rt"
    rt.mkdir(mode=0o755)
    (rt / "drivers").symlink_to(secret)
    serve_refused(rt, want=f"drivers dir {rt / 'drivers'} is a symlink (to {secret})")
    assert (os.stat(secret).st_mode & 0o777) == 0o700, "npud chmodded the link's target"
    assert list(secret.iterdir()) == []
    # The driver host checks the same way before it binds.
    r = npu("driver", "reference", "--runtime-dir", str(rt), "--no-enforce-admission",
            "--state-dir", str(scratch / "state"))
    assert r.returncode == 1 and "is a symlink" in r.stderr, r.stderr
    assert list(secret.iterdir()) == []


def test_runtime_dir_symlink_is_refused(scratch: Path) -> None:
    target = scratch / "elsewhere"
    target.mkdir(mode=0o700)
    rt = scratch / "rt"
    rt.symlink_to(target)
    serve_refused(rt, want=f"runtime dir {rt} is a symlink")
    assert (os.stat(target).st_mode & 0o777) == 0o700


@pytest.mark.parametrize("mode", [0o777, 0o775, 0o757, 0o1777])
def test_group_or_other_writable_runtime_dir_is_refused(scratch: Path, mode: int) -> None:
    rt = scratch / "rt"
    rt.mkdir()
    os.chmod(rt, mode)
    serve_refused(rt, want=f"runtime dir {rt} is writable by")
    assert os.stat(rt).st_mode & 0o7777 == mode  # refused, not silently "fixed"


def test_writable_or_foreign_drivers_dir_is_refused(scratch: Path) -> None:
    rt = scratch / "rt"
    (rt / "drivers").mkdir(parents=True)
    os.chmod(rt, 0o755)
    os.chmod(rt / "drivers", 0o777)
    serve_refused(rt, want=f"drivers dir {rt / 'drivers'} is writable by group and others")
    os.chmod(rt / "drivers", 0o755)
    os.chown(rt / "drivers", ATTACKER, ATTACKER)
    serve_refused(rt, want=f"drivers dir {rt / 'drivers'} is owned by uid {ATTACKER}")


def test_unsafe_state_dir_is_refused_by_npud_and_the_driver_host(
        scratch: Path, start_npud: StartDaemon, runtime_dir: Path) -> None:
    state = scratch / "state"
    state.mkdir(mode=0o755)
    os.chown(state, ATTACKER, ATTACKER)
    env = dict(os.environ, NPU_STATE_DIR=str(state))
    rt = scratch / "rt"
    serve_refused(rt, drivers=True, env=env, want=f"state dir {state} is owned by uid {ATTACKER}")
    # The driver host's private dir under a safe root, pre-created by the attacker.
    os.chown(state, 0, 0)
    mine = state / "drivers" / "reference"
    mine.mkdir(parents=True)
    os.chown(mine, ATTACKER, ATTACKER)
    r = npu("driver", "reference", "--runtime-dir", str(rt), "--no-enforce-admission",
            "--state-dir", str(state))
    assert r.returncode == 1 and f"{mine} is owned by uid {ATTACKER}" in r.stderr, r.stderr
    start_npud()
    assert_served(runtime_dir)


def test_safe_dirs_are_created_and_modes_set_through_the_fd(scratch: Path) -> None:
    rt = ensure_runtime_dir(scratch / "a" / "rt")
    assert os.stat(rt).st_mode & 0o777 == 0o755
    assert os.stat(rt / "drivers").st_mode & 0o777 == 0o755
    os.chmod(rt, 0o700)  # an accepted dir gets the mode it needs
    ensure_runtime_dir(rt)
    assert os.stat(rt).st_mode & 0o777 == 0o755
    private = ensure_private_dir(scratch / "p")
    assert os.stat(private).st_mode & 0o777 == 0o700
    os.chmod(private, 0o755)
    ensure_private_dir(private)
    assert os.stat(private).st_mode & 0o777 == 0o700
    f = scratch / "file"
    f.write_text("")
    with pytest.raises(UnsafePath, match="is a file, not a directory: pass the directory "
                       "that holds it"):
        secure_dir(f, "state dir")
