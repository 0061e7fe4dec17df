"""How npud starts a driver host: as which user, in which directories, with which socket.

npud alone runs as root. A driver host runs models that apps send, so it runs
as an unprivileged user: ``[manager] driver_user`` (default ``npu`` when that
user exists, else ``nobody``), with its primary group only (no supplementary
groups; ``npu driver --run-as`` drops them and the ids before anything else),
umask 077, ``HOME`` in its private state dir and ``python -P`` (its working
directory never lands on ``sys.path``). Not root, npud starts drivers
as its own user the same way. The design, so that everything stays
owned by whom it must be:

* ``RT/drivers/`` stays npud's (0755, checked by lstat): the driver's user
  cannot write there, so it cannot replace another driver's socket. npud binds
  ``RT/drivers/NAME.sock`` itself (mode ``socket_mode``) and passes the
  listening socket to the host (``--listen-fd``); its own copy is closed once
  the host has it, so a dead host refuses connections as before.
* ``STATE/drivers/NAME`` is the host's private state (its cache map, its empty
  working directory): owned by the driver's user, 0700, made by npud. npud lets
  others pass through ``STATE`` and ``STATE/drivers`` (``--x`` only) to reach it.
"""

from __future__ import annotations

import logging
import os
import pwd
import socket
from dataclasses import dataclass, field
from pathlib import Path

from npumanager.errors import UnsafePath
from npumanager.paths import (
    driver_state_dir,
    ensure_owned_dir,
    ensure_traversable,
    secure_dir,
)
from npumanager.wire.unix import make_unix_listener

log = logging.getLogger("npumanager.service.driver_launch")

#: Tried in this order when ``[manager] driver_user`` is empty.
DEFAULT_USERS = ("npu", "nobody")


@dataclass(frozen=True)
class DriverUser:
    name: str
    uid: int
    gid: int

    @property
    def is_self(self) -> bool:
        return self.uid == os.getuid()


def driver_user(configured: str) -> DriverUser:
    """The user driver hosts run as. Not root: this process's user. Root: ``configured``
    (a name or a number), or the first of :data:`DEFAULT_USERS` that exists. LookupError
    names a configured user that does not exist."""
    if os.getuid() != 0:
        me = os.getuid()
        try:
            name = pwd.getpwuid(me).pw_name
        except KeyError:
            name = str(me)
        return DriverUser(name, me, os.getgid())
    candidates = [configured] if configured else list(DEFAULT_USERS)
    for cand in candidates:
        try:
            entry = pwd.getpwuid(int(cand)) if cand.isdigit() else pwd.getpwnam(cand)
        except (KeyError, ValueError):
            continue
        if entry.pw_uid == 0:
            log.warning("[manager] driver_user is root: drivers run with npud's privileges")
        return DriverUser(entry.pw_name, entry.pw_uid, entry.pw_gid)
    if configured:
        raise LookupError(f"[manager] driver_user {configured!r} does not exist")
    return DriverUser("nobody", 65534, 65534)  # no passwd entry at all: the kernel's


@dataclass
class DriverLaunch:
    """One start of one driver host: how to spawn it and what to hand it."""

    user: DriverUser
    state: Path
    sock: socket.socket
    path: Path
    env: dict[str, str] = field(default_factory=dict)

    def args(self) -> list[str]:
        """What ``npu driver`` is told: the socket, its manager, and (as root) the user to
        become before it does anything else (the host drops its groups and ids itself:
        uvloop's spawn has no user/group arguments, and a preexec hook in a threaded
        daemon is unsafe)."""
        out = ["--listen-fd", str(self.sock.fileno()), "--manager-uid", str(os.getuid())]
        if os.getuid() == 0 and not self.user.is_self:
            out += ["--run-as", f"{self.user.uid}:{self.user.gid}"]
        return out

    def spawn_kwargs(self) -> dict[str, object]:
        """For ``asyncio.create_subprocess_exec``."""
        # "/": the host enters its private dir itself once it is its user (npud, under
        # the unit's capability set, has no DAC override to enter that user's 0700 dir).
        return {"pass_fds": (self.sock.fileno(),), "cwd": "/", "env": self.env}

    def close(self) -> None:
        """npud's copy of the listening socket (the host has its own)."""
        self.sock.close()

    def remove_socket(self) -> None:
        """The host is gone: remove the socket file, unless another has been bound there
        since (compared by inode)."""
        try:
            st = os.lstat(self.path)
            if (st.st_dev, st.st_ino) == self._bound:
                os.unlink(self.path)
        except FileNotFoundError:
            pass

    def __post_init__(self) -> None:
        st = os.lstat(self.path)
        self._bound = (st.st_dev, st.st_ino)


def prepare_launch(name: str, user: DriverUser, state_root: Path, runtime_dir: Path,
                   socket_mode: int) -> DriverLaunch:
    """The directories and the socket a driver host starts with (see the module
    docstring); UnsafePath/OSError if they cannot be made safely."""
    if not user.is_self:
        # Others pass through to the driver's own directory (--x: nothing to list).
        ensure_traversable(state_root, "state dir")
        secure_dir(state_root / "drivers", "drivers state dir", 0o711)
    else:
        secure_dir(state_root / "drivers", "drivers state dir")
    state = ensure_owned_dir(driver_state_dir(name, state_root), "driver state dir",
                             user.uid, user.gid, 0o700)
    path = runtime_dir / "drivers" / f"{name}.sock"
    sock = make_unix_listener(str(path), socket_mode)
    env = dict(os.environ)
    env["HOME"] = str(state)
    for key in ("XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_RUNTIME_DIR"):
        env.pop(key, None)  # npud's own (root's) directories
    return DriverLaunch(user, state, sock, path, env)


__all__ = ["DEFAULT_USERS", "DriverLaunch", "DriverUser", "UnsafePath", "driver_user",
           "prepare_launch"]
