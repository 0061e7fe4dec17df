"""Where sockets and private state live."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import platformdirs

from npumanager.errors import UnsafePath

MANAGER_SOCKET = "npu.sock"


def default_runtime_dir() -> Path:
    """``--runtime-dir``, else $NPU_RUNTIME_DIR, else /run/npu (root) or $XDG_RUNTIME_DIR/npu."""
    env = os.environ.get("NPU_RUNTIME_DIR")
    if env:
        return Path(env)
    if os.getuid() == 0:
        return Path("/run/npu")
    return Path(platformdirs.user_runtime_dir("npu", appauthor=False))


def system_runtime_dir() -> Path:
    """The default runtime dir, ignoring $NPU_RUNTIME_DIR: where the system's npud runs."""
    if os.getuid() == 0:
        return Path("/run/npu")
    return Path(platformdirs.user_runtime_dir("npu", appauthor=False))


def runtime_dir(explicit: str | os.PathLike[str] | None = None) -> Path:
    return Path(explicit) if explicit is not None else default_runtime_dir()


def manager_socket(rt: str | os.PathLike[str] | None = None) -> Path:
    return runtime_dir(rt) / MANAGER_SOCKET


def driver_socket(name: str, rt: str | os.PathLike[str] | None = None) -> Path:
    return runtime_dir(rt) / "drivers" / f"{name}.sock"


#: The one lane a device's second host process serves ([[driver]] background_host).
BACKGROUND_LANE = "background"


def lane_name(name: str, lane: str = "") -> str:
    """The socket and state-dir name of device ``name``'s host for ``lane`` ("": its main
    host, ``name`` itself; "background": ``NAME.background``)."""
    return f"{name}.{lane}" if lane else name


def lane_socket(device_socket: str | os.PathLike[str], lane: str = "") -> Path:
    """The socket of a device's ``lane`` host, next to its main socket (``NAME.sock``)."""
    path = Path(device_socket)
    if not lane:
        return path
    return path.with_name(lane_name(path.name.removesuffix(".sock"), lane) + ".sock")


def default_state_dir() -> Path:
    """Private state (cache maps): $NPU_STATE_DIR, /var/lib/npu as root, else the user's."""
    env = os.environ.get("NPU_STATE_DIR")
    if env:
        return Path(env)
    if os.getuid() == 0:
        return Path("/var/lib/npu")
    return Path(platformdirs.user_state_dir("npumanager", appauthor=False))


def secure_dir(path: str | os.PathLike[str], what: str, mode: int | None = None, *,
               parents: bool = True, owner: int | None = None) -> Path:
    """Create ``path`` (mode 0700), or accept it only if it is safe; return it.

    Safe: ``lstat`` shows a real directory (not a symlink), owned by this process's
    uid, that group and others cannot write. Anything else raises :class:`UnsafePath`
    naming the path and what is wrong: a directory another local user owns or can
    write lets that user replace the sockets or files in it (and receive what apps
    send there), and a symlink would make us chmod and bind wherever it points.

    ``mode``: set on the directory, through an fd opened ``O_DIRECTORY|O_NOFOLLOW``
    and checked to be the inode that was inspected (never chmod by path, which
    follows a symlink swapped in after the check); ``None`` leaves an accepted
    directory's mode as it is. ``what`` names the directory in messages
    ("runtime dir", "state dir", ...). Missing parents are created (mode 0755 less the
    umask) when ``parents``; only the last component is checked. ``owner``: the uid an
    existing directory must belong to (default: this process's)."""
    p = Path(path)
    uid = os.getuid() if owner is None else owner
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        if parents:
            p.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.mkdir(p, 0o700)  # private until the mode below is set through the fd
        except FileExistsError:
            pass  # created meanwhile: checked below like any existing one
        st = os.lstat(p)
    if stat.S_ISLNK(st.st_mode):
        try:
            target = f" (to {os.readlink(p)})"
        except OSError:
            target = ""
        raise UnsafePath(f"{what} {p} is a symlink{target}; it must be a real directory: "
                         f"remove the link (npumanager creates the directory itself)")
    try:
        fd = os.open(p, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except NotADirectoryError:
        raise UnsafePath(f"{what} {p} {not_a_directory(p)}") from None
    except OSError as exc:
        raise UnsafePath(f"{what} {p} cannot be opened: {exc.strerror}") from None
    try:
        fst = os.fstat(fd)
        if (fst.st_dev, fst.st_ino) != (st.st_dev, st.st_ino):
            raise UnsafePath(f"{what} {p} was replaced while it was being checked")
        problem = dir_problem(fst, uid)
        if problem:
            raise UnsafePath(f"{what} {p} {problem}")
        if mode is not None and stat.S_IMODE(fst.st_mode) != mode:
            os.fchmod(fd, mode)
    finally:
        os.close(fd)
    return p


def kind_of(path: str | os.PathLike[str]) -> str:
    """What is at ``path``, as a person names it ("a socket npud serves", "a file", ...;
    "" where nothing is). A socket is asked whether something answers on it."""
    try:
        st = os.lstat(path)
    except OSError:
        return ""
    if stat.S_ISDIR(st.st_mode):
        return "a directory"
    if stat.S_ISSOCK(st.st_mode):
        answers = _answers(path)
        if answers is None:
            return "a socket"
        if not answers:
            return "a socket nothing answers on"
        return ("a socket npud serves" if Path(path).name == MANAGER_SOCKET
                else "a socket something serves")
    if stat.S_ISLNK(st.st_mode):
        return "a symlink"
    if stat.S_ISREG(st.st_mode):
        return "a file"
    if stat.S_ISFIFO(st.st_mode):
        return "a named pipe"
    return "a device file"


def _answers(path: str | os.PathLike[str]) -> bool | None:
    """Whether a process accepts connections on the Unix socket ``path`` (connected and
    closed at once: npud takes a connection that sends nothing as a client that left);
    None where this process may not ask."""
    import socket

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(1.0)
        try:
            s.connect(os.fspath(path))
        except (ConnectionRefusedError, FileNotFoundError):
            return False
        except OSError:
            return None
    return True


def not_a_directory(path: str | os.PathLike[str]) -> str:
    """Why ``path``, given where a directory was wanted, is not one, and what to pass
    instead: the directory that holds it. A user who typed the socket's path for the
    runtime dir is told so; nothing here advises removing what may be a live npud's."""
    p = Path(path)
    kind = kind_of(p) or "not there"
    return (f"is {kind}, not a directory: pass the directory that holds it "
            f"({p.parent}) or another path")


def not_in_a_directory(path: str | os.PathLike[str]) -> str:
    """Why ``path`` cannot be reached (ENOTDIR): the part of it that is not a directory,
    said as :func:`not_a_directory` says it ("/x/npu.sock is a socket npud serves, ...")."""
    p = Path(path).parent
    while p != p.parent and not (os.path.lexists(p) and not os.path.isdir(p)):
        p = p.parent
    return f"{p} {not_a_directory(p)}"


def dir_problem(st: os.stat_result, uid: int) -> str:
    """What makes a directory with this stat unsafe for ``uid`` to serve from ("" if
    nothing)."""
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    if st.st_uid != uid:
        return (f"is owned by uid {st.st_uid}, not by uid {uid} that runs this service: "
                f"another user could replace what is in it; remove it or give it to uid {uid}")
    if st.st_mode & 0o022:
        who = {0o022: "group and others", 0o020: "group", 0o002: "others"}[st.st_mode & 0o022]
        return (f"is writable by {who} (mode {stat.S_IMODE(st.st_mode):04o}): other users "
                f"could replace what is in it; chmod go-w it")
    return ""


def driver_state_dir(name: str, state_root: str | os.PathLike[str] | None = None) -> Path:
    """A driver host's private state (its cache map, its working directory):
    ``STATE/drivers/NAME``, owned by the user the driver runs as, mode 0700."""
    if not name or "/" in name or name in (".", ".."):
        raise UnsafePath(f"bad driver name {name!r}")
    root = Path(state_root) if state_root is not None else default_state_dir()
    return root / "drivers" / name


def ensure_owned_dir(path: Path, what: str, uid: int, gid: int, mode: int) -> Path:
    """As npud: ``path`` (created if missing, parents too) owned by ``uid``:``gid`` with
    ``mode``, for a process that runs as that user. An existing directory is accepted if
    it already is that user's, or ours (then it is given to that user); anything else is
    refused as :func:`secure_dir` refuses it. Owner and mode are set through an
    ``O_NOFOLLOW`` fd of the inode that was checked."""
    me = os.getuid()
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise UnsafePath(f"{what} {path} is a symlink; it must be a real directory")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise UnsafePath(f"{what} {path} cannot be opened: {exc.strerror}") from None
    try:
        fst = os.fstat(fd)
        if (fst.st_dev, fst.st_ino) != (st.st_dev, st.st_ino):
            raise UnsafePath(f"{what} {path} was replaced while it was being checked")
        problem = dir_problem(fst, uid if fst.st_uid == uid else me)
        if problem:
            raise UnsafePath(f"{what} {path} {problem}")
        if (fst.st_uid, fst.st_gid) != (uid, gid):
            os.fchown(fd, uid, gid)
            if fst.st_uid == me != uid:
                # Ours until now (a host once run by hand as this user left its working
                # dir and cache map here): what is inside goes to that user too.
                _give_contents(fd, me, uid, gid, depth=2)
        if stat.S_IMODE(fst.st_mode) != mode:
            os.fchmod(fd, mode)
    finally:
        os.close(fd)
    return path


def _give_contents(dir_fd: int, me: int, uid: int, gid: int, depth: int) -> None:
    """Give ``uid``:``gid`` what in the directory ``dir_fd`` is ours: directories (down to
    ``depth`` levels) and regular files with a single link; never through a symlink.
    Only called on a directory nobody but us could write to until now."""
    for name in os.listdir(dir_fd):
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        if st.st_uid != me:
            continue
        if stat.S_ISREG(st.st_mode) and st.st_nlink == 1:
            os.chown(name, uid, gid, dir_fd=dir_fd, follow_symlinks=False)
        elif stat.S_ISDIR(st.st_mode) and depth > 0:
            sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                          dir_fd=dir_fd)
            try:
                os.fchown(sub, uid, gid)
                _give_contents(sub, me, uid, gid, depth - 1)
            finally:
                os.close(sub)


def ensure_traversable(path: Path, what: str) -> Path:
    """Let other users pass through ``path`` (ours, checked as :func:`secure_dir` does) to
    a directory of theirs inside it: adds ``--x--x`` only, never read or write."""
    secure_dir(path, what)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        mode = stat.S_IMODE(os.fstat(fd).st_mode)
        if mode & 0o011 != 0o011:
            os.fchmod(fd, mode | 0o011)
    finally:
        os.close(fd)
    return path


def ensure_private_dir(path: Path) -> Path:
    """Create ``path`` mode 0700 (narrowing an accepted one to 0700); see :func:`secure_dir`."""
    return secure_dir(path, "private dir", 0o700)


def ensure_state_dir(path: Path) -> Path:
    """The state root (``--state-dir``, $NPU_STATE_DIR, ...): created 0700; an existing one
    is accepted if safe, its mode kept."""
    return secure_dir(path, "state dir")


def ensure_runtime_dir(path: Path) -> Path:
    """Create the runtime dir and its ``drivers/`` traversable by all (sockets decide per
    call), refusing unsafe ones (see :func:`secure_dir`)."""
    secure_dir(path, "runtime dir", 0o755)
    ensure_drivers_dir(path)
    return path


def ensure_drivers_dir(rt: Path) -> Path:
    """``RT/drivers``, where driver hosts bind their sockets (see :func:`secure_dir`)."""
    return secure_dir(rt / "drivers", "drivers dir", 0o755)
