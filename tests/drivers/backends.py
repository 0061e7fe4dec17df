"""What the openvino and torch driver tests share: skips, factories, a warm compiler dir."""

from __future__ import annotations

import importlib.util
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest

from npumanager.drivers.base import Driver

HAS_OPENVINO = importlib.util.find_spec("openvino") is not None
HAS_TORCH = importlib.util.find_spec("torch") is not None

needs_openvino = pytest.mark.skipif(
    not HAS_OPENVINO,
    reason="the openvino extra is not installed (pip install 'npumanager[openvino]')")
needs_torch = pytest.mark.skipif(
    not HAS_TORCH, reason="the torch extra is not installed (pip install 'npumanager[torch]')")


def make_openvino(options: dict[str, Any]) -> Driver:
    from npumanager.drivers.openvino import OpenVinoDriver

    return OpenVinoDriver(options)


def make_torch(options: dict[str, Any]) -> Driver:
    from npumanager.drivers.torch_aot import TorchAotDriver

    return TorchAotDriver(options)


def inductor_dir(uid: int | None = None, gid: int | None = None) -> Path:
    """One private folder for AOTInductor's precompiled headers, shared by every torch test
    and test run of a uid (building them is most of a first compile): this process's, or
    (as root) ``uid``'s, e.g. the user npud runs its drivers as."""
    uid = os.getuid() if uid is None else uid
    d = Path(tempfile.gettempdir()) / f"npu-test-inductor-{uid}"
    d.mkdir(mode=0o700, exist_ok=True)
    st = os.lstat(d)
    if st.st_uid != uid and st.st_uid == os.getuid() and uid != os.getuid():
        os.chown(d, uid, uid if gid is None else gid)
        st = os.lstat(d)
    assert st.st_uid == uid and not st.st_mode & 0o077, f"{d} is not private"
    return d
