"""Helpers for CLI tests: run the real `npu` entry point in-process, or as a process."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from npumanager.cli.main import main
from npumanager.testing.daemon import DaemonProcess


def npu(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """main(argv) as the console script runs it: (exit status, stdout, stderr)."""
    try:
        rc = main(list(argv))
    except SystemExit as exc:  # argparse's own usage errors and --help
        rc = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    return rc, out, err


def npu_process(*argv: str, env: dict[str, str] | None = None,
                **kw: object) -> subprocess.CompletedProcess[str]:
    """The `npu` console script in a process of its own."""
    exe = Path(sys.executable).with_name("npu")
    kw.setdefault("stdout", subprocess.PIPE)
    return subprocess.run([str(exe), *argv], stderr=subprocess.PIPE, text=True, timeout=60,
                          env=dict(os.environ, **(env or {})), **kw)  # type: ignore[call-overload]


@pytest.fixture
def npud(runtime_dir: Path) -> Iterator[DaemonProcess]:
    """A real npud without drivers (fast); the manager side of every command."""
    with DaemonProcess(runtime_dir, {"manager": {"unload_deadline_s": 30.0}}) as d:
        yield d


@pytest.fixture
def npud_drivers(runtime_dir: Path, state_dir: Path) -> Iterator[DaemonProcess]:
    env = dict(os.environ, NPU_STATE_DIR=str(state_dir))
    with DaemonProcess(runtime_dir, drivers=True, env=env, ready_timeout=60) as d:
        yield d
