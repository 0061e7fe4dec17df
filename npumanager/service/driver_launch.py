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
* ``npumanager-bg.PID.NAME`` in the cgroup-v1 cpu hierarchy (``background_cgroup =
  "auto"``, as root): the cpu.idle group of the host's background threads, root's, its
  ``tasks`` and ``cgroup.procs`` handed to the driver's user (hal/idle_cgroup.py); its
  path reaches the host in its host config. Removed when the host is gone.
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
from npumanager.hal import idle_cgroup
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
    """One start of one driver host: how to spawn it and what to hand it. A host serving
    several devices gets one listening socket per device (``socks``/``paths``, in its
    devices' order; ``sock``/``path`` are the first)."""

    user: DriverUser
    state: Path
    sock: socket.socket
    path: Path
    env: dict[str, str] = field(default_factory=dict)
    #: Every device's listening socket and path, the first included.
    socks: list[socket.socket] = field(default_factory=list)
    paths: list[Path] = field(default_factory=list)
    #: The cpu.idle cgroup of the host's background threads (None: none).
    bg_group: Path | None = None

    def args(self) -> list[str]:
        """What ``npu driver`` is told: the sockets, its manager, and (as root) the user to
        become before it does anything else (the host drops its groups and ids itself:
        uvloop's spawn has no user/group arguments, and a preexec hook in a threaded
        daemon is unsafe)."""
        out: list[str] = []
        for s in self.socks:
            out += ["--listen-fd", str(s.fileno())]
        out += ["--manager-uid", str(os.getuid())]
        if os.getuid() == 0 and not self.user.is_self:
            out += ["--run-as", f"{self.user.uid}:{self.user.gid}"]
        return out

    def spawn_kwargs(self) -> dict[str, object]:
        """For ``asyncio.create_subprocess_exec``."""
        # "/": the host enters its private dir itself once it is its user (npud, under
        # the unit's capability set, has no DAC override to enter that user's 0700 dir).
        return {"pass_fds": tuple(s.fileno() for s in self.socks), "cwd": "/",
                "env": self.env}

    def close(self) -> None:
        """npud's copies of the listening sockets (the host has its own)."""
        for s in self.socks:
            s.close()

    def remove_socket(self) -> None:
        """The host is gone: remove the socket files, unless another has been bound there
        since (compared by inode), and its background group (once empty)."""
        if self.bg_group is not None:
            idle_cgroup.remove(self.bg_group)
        for path, bound in zip(self.paths, self._bound, strict=True):
            try:
                st = os.lstat(path)
                if (st.st_dev, st.st_ino) == bound:
                    os.unlink(path)
            except FileNotFoundError:
                pass

    def __post_init__(self) -> None:
        if not self.socks:
            self.socks, self.paths = [self.sock], [self.path]
        self._bound = []
        for path in self.paths:
            st = os.lstat(path)
            self._bound.append((st.st_dev, st.st_ino))


#: Why a background group could not be made, each logged once per npud.
_CGROUP_WARNED: set[str] = set()


def background_group(host: str, user: DriverUser, *, wanted: bool) -> Path | None:
    """The cpu.idle group of ``host``'s background threads (hal/idle_cgroup.py), when
    ``wanted`` and npud may make one (root, a cgroup-v1 cpu hierarchy with cpu.idle);
    else None, and the reason logged once: the threads stay at SCHED_IDLE only."""
    if not wanted:
        return None
    if os.geteuid() != 0:
        reason = "npud is not root"
    else:
        try:
            return idle_cgroup.create(host, user.uid, user.gid)
        except OSError as exc:
            reason = str(exc)
    if reason not in _CGROUP_WARNED:
        _CGROUP_WARNED.add(reason)
        log.info("background threads stay at SCHED_IDLE only, without a cpu.idle cgroup: %s",
                 reason)
    return None


def prepare_launch(name: str | list[str], user: DriverUser, state_root: Path,
                   runtime_dir: Path, socket_mode: int, *,
                   background_cgroup: bool = False) -> DriverLaunch:
    """The directories and the sockets a driver host starts with (see the module
    docstring): ``name``, or each device name of a host serving several (each its own
    state dir and socket; the host works in the first's); UnsafePath/OSError if they
    cannot be made safely."""
    names = [name] if isinstance(name, str) else list(name)
    if not user.is_self:
        # Others pass through to the driver's own directory (--x: nothing to list).
        ensure_traversable(state_root, "state dir")
        secure_dir(state_root / "drivers", "drivers state dir", 0o711)
    else:
        secure_dir(state_root / "drivers", "drivers state dir")
    states = [ensure_owned_dir(driver_state_dir(n, state_root), "driver state dir",
                               user.uid, user.gid, 0o700) for n in names]
    paths = [runtime_dir / "drivers" / f"{n}.sock" for n in names]
    socks: list[socket.socket] = []
    try:
        for path in paths:
            socks.append(make_unix_listener(str(path), socket_mode))
    except BaseException:
        for s, path in zip(socks, paths, strict=False):
            s.close()
            path.unlink(missing_ok=True)
        raise
    env = dict(os.environ)
    env["HOME"] = str(states[0])
    for key in ("XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_RUNTIME_DIR"):
        env.pop(key, None)  # npud's own (root's) directories
    host = names[0].split(":", 1)[0] if len(names) > 1 else names[0]
    group = background_group(host, user, wanted=background_cgroup)
    return DriverLaunch(user, states[0], socks[0], paths[0], env, socks, paths, group)


__all__ = ["DEFAULT_USERS", "DriverLaunch", "DriverUser", "UnsafePath", "driver_user",
           "prepare_launch"]
