"""What a driver host does to itself before it loads a plugin or takes a connection.

npud runs as root; a driver host runs as an unprivileged user (``[manager]
driver_user``: npud starts it that way, with no supplementary groups) and, on
top of that, before anything else:

* ``PR_SET_NO_NEW_PRIVS``: nothing it executes (a compiler AOTInductor runs, a
  helper a backend spawns) can gain privileges through setuid or file
  capabilities;
* ``PR_SET_DUMPABLE = 0``: other processes of the same user (``nobody`` is
  shared with other daemons) cannot ptrace it or read its memory (the cache
  map's key) through /proc;
* an empty working directory of its own (``STATE/drivers/NAME/cwd``, mode
  0500): a backend that resolves a relative path finds nothing there, and
  nobody can put anything there.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import stat
from pathlib import Path

from npumanager.errors import UnsafePath
from npumanager.paths import secure_dir

log = logging.getLogger("npumanager.drivers.sandbox")

PR_SET_DUMPABLE = 4
PR_SET_NO_NEW_PRIVS = 38


def _prctl(option: int, arg: int) -> None:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    if libc.prctl(option, ctypes.c_ulong(arg), ctypes.c_ulong(0), ctypes.c_ulong(0),
                  ctypes.c_ulong(0)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl({option}): {os.strerror(err)}")


def harden() -> None:
    """No new privileges for this process and its children, and not dumpable."""
    _prctl(PR_SET_NO_NEW_PRIVS, 1)
    _prctl(PR_SET_DUMPABLE, 0)
    if os.getuid() == 0:
        log.warning("driver host running as root: run it through npud (which starts it as "
                    "[manager] driver_user) or as an unprivileged user")


def enter_empty_dir(private: Path) -> Path:
    """``chdir`` into ``private/cwd``: created empty, mode 0500 (not even this user can
    add to it without a chmod); an existing one must be a real, empty directory of ours."""
    cwd = private / "cwd"
    try:
        st = os.lstat(cwd)
    except FileNotFoundError:
        os.mkdir(cwd, 0o500)
        st = os.lstat(cwd)
    secure_dir(cwd, "working dir")
    if stat.S_IMODE(st.st_mode) != 0o500:
        fd = os.open(cwd, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            os.fchmod(fd, 0o500)
        finally:
            os.close(fd)
    if os.listdir(cwd):
        raise UnsafePath(f"working dir {cwd} is not empty: a driver works in an empty "
                         "directory; remove what is in it")
    os.chdir(cwd)
    return cwd


def status() -> dict[str, str]:
    """This process's /proc status lines (Uid, Gid, Groups, NoNewPrivs, ...)."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            out[key] = value.strip()
    return out


__all__ = ["enter_empty_dir", "harden", "status"]
