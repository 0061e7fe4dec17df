"""Shared fixtures. Each test gets its own runtime dir; nothing uses fixed paths."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def runtime_dir() -> Iterator[Path]:
    """A fresh runtime dir under /tmp, traversable by other uids (pytest's tmp_path is 0700),
    short enough for Unix socket paths."""
    d = Path(tempfile.mkdtemp(prefix="npu-rt-", dir="/tmp"))
    os.chmod(d, 0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def state_dir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="npu-st-", dir="/tmp"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)
