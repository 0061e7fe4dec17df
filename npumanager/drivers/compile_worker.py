"""Background compiles in a process of their own, at the background's priority.

Why a process and not a lowered thread: a BACKGROUND model's compile on the
driver's own (SCHED_IDLE or niced) thread still runs Python, and Python holds
the GIL. Compiling the contention bench's 32 MiB LLM step model in the driver
parses the ONNX protobuf twice (the external-data check and ONNX Runtime's
binding: about 17 ms each, GIL held throughout) before ONNX Runtime optimizes
it; a lowered thread that holds the GIL and is then preempted by the camera's
own process is a priority inversion: the thread that serves the camera's next
execution (a burst thread, the event loop) waits for a thread the kernel is
not running. Measured with bench/contention.py (camera p99 while a background
model loads: 11.4 ms here against 36.1 ms on a lowered thread of the host, the
same run): :mod:`.classes` has the numbers.

So a BACKGROUND prepare of a self-contained ONNX model (no external data files
sent, eager compile) goes to :class:`CompileWorker`: a child process of the
driver host, started on first use, lowered as a whole (SCHED_IDLE or nice, the
host's ``background_sched``), which parses, checks (no external-data reference:
it has no files), optimizes with ONNX Runtime and writes the optimized model
exactly as the compilation cache stores it (``optimized_model_filepath``,
weights in a separate blob: :func:`~.reference_cache.compile_with_artifacts`).
The driver then loads those blobs through the cache's loader
(:func:`~.reference_cache.session_from_artifacts`): a small protobuf, weights
handed over from memory, graph optimizations off. The driver never reads the
client's model memfd (it goes on to the worker as it came) and reads the
weights back with ``preadv`` into fresh memory: no copy of them under the GIL.

Security: the worker runs as the driver host's (unprivileged) user, inherits
its no-new-privileges and empty working dir, opens nothing an app named (it
gets the model's bytes in a memfd and has no files to resolve references
against: any reference is an InvalidArgument, as :func:`~.external_data.bind`
says), and the driver treats what it returns like cache bytes: the same loader
that refuses external-data references other than its own blob and parses only
protobuf. A worker that dies mid-compile is a GeneralFailure for that prepare
(not retried: the same bytes would kill the next one too); a worker that is
found dead before a request is started again.

Wire (a SOCK_SEQPACKET socketpair, one request at a time): request = JSON
``{"size", "level", "threads", "n_model", "n_data", "max_bytes"}`` plus a memfd
of the ONNX bytes; a receipt (one byte) at once; then the reply = JSON
``{"ok": true, "model": [lens], "data": [lens]}`` plus one memfd with the model
blobs then the data blobs, or ``{"ok": false, "type": "InvalidArgument" |
"GeneralFailure", "error": text}``.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any

import numpy as np

from npumanager.drivers.compile_starve import (
    CompileRaiser,
    CompileStarve,
    can_raise,
    process_cpu_s,
    set_process_sched,
)
from npumanager.errors import GeneralFailure, InvalidArgument
from npumanager.hal.idle_cgroup import IdleGroup
from npumanager.hal.malloc_tune import KEEP_IDLE_S, set_mmap_threshold, trim, tunables_env
from npumanager.hal.sched_slice import set_slice

log = logging.getLogger("npumanager.drivers.compile_worker")

_MAX_MSG = 1 << 16
#: The worker's first answer to a request: it has it (a hang-up after this is its death
#: during the compile, not before).
_RECEIPT = b"R"
#: Initializers below this stay inside the model blob: shape tensors (a Reshape's shape,
#: a Slice's starts) given from memory defeat ONNX Runtime's shape inference when it
#: loads the blob ("Cannot parse data from external tensors"); weights are far larger.
MIN_EXTERNAL_BYTES = 1024


def _read_fd(fd: int, offset: int, size: int, what: str) -> memoryview:
    """``size`` bytes of ``fd`` from ``offset``, read by the kernel straight into fresh
    memory (``preadv`` into an uninitialized numpy buffer): the GIL is released for the
    whole copy, and Python copies nothing. (A 32 MiB model read into ``bytes`` chunks and
    joined held the GIL for milliseconds: py-spy --gil showed it as the driver's main GIL
    holder while a background model loaded.) GeneralFailure on a short read."""
    buf = np.empty(size, np.uint8)
    view = memoryview(buf.data)
    pos = 0
    while pos < size:
        n = os.preadv(fd, [view[pos:pos + (64 << 20)]], offset + pos)
        if n <= 0:
            raise GeneralFailure(f"{what} holds {pos} bytes, not {size}")
        pos += n
    return view


def _memfd_with(parts: list[bytes], name: str) -> int:
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    try:
        for part in parts:
            view = memoryview(part)
            while view:
                n = os.write(fd, view)
                view = view[n:]
    except BaseException:
        os.close(fd)
        raise
    return fd


class CompileWorker:
    """The driver's side: one child process, started on first use, one compile at a time.

    ``sched``/``nice``: how the child lowers itself (:func:`~.bg_threads.lower_this_thread`'s
    meanings, for the whole process)."""

    def __init__(self, name: str, sched: str, nice: int, starve_ms: int = 0,
                 idle_group: IdleGroup | None = None, mmap_threshold_kb: int = 0,
                 slice_us: int = 0, malloc: str = "default",
                 cpus: set[int] | None = None, raiser: CompileRaiser | None = None) -> None:
        self.name = name
        #: The child's threads' EEVDF slice, set before it lowers itself (0: inherited).
        self.slice_us = slice_us
        #: glibc's tunables for the child (``compile_malloc``: hal/malloc_tune.py).
        self.env = tunables_env(malloc, dict(os.environ))
        #: The CPUs every thread of the child runs on (``load_cpus``; None: all).
        self.cpus = sorted(cpus) if cpus else []
        #: How long the child waits idle before it gives kept memory back (0: never).
        self.trim_s = KEEP_IDLE_S if malloc.startswith("keep") else 0.0
        #: glibc's mmap threshold for the child, KiB (hal/malloc_tune.py; 0: glibc's own):
        #: each compile maps and frees model-sized buffers, which a sliding threshold
        #: would keep in the child's heap between compiles (80-112 MiB vs 40 measured).
        self.mmap_threshold_kb = mmap_threshold_kb
        #: The host's cpu.idle cgroup: the child joins it where its bound is off.
        self.idle_group = idle_group
        self.sched = sched
        self.nice = nice
        #: The starvation bound of a compile at SCHED_IDLE (:mod:`.compile_starve`): off
        #: when 0, when the child is not lowered to idle, or when the rlimit forbids the
        #: host to raise it and there is no ``raiser`` to ask npud.
        self.starve = CompileStarve(starve_ms / 1000.0 if sched == "idle" else 0.0)
        #: How a starved child is raised: by the host itself, or by npud on its request.
        self.raiser = raiser
        if self.starve.starve_s > 0 and not can_raise() and raiser is None:
            log.info("%s: RLIMIT_NICE keeps the compile child at SCHED_IDLE (no starvation "
                     "bound for background prepares)", name)
            self.starve.starve_s = 0.0
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._sock: socket.socket | None = None
        self.started = 0  # children started so far (tests, stats)
        #: Whether the child is stopped (``hold``); its own lock: ``_lock`` is held for a
        #: whole compile, and the hold comes from the loop or a burst thread meanwhile.
        self._hold_lock = threading.Lock()
        self.stopped = False
        self.stops = 0  # SIGSTOPs sent (tests, stats)
        #: Set by :meth:`kill`: no child is started any more.
        self.closing = False

    def hold(self, stop: bool) -> None:
        """Stop (SIGSTOP) or continue (SIGCONT) the child: the quiet window around
        foreground frames for a compile (.load_hold). The state bounds each stop and
        continues the child after it."""
        with self._hold_lock:
            if stop == self.stopped:
                return
            self.stopped = stop
            proc = self._proc
            if proc is None or proc.returncode is not None:
                return
            try:
                os.kill(proc.pid, signal.SIGSTOP if stop else signal.SIGCONT)
            except ProcessLookupError:
                return
            if stop:
                self.stops += 1

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def _start(self) -> None:
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            argv = [sys.executable, *(["-P"] if sys.flags.safe_path else []), "-m",
                    "npumanager.drivers.compile_worker", str(child.fileno()), self.sched,
                    str(self.nice), str(self.mmap_threshold_kb), str(self.slice_us),
                    ",".join(map(str, self.cpus)), str(self.trim_s)]
            proc = subprocess.Popen(argv, pass_fds=[child.fileno()], env=self.env,
                                    stdin=subprocess.DEVNULL, close_fds=True)
            if self.idle_group is not None:
                # Every thread it has (its own, numpy's): it cannot be taken out again,
                # so only where the starvation bound can never raise it.
                self.idle_group.join_process(proc.pid, can_raise=self.starve.starve_s > 0)
            with self._hold_lock:
                self._proc = proc
                if self.stopped:  # started during a hold: it waits for the continue too
                    os.kill(proc.pid, signal.SIGSTOP)
        except BaseException:
            parent.close()
            raise
        finally:
            child.close()
        self._sock = parent
        self.started += 1
        # The starvation watch starts with the child, not with its receipt: lowered from
        # its first instruction, it imports ONNX Runtime and reads the request at
        # SCHED_IDLE before it answers, and a busy machine can hold that off for good.
        self._begin_watch()

    def _begin_watch(self) -> None:
        """The child's wait (compile_starve.py) counts from now."""
        proc = self._proc
        if self.starve.starve_s > 0 and proc is not None:
            self.starve.begin(time.monotonic(), process_cpu_s(proc.pid) or 0.0)

    def _stop(self) -> None:
        with self._hold_lock:
            sock, proc, self._sock, self._proc = self._sock, self._proc, None, None
            if proc is not None and self.stopped:
                try:
                    os.kill(proc.pid, signal.SIGCONT)  # to read its EOF and exit
                except ProcessLookupError:
                    pass
        if sock is not None:
            sock.close()  # the child reads EOF and exits
        if proc is not None:
            try:
                proc.wait(2.0)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def kill(self) -> None:
        """End the child now, mid-compile or not, and start no other (the host closing).
        Takes no ``_lock``, which a compile holds throughout: the compile under way, whose
        client is gone, fails at once (GeneralFailure) instead of the close waiting for it.
        Waited for, a compile of the demo's LLM held a stopping host 1.3 s beside thirty
        busy loops, and as long as the compile takes on a loaded machine."""
        with self._hold_lock:
            self.closing = True
            proc = self._proc
            if proc is not None and proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)

    def close(self) -> None:
        with self._lock:
            self._stop()

    def compile(self, onnx: bytes | tuple[int, int], *, level: int, threads: int,
                n_model: int, n_data: int, max_bytes: int
                ) -> tuple[list[bytes], list[memoryview]]:
        """The cache blobs (model, data) of ``onnx`` compiled at ``level`` in the worker.
        ``onnx``: the bytes, or (fd, size) of the memfd the client sent them in (passed
        on: the driver never reads it). InvalidArgument for a model ONNX Runtime refuses
        (or one with external data), GeneralFailure if the worker died."""
        if isinstance(onnx, tuple):
            fd, size, own = onnx[0], onnx[1], False
        else:
            fd, size, own = _memfd_with([onnx], "npu-compile-in"), len(onnx), True
        req = json.dumps({"size": size, "level": level, "threads": threads,
                          "n_model": n_model, "n_data": n_data,
                          "max_bytes": max_bytes}).encode()
        try:
            with self._lock:
                return self._call(req, fd)
        finally:
            if own:
                os.close(fd)

    def _send(self, req: bytes, fd: int) -> socket.socket:
        """Send the request and wait for the worker's receipt, starting the worker first
        if there is none. A worker found dead (the send fails, or it hangs up before its
        receipt: it never saw the request) is started again, once."""
        for attempt in (0, 1):
            fresh = self._sock is None
            if fresh:
                if self.closing:
                    raise GeneralFailure("the driver is closing")
                self._start()  # (its watch begins there)
            sock = self._sock
            assert sock is not None
            try:
                socket.send_fds(sock, [req], [fd])
                if not fresh:
                    self._begin_watch()  # an idle child's wait counts from the request
                self._watch(sock)  # until its receipt
                if sock.recv(16) == _RECEIPT:
                    return sock
                err = "it hung up"
            except OSError as exc:
                err = str(exc)
            self._stop()
            if attempt:
                raise GeneralFailure(f"the compile worker cannot be reached: {err}")
        raise AssertionError("unreachable")

    def _watch(self, sock: socket.socket) -> None:
        """Until ``sock`` has something to read (the child's receipt, then its reply): the
        starvation bound's watch of the child (raised to normal priority when starved,
        lowered again after; compile_starve.py). ``_call`` lowers it at the end."""
        guard, proc = self.starve, self._proc
        if guard.starve_s <= 0 or proc is None:
            return
        pid, clock = proc.pid, time.monotonic
        poller = select.poll()
        poller.register(sock.fileno(), select.POLLIN)
        while not poller.poll(max(1, int(guard.starve_s * 500))):
            cpu = process_cpu_s(pid)
            if cpu is None:
                return  # gone: the recv tells
            if self.stopped:  # held by the quiet window: not starvation
                guard.rebase(clock(), cpu)
                continue
            move = guard.tick(clock(), cpu)
            if move is not None:
                self._set_sched(pid, raised=move)

    def _set_sched(self, pid: int, *, raised: bool) -> None:
        if raised and self.raiser is not None and not self.raiser.local:
            self.raiser.up(pid)  # npud raises it (lowering needs no privilege: below)
            return
        try:
            set_process_sched(pid, "normal" if raised else self.sched, self.nice)
        except PermissionError as exc:
            log.warning("%s: the compile child stays at SCHED_IDLE: %s", self.name, exc)
            self.starve.starve_s = 0.0

    def _call(self, req: bytes, fd: int) -> tuple[list[bytes], list[memoryview]]:
        try:
            sock = self._send(req, fd)
            try:
                self._watch(sock)  # until the reply
                data, fds, _, _ = socket.recv_fds(sock, _MAX_MSG, 1)
            except OSError as exc:
                data, fds = b"", []
                log.warning("%s: compile worker: %s", self.name, exc)
        finally:
            proc = self._proc
            if self.starve.end() and proc is not None:  # raised when the compile ended
                self._set_sched(proc.pid, raised=False)
        try:
            if not data:
                code = self._proc.poll() if self._proc is not None else None
                self._stop()
                raise GeneralFailure(f"the compile worker exited during the compile "
                                     f"(status {code})")
            reply = json.loads(data)
            if not reply.get("ok"):
                kind = InvalidArgument if reply.get("type") == "InvalidArgument" else (
                    GeneralFailure)
                raise kind(str(reply.get("error", "the compile worker failed")))
            if len(fds) != 1:
                raise GeneralFailure("the compile worker sent no artifacts")
            model_lens = [int(n) for n in reply["model"]]
            data_lens = [int(n) for n in reply["data"]]
            if min([*model_lens, *data_lens, 0]) < 0:
                raise GeneralFailure("the compile worker sent a negative length")
            # The model blobs (a graph with weight offsets: small) as bytes, the data
            # blobs (the weights) as views of one buffer: no Python copy of the weights.
            pos, model_blobs = 0, []
            weights: memoryview
            for n in model_lens:
                model_blobs.append(os.pread(fds[0], n, pos) if n else b"")
                if len(model_blobs[-1]) != n:
                    raise GeneralFailure("the compile worker's artifacts are short")
                pos += n
            weights = _read_fd(fds[0], pos, sum(data_lens), "the compile worker's artifacts")
        finally:
            for f in fds:
                os.close(f)
        data_blobs, pos = [], 0
        for n in data_lens:
            data_blobs.append(weights[pos:pos + n])
            pos += n
        return model_blobs, data_blobs


# --- the child ----------------------------------------------------------------------------


def _lower_process(sched: str, nice: int, slice_us: int = 0) -> None:
    """Lower every thread this process will have (ONNX Runtime's inherit it), each given
    the slice ``slice_us`` first (0: the one inherited)."""
    if slice_us:
        for tid in os.listdir("/proc/self/task"):
            set_slice(slice_us, int(tid))
    try:
        # Every thread: a policy is per thread, and numpy's BLAS pool, started when this
        # module was imported, was found at SCHED_OTHER in a child lowered only here.
        if sched in ("idle", "nice"):
            set_process_sched(os.getpid(), sched, nice)
    except (OSError, AttributeError) as exc:
        print(f"compile worker stays at normal priority: {exc}", file=sys.stderr)


def _pin_process(cpus: str) -> None:
    """Every thread this process has (numpy's pool's among them) and will have on
    ``cpus`` ("0,1"; "": left as they are)."""
    if not cpus:
        return
    want = {int(c) for c in cpus.split(",")}
    try:
        for tid in os.listdir("/proc/self/task"):
            os.sched_setaffinity(int(tid), want)
    except (OSError, ValueError) as exc:
        print(f"compile worker stays on every CPU: {exc}", file=sys.stderr)


def _die_with_parent() -> None:
    try:
        import ctypes
        import ctypes.util

        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(1, ctypes.c_ulong(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _serve_one(req: dict[str, Any], fd: int) -> tuple[dict[str, Any], int | None]:
    from npumanager.drivers.external_data import bind
    from npumanager.drivers.reference_cache import compile_with_artifacts

    size, max_bytes = int(req["size"]), int(req["max_bytes"])
    if size > max_bytes:
        raise InvalidArgument(f"model of {size} bytes exceeds the driver's limit of "
                              f"{max_bytes}")
    onnx = bytes(_read_fd(fd, 0, size, "the model's memfd"))
    # No files: any external-data reference is refused, never looked for.
    onnx, _ = bind(onnx, {}, max_bytes=max_bytes)
    # The session is thrown away: ONNX Runtime need not pack the weights for it (half the
    # compile of a 32 MiB model, at the background's priority but on the shared cores).
    _, model_blobs, data_blobs = compile_with_artifacts(
        onnx, int(req["level"]), int(req["n_model"]), int(req["n_data"]),
        intra_op_threads=int(req["threads"]), min_external_bytes=MIN_EXTERNAL_BYTES,
        prepack=False)
    out = _memfd_with([*model_blobs, *data_blobs], "npu-compile-out")
    return {"ok": True, "model": [len(b) for b in model_blobs],
            "data": [len(b) for b in data_blobs]}, out


def main(argv: list[str]) -> int:
    sock_fd, sched, nice = int(argv[0]), argv[1], int(argv[2])
    set_mmap_threshold(int(argv[3]) if len(argv) > 3 else 0)  # before ONNX Runtime loads
    faulthandler.register(signal.SIGUSR1, file=2, all_threads=True)  # `kill -USR1`: stacks
    _die_with_parent()
    _pin_process(argv[5] if len(argv) > 5 else "")
    _lower_process(sched, nice, int(argv[4]) if len(argv) > 4 else 0)
    sock = socket.socket(fileno=sock_fd)
    import onnxruntime  # noqa: F401  # imported once, before the first request, lowered

    # compile_malloc = "keep": the heap keeps what a compile freed for the next one, and
    # goes back to the kernel once no compile came for trim_s (hal/malloc_tune.py).
    trim_s, kept = (float(argv[6]) if len(argv) > 6 else 0.0), False
    while True:
        if kept and not select.select([sock], [], [], trim_s)[0]:
            trim()
            kept = False
        try:
            data, fds, _, _ = socket.recv_fds(sock, _MAX_MSG, 1)
        except OSError:
            return 0
        if not data:
            return 0  # the driver closed its end
        try:
            sock.send(_RECEIPT)
        except OSError:
            return 0
        out: int | None = None
        try:
            if len(fds) != 1:
                raise InvalidArgument("a compile request carries one memfd")
            kept = trim_s > 0
            reply, out = _serve_one(json.loads(data), fds[0])
        except InvalidArgument as exc:
            reply = {"ok": False, "type": "InvalidArgument", "error": str(exc)}
        except Exception as exc:
            reply = {"ok": False, "type": "GeneralFailure",
                     "error": f"{type(exc).__name__}: {exc}"}
        finally:
            for f in fds:
                os.close(f)
        try:
            socket.send_fds(sock, [json.dumps(reply).encode()], [out] if out is not None else [])
        except OSError:
            return 0
        finally:
            if out is not None:
                os.close(out)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
