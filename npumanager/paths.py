"""Where sockets and private state live."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

MANAGER_SOCKET = "npu.sock"


def default_runtime_dir() -> Path:
    """``--runtime-dir``, else $NPU_RUNTIME_DIR, else /run/npu (root) or $XDG_RUNTIME_DIR/npu."""
    env = os.environ.get("NPU_RUNTIME_DIR")
    if env:
        return Path(env)
    if os.getuid() == 0:
        return Path("/run/npu")
    return Path(platformdirs.user_runtime_dir("npu", appauthor=False))


def runtime_dir(explicit: str | os.PathLike[str] | None = None) -> Path:
    return Path(explicit) if explicit is not None else default_runtime_dir()


def manager_socket(rt: str | os.PathLike[str] | None = None) -> Path:
    return runtime_dir(rt) / MANAGER_SOCKET


def driver_socket(name: str, rt: str | os.PathLike[str] | None = None) -> Path:
    return runtime_dir(rt) / "drivers" / f"{name}.sock"


def default_state_dir() -> Path:
    """Private state (cache maps): $NPU_STATE_DIR, /var/lib/npu as root, else the user's."""
    env = os.environ.get("NPU_STATE_DIR")
    if env:
        return Path(env)
    if os.getuid() == 0:
        return Path("/var/lib/npu")
    return Path(platformdirs.user_state_dir("npumanager", appauthor=False))


def ensure_private_dir(path: Path) -> Path:
    """Create ``path`` mode 0700 (and fix the mode if it exists wider)."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(path, 0o700)
    return path


def ensure_runtime_dir(path: Path) -> Path:
    """Create the runtime dir traversable by all (sockets decide per call)."""
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, 0o755)
    (path / "drivers").mkdir(exist_ok=True)
    os.chmod(path / "drivers", 0o755)
    return path
