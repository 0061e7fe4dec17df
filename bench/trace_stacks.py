"""What the camera's path sleeps on in slow frames: the kernel stack of each sleep.

Part of bench/contention_trace.py (``--stacks``). A second ``perf record`` over a phase
keeps, for a few threads only (the driver host's and the camera app's, filtered by tid
so the rest of the machine pays nothing), every context switch with its kernel call
chain (the switched-out thread's stack: where it went to sleep), every wake-up of them
with the waker's kernel call chain (a timer's interrupt, a futex wake, a socket write,
an rwsem release) and their ``futex`` calls' addresses. Wake-ups are ``sched_waking``,
which fires in the waker's context: ``sched_wakeup`` of a thread on another CPU fires
on that CPU from its queued wake-up (``sched_ttwu_pending``, an IPI), naming whoever
that CPU was running as the waker. A futex in the interpreter's
``_PyRuntime`` (the executable is not position-independent: one address for every
process) is the GIL, any other one a ``threading`` lock or condition (a ``sem_t`` on
the heap) or a native library's.

Each slow frame is then cut along its critical path: from the frame's start until the
driver answered, the burst thread's states (running; runnable, waiting for a CPU;
asleep, by the class of its stack and what woke it), from the answer until the frame's
end the camera's thread's. The same cut of typical frames gives each state's typical
share; a slow frame's excess is put down to the states it spent more time in, so the
table's rows add up to the slow frames' excess over the typical frame.
"""

from __future__ import annotations

import bisect
import os
import re
import subprocess
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

#: Sleeps, by the first of these functions in the switched-out stack (innermost first).
SLEEP_CLASSES = (
    ("futex_wait", "futex"),
    ("rwsem_down_read_slowpath", "rwsem-read"),
    ("rwsem_down_write_slowpath", "rwsem-write"),
    ("folio_wait_bit", "page I/O"),
    ("io_schedule", "page I/O"),
    ("do_select", "select"),
    ("do_sys_poll", "poll"),
    ("ep_poll", "epoll"),
    ("do_nanosleep", "nanosleep"),
    ("unix_stream_read_generic", "recv"),
    ("sock_recvmsg", "recv"),
    ("pipe_read", "pipe"),
    ("__mutex_lock", "kernel mutex"),
    ("wait_for_completion", "completion"),
)
#: Wake-ups, by the first of these functions in the waker's stack.
WAKE_CLASSES = (
    ("hrtimer_wakeup", "timer"),
    ("futex_wake", "futex wake"),
    ("rwsem_wake", "rwsem release"),
    ("unix_stream_sendmsg", "socket write"),
    ("sock_def_readable", "socket write"),
    ("eventfd_write", "eventfd"),
    ("pipe_write", "pipe write"),
    ("signal_wake_up", "signal"),
    ("ep_poll_callback", "epoll"),
)


def perf_command(out: str, tids: list[int]) -> list[str]:
    """The ``perf record`` of ``tids``' switches, wake-ups and futex calls, with kernel
    call chains on the switches and wake-ups."""
    sw = " || ".join(f"prev_pid == {t} || next_pid == {t}" for t in tids)
    wk = " || ".join(f"pid == {t}" for t in tids)
    fx = " || ".join(f"common_pid == {t}" for t in tids)
    return ["perf", "record", "-a", "-k", "mono", "-g", "--kernel-callchains",
            "-e", "sched:sched_switch", "--filter", sw,
            "-e", "sched:sched_waking", "--filter", wk,
            "-e", "syscalls:sys_enter_futex", "--filter", fx, "-o", out]


def start_stacks(keep: str, phase: str, threads: dict[int, tuple[Any, ...]]
                 ) -> tuple[subprocess.Popen[bytes], tuple[int, int]]:
    """The stacks' ``perf record`` of ``phase`` (``KEEP/PHASE.stacks.data``) over the host's
    and the camera's threads of ``threads`` (contention_trace's thread table), and the
    host's GIL range."""
    tids = sorted(t for t, v in threads.items() if v[1] in ("host", "camera"))
    out = os.path.join(keep, f"{phase}.stacks.data")
    perf = subprocess.Popen(perf_command(out, tids), stdout=subprocess.DEVNULL,
                            stderr=open(out + ".log", "w"))  # noqa: SIM115
    return perf, runtime_range(host_pid(threads) or 0)


def host_pid(threads: dict[int, tuple[Any, ...]]) -> int | None:
    """The driver host's pid (its main thread runs its event loop)."""
    return next((t for t, v in threads.items() if v[1] == "host" and v[0] == t), None)


def roles(threads: dict[int, tuple[Any, ...]], host_tids: set[int],
          wakes: list[tuple[float, int, int]]) -> Any:
    """tid -> a name: a host thread's role (the event loop, its kernel name, or for an
    unnamed one the burst of the app that wakes it most), else process:thread."""
    wakers: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for _, tid, waker in wakes:
        if tid in host_tids and waker in threads and threads[waker][1] not in ("host",
                                                                                "compile"):
            wakers[tid][threads[waker][1]] += 1

    def role(tid: int) -> str:
        v = threads.get(tid)
        if v is None:
            return "idle/irq" if tid == 0 else "outside"
        if v[1] != "host":
            return f"{v[1]}:{'main' if v[0] == tid else v[4]}"
        if v[0] == tid:
            return "host:event-loop"
        if str(v[4]) != "python":
            return f"host:{v[4]}"
        w = wakers.get(tid)
        return f"host:burst-{max(w, key=lambda k: w[k])}" if w else f"host:{tid}"
    return role


def runnable_by(tl: Any, host_tids: set[int], role: Any, classify: Any) -> Any:
    """(tid, a, b) -> its runnable waits within [a, b] by who had the CPU it then got
    (``tl``: contention_trace's Timeline of the whole machine)."""
    def runnable(tid: int, a: float, b: float) -> dict[str, float]:
        out: dict[str, float] = defaultdict(float)
        for w0, w1, cpu in tl.waited(tid, a, b):
            for t2, d in tl.ran(w0, w1, [cpu]).items():
                out[role(t2) if t2 in host_tids else classify(t2)] += d
        return out
    return runnable


def runtime_range(pid: int) -> tuple[int, int]:
    """[start, end) of the interpreter's ``_PyRuntime`` in process ``pid`` (the GIL's
    futexes lie in it); (0, 0) when it cannot be read."""
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
        out = subprocess.run(["nm", "-DS", exe], capture_output=True, text=True,
                             check=False).stdout
    except OSError:
        return (0, 0)
    for line in out.splitlines():
        p = line.split()
        if len(p) == 4 and p[3] == "_PyRuntime":
            start = int(p[0], 16)
            return (start, start + int(p[1], 16))
    return (0, 0)


_HEAD = re.compile(r"^\s*(\d+)\s+\[(\d+)\]\s+([\d.]+):\s+(\S+):\s*(.*)$")
_SW = re.compile(r"prev_pid=(\d+) .*prev_state=(\S+) ==> .*next_pid=(\d+)")
_WK = re.compile(r" pid=(\d+) ")
_FX = re.compile(r"uaddr: 0x([0-9a-f]+), op: 0x([0-9a-f]+)")


@dataclass
class Off:
    """One stretch a thread spent off its CPU."""

    out: float
    state: str  # the switch-out's prev_state ("R", "R+": preempted; else asleep)
    sleep: str  # the stack's class
    woke: float = float("nan")  # when it was woken (NaN: preempted, or not seen)
    waker: int = -1
    wake: str = ""  # the waker stack's class
    back: float = float("nan")  # when it ran again


def _context(frames: list[str]) -> str:
    """Where the kernel was entered: the system call, a page fault, an interrupt."""
    for f in frames:
        if f.startswith("__x64_sys_"):
            return f[len("__x64_sys_"):]
        if f in ("exc_page_fault", "do_user_addr_fault"):
            return "page fault"
        if f.startswith(("asm_sysvec", "asm_common_interrupt")):
            return "interrupt"
    return frames[-1] if frames else "?"


def _cls(frames: list[str], table: tuple[tuple[str, str], ...]) -> str:
    for f in frames:
        for key, name in table:
            if f.startswith(key):
                if name.startswith(("rwsem", "page", "kernel")):
                    return f"{name} in {_context(frames)}"
                return name
    # (the first frame past the scheduler's own names the rest)
    rest = [f for f in frames if not f.startswith(("__schedule", "schedule", "__traceiter",
                                                    "trace_", "perf_", "ttwu", "try_to_wake",
                                                    "wake_up", "__wake_up", "default_wake"))]
    return rest[0] if rest else "?"


def read_stacks(path: str, gil: tuple[int, int]) -> dict[int, list[Off]]:
    """tid -> its stretches off the CPU, in order, each with the class of the stack it
    slept in (a futex in ``gil`` is "futex GIL", another "futex lock") and of its
    waker's."""
    out = subprocess.run(["perf", "script", "-i", path, "-F", "tid,cpu,time,event,trace,ip,sym"],
                         capture_output=True, text=True, check=False).stdout
    return parse_script(out, gil)


def parse_script(out: str, gil: tuple[int, int]) -> dict[int, list[Off]]:
    """:func:`read_stacks` of ``perf script``'s text."""
    events: list[tuple[float, int, str, str, list[str]]] = []
    cur: list[str] | None = None
    for line in out.splitlines():
        m = _HEAD.match(line)
        if m:
            cur = []
            events.append((float(m.group(3)), int(m.group(1)), m.group(4), m.group(5), cur))
        elif cur is not None and line.strip():
            p = line.split()
            if len(p) >= 2:
                cur.append(p[1])
    events.sort(key=lambda e: e[0])
    offs: dict[int, list[Off]] = defaultdict(list)
    last_futex: dict[int, int] = {}
    for t, tid, ev, rest, frames in events:
        if ev.startswith("syscalls:sys_enter_futex"):
            m = _FX.search(rest)
            if m:
                last_futex[tid] = int(m.group(1), 16)
        elif ev.startswith("sched:sched_switch"):
            m = _SW.search(rest)
            if not m:
                continue
            prev, state, nxt = int(m.group(1)), m.group(2), int(m.group(3))
            if nxt in offs and offs[nxt] and offs[nxt][-1].back != offs[nxt][-1].back:
                offs[nxt][-1].back = t
            if prev != 0:
                sleep = "preempted" if state.startswith("R") else _cls(frames, SLEEP_CLASSES)
                if sleep == "futex":
                    a = last_futex.get(prev, 0)
                    sleep = "futex GIL" if gil[0] <= a < gil[1] else f"futex lock@{a:x}"
                offs[prev].append(Off(t, state, sleep))
        elif ev.startswith("sched:sched_waking"):
            m = _WK.search(" " + rest + " ")
            if not m:
                continue
            woken = int(m.group(1))
            lst = offs.get(woken)
            if lst and lst[-1].woke != lst[-1].woke and lst[-1].back != lst[-1].back:
                lst[-1].woke, lst[-1].waker = t, tid
                lst[-1].wake = _cls(frames, WAKE_CLASSES)
    return offs


def states(offs: list[Off], a: float, b: float, name: Any,
           runnable: Any = None) -> dict[str, float]:
    """Seconds of [a, b] a thread spent running, runnable and asleep (by the sleep's
    class and its waker, named by ``name(tid)``). ``runnable(a, b)``, where given, splits
    the runnable time by who had the CPU the thread then got (from the full trace)."""
    out: dict[str, float] = defaultdict(float)
    starts = [o.out for o in offs]
    i = max(0, bisect.bisect_left(starts, a) - 1)
    off_total = 0.0
    while i < len(offs) and offs[i].out < b:
        o = offs[i]
        i += 1
        back = o.back if o.back == o.back else b
        if back <= a:
            continue
        if o.sleep == "preempted":
            if runnable is None:
                out["runnable (preempted)"] += min(b, back) - max(a, o.out)
            continue
        if o.woke != o.woke:
            d = min(b, back) - max(a, o.out)
            out[f"{o.sleep} (no wake seen)"] += d
            off_total += d
            continue
        d1 = max(0.0, min(b, o.woke) - max(a, o.out))
        if d1 > 0:
            who = "timer" if o.wake == "timer" else f"{o.wake} by {name(o.waker)}"
            out[f"{o.sleep} / {who}"] += d1
            off_total += d1
        if runnable is None:
            out["runnable (woken)"] += max(0.0, min(b, back) - max(a, o.woke))
    if runnable is not None:
        for k, v in runnable(a, b).items():
            out[f"runnable, CPU had by {k}"] += v
    off_total += sum(v for k, v in out.items() if k.startswith("runnable"))
    out["running"] += max(0.0, (b - a) - off_total)
    return out


def excess_table(slow: list[dict[str, float]], typical: list[dict[str, float]]
                 ) -> list[tuple[str, float, int]]:
    """(state, ms of excess over the typical frames' mean summed over the slow frames,
    how many slow frames had more of it), largest first."""
    keys = {k for r in slow + typical for k in r}
    mean = {k: sum(r.get(k, 0.0) for r in typical) / max(1, len(typical)) for k in keys}
    rows = []
    for k in keys:
        d = [r.get(k, 0.0) - mean[k] for r in slow]
        rows.append((k, sum(d) * 1e3, sum(1 for x in d if x > 0.0002)))
    return sorted(rows, key=lambda r: -r[1])


def frame_states(offs: dict[int, list[Off]], burst: int, cam: int, s: float,
                 answered: float, e: float, name: Any, runnable: Any) -> dict[str, float]:
    """A frame's critical path: the burst thread's states until the answer, the camera's
    thread's after it (``runnable(tid, a, b)``: the thread's runnable time by holder)."""
    row = {f"burst: {k}": v for k, v in states(
        offs.get(burst, []), s, answered, name, lambda a, b: runnable(burst, a, b)).items()}
    for k, v in states(offs.get(cam, []), answered, e, name,
                       lambda a, b: runnable(cam, a, b)).items():
        row[f"camera: {k}"] = v
    return row


def print_stacks(keep: str, phase: str, gil: tuple[int, int], burst: int | None,
                 cam: int | None, loop: int | None, slow: list[tuple[float, float, float]],
                 typical: list[tuple[float, float, float]], answered_of: Any,
                 name: Any, runnable: Any) -> None:
    """The slow frames' excess by the state (sleep class and waker) it went to; and the
    event loop thread's states over the same slow frames."""
    path = os.path.join(keep, f"{phase}.stacks.data")
    if not os.path.exists(path) or burst is None or cam is None:
        return
    offs = read_stacks(path, gil)

    def rows(frames: list[tuple[float, float, float]]) -> list[dict[str, float]]:
        out = []
        for s, e, _ms in frames:
            ans = answered_of(s, e)
            if ans is not None:
                out.append(frame_states(offs, burst, cam, s, ans, e, name, runnable))
        return out

    srows, trows = rows(slow), rows(typical)
    total = sum(sum(r.values()) for r in srows) - len(srows) * (
        sum(sum(r.values()) for r in trows) / max(1, len(trows)))
    print(f"{phase}: the slow frames' excess by the critical path's state (kernel stacks; "
          f"{len(srows)} slow frames against {len(trows)} typical, {total * 1e3:.1f} ms excess "
          "in all)")
    for k, ms, n in excess_table(srows, trows):
        if abs(ms) >= 0.05:
            print(f"  {k:58} {ms:8.2f} ms  ({n} frames more)")
    if loop is not None:
        def lp(a: float, b: float) -> dict[str, float]:
            return dict(runnable(loop, a, b))
        lrows = [states(offs.get(loop, []), s, e, name, lp) for s, e, _ in slow]
        ltyp = [states(offs.get(loop, []), s, e, name, lp) for s, e, _ in typical]
        print(f"{phase}: the host's event loop thread over the same frames (excess)")
        for k, ms, n in excess_table(lrows, ltyp)[:10]:
            if abs(ms) >= 0.05:
                print(f"  {k:58} {ms:8.2f} ms  ({n} frames more)")
    holders(offs, burst, slow, answered_of, name, runnable)


def holders(offs: dict[int, list[Off]], burst: int, slow: list[tuple[float, float, float]],
            answered_of: Any, name: Any, runnable: Any) -> None:
    """What the thread that ended each of the burst thread's futex sleeps (the GIL's or a
    lock's holder, which wakes it on release) did meanwhile: ran its own work, waited
    for a CPU (behind whom), or slept itself (a chain: the holder waiting for the GIL)."""
    out: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for s, e, _ms in slow:
        ans = answered_of(s, e)
        for o in offs.get(burst, []):
            if not (o.sleep.startswith("futex") and o.woke == o.woke and o.out < (ans or e)
                    and o.woke > s and o.woke - o.out >= 0.0002):
                continue
            key = f"{o.sleep.split('@')[0]} held by {name(o.waker)}"
            st = states(offs.get(o.waker, []), o.out, o.woke, name,
                        lambda a, b, w=o.waker: runnable(w, a, b))
            for k, v in st.items():
                out[key][k] += v
    if not out:
        return
    print("the burst thread's futex sleeps (>= 0.2 ms) in slow frames: what the holder did "
          "meanwhile (ms)")
    for key, st in sorted(out.items(), key=lambda x: -sum(x[1].values())):
        top = sorted(st.items(), key=lambda x: -x[1])[:6]
        print(f"  {key:40} {sum(st.values()) * 1e3:6.2f}: " + "; ".join(
            f"{k} {v * 1e3:.2f}" for k, v in top if v >= 0.00005))
