"""Execute overhead: models run through the driver host vs ONNX Runtime in-process.

Starts a real reference driver host (``npu driver reference``, admission off)
and runs the same models every way listed in ``MODES``, interleaved in rounds
so machine noise hits every mode alike. The first mode, ONNX Runtime
in-process with the driver's session options, is the baseline each other
mode is compared with (added µs and ratio, p50 and p99).

Cases (``CASES``), all built here with ``onnx.helper``:

- tiny: y = x + 1 on [1, 4], the pure overhead (target: <= +100 µs at p50,
  back to back);
- gru step: one step of a voice-activity detector (512-sample frame, GRU 128);
- small cnn: a text-direction-classifier-sized CNN (3x48x192);
- cnn 224: a ~3-5 ms CNN (3x224x224), paced at 30 Hz only;
- cnn 30ms: a ~30 ms CNN (3x352x352, 32..256 channels; ~25-30 ms in-process on
  this 2-core VM), paced at 30 Hz only (target: burst <= +3% at p50); its 1.5 MB
  frame lies in the model's input buffers (as a camera fills them), so no mode
  copies it (the copying API row shows the cost of a copy);
- ~2 ms: a MatMul/Tanh chain sized to ~2 ms in-process (target: <= +5% paced);
- 16 MiB: relu over a 16 MiB float32 tensor through shared memory, staged
  input buffers and output views (target: >= 80% of in-process throughput),
  plus the convenient copying API for reference; back to back only.

Paces: "tight" calls back to back. A paced row runs one call per tick of a
30 Hz, 100 Hz or 1 kHz clock (sleep until the next tick, as a camera, audio
or control loop does; a late call starts at once and the ticks restart from
it), on every side alike. On this kind of VM the same ONNX Runtime call is up
to 2x slower after the process idles, and every managed call idles while it
waits for its reply, so the paced rows compare like with like. A case is
paced only at rates it can keep (see ``Case.paces``).

To add an execution mode (a burst, say), append a ``Mode`` whose ``bind``
returns the call to time, or None where the mode does not apply; anything it
opens goes on ``Bound.stack`` and is closed after the case.

Execution class: the bench's uid has no scheduling config (no npud), so its work is
BACKGROUND (priority 1000): long steps go to the lowered worker threads. With
``--foreground`` the driver's ``foreground_priority`` is 1000, so the same work is
FOREGROUND, as a camera or voice app's is under npud: a burst runs its steps on its
own thread.

Same-run baselines: a raw Unix socket round trip and the transport's own RPC
round trip (echo). Usage: python bench/execute_overhead.py [--rounds R]
[--n N] [--paced-s S] [--quick] [--only tiny,gru,...] [--foreground] [--json PATH]
[--against DIR] (DIR: another source tree, e.g. a worktree of main: its driver host
serves the plain and burst modes again in the same run, "driver @DIR", "burst @DIR")
[--anticipate US] (a host of this tree with burst_anticipate_us = US serves bursts again,
"burst, anticipate US", and with each client --spin)
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from transport_rtt import raw_socket_rtt, rpc_echo_rtt, tight  # (bench/ is on sys.path)

from npumanager import nn
from npumanager.drivers.base import CompileOptions, PreparedModel
from npumanager.drivers.reference import ReferenceDriver
from npumanager.testing.driver_host import running_driver
from npumanager.testing.onnx_models import (
    add_model,
    cnn_model,
    gru_step_model,
    matmul_model,
    relu_model,
)

US = 1e6


def pct(ts: list[float], q: float) -> float:
    s = sorted(ts)
    return s[min(len(s) - 1, int(len(s) * q))]


def paced(fn: Callable[[], object], n: int, hz: float, spin_s: float = 0.0) -> list[float]:
    """``n`` calls of ``fn``, one per tick of an ``hz`` clock: sleep until the next tick
    (``spin_s`` before it, then spin until it), call, and measure the call alone. A call
    that ends past its next tick makes the next start at once and the ticks restart from
    there (no catch-up burst)."""
    out = []
    clock = time.perf_counter
    period = 1.0 / hz
    tick = clock()
    for _ in range(n):
        wait = tick - spin_s - clock()
        if wait > 0:
            time.sleep(wait)
        while clock() < tick:
            pass
        t = clock()
        fn()
        end = clock()
        out.append(end - t)
        tick += period
        if tick < end:
            tick = end
    return out


# --- what runs: cases and execution modes ----------------------------------------------


@dataclass
class Case:
    name: str
    onnx: bytes
    inputs: dict[str, np.ndarray]
    n: int  # back-to-back calls per round (per mode)
    paces: tuple[float, ...] = (30.0, 100.0, 1000.0)  # Hz; () = back to back only
    shm: bool = False  # large tensors: the driver modes stage inputs in shared memory


@dataclass
class Bound:
    """One case made ready for the modes: compiled in-process, prepared in the driver."""

    case: Case
    local: PreparedModel
    remote: nn.Model
    stack: ExitStack = field(default_factory=ExitStack)
    driver_pid: int = 0  # whose CPU time counts as the driver side
    #: The same case prepared in the other driver hosts (``--against``, ``--anticipate``;
    #: same local model), by the host's label.
    hosts: dict[str, Bound] = field(default_factory=dict)
    _bufs: dict[str, np.ndarray] | None = None

    def input_buffers(self) -> dict[str, np.ndarray]:
        """The remote model's input buffers, filled with the case's inputs: made once and
        shared by every mode (``input_buffers()`` again would replace them)."""
        if self._bufs is None:
            self._bufs = self.remote.input_buffers()
            for k, v in self.case.inputs.items():
                self._bufs[k][...] = v
        return self._bufs


@dataclass(frozen=True)
class Mode:
    name: str
    #: The call to time for a case, or None where this mode does not apply.
    bind: Callable[[Bound], Callable[[], object] | None]
    paced: bool = True  # False: back-to-back rows only
    host: str = ""  # served by another driver host (its label; "": the main one)
    spin_s: float = 0.0  # paced rows: the caller spins this long before each tick


def _on(host: str, bind: Callable[[Bound], Callable[[], object] | None]
        ) -> Callable[[Bound], Callable[[], object] | None]:
    return lambda b: bind(b.hosts[host]) if host in b.hosts else None


def _in_process(b: Bound) -> Callable[[], object]:
    local, x = b.local, b.case.inputs
    return lambda: local.run(x)


def _driver(b: Bound) -> Callable[[], object]:
    remote, x = b.remote, b.case.inputs
    if b.case.shm:
        bufs = b.input_buffers()
        return lambda: remote.execute(bufs, copy_outputs=False)
    return lambda: remote.execute(x)


def _driver_copying(b: Bound) -> Callable[[], object] | None:
    remote, x = b.remote, b.case.inputs
    return (lambda: remote.execute(x)) if b.case.shm else None


def _burst(spin_us: float = 0.0) -> Callable[[Bound], Callable[[], object] | None]:
    """``model.burst()``: one shared-memory channel per case, opened once; with
    ``spin_us`` the client polls the response that long before it blocks."""

    def bind(b: Bound) -> Callable[[], object] | None:
        burst = b.stack.enter_context(b.remote.burst(spin_us=spin_us))
        x = b.case.inputs
        if b.case.shm:
            bufs = b.input_buffers()  # named where they lie: no copy
            return lambda: burst.execute(bufs, copy_outputs=False)
        return lambda: burst.execute(x)

    return bind


#: The first mode is the baseline the others are compared with.
MODES: list[Mode] = [
    Mode("in-process", _in_process),
    Mode("driver", _driver),
    Mode("driver, copying API", _driver_copying, paced=False),
    Mode("burst", _burst()),
]


def add_against_modes(label: str) -> None:
    """``--against DIR``: the plain and burst modes again, served by a driver host that
    runs DIR's source tree (the client side is this tree's): a before/after comparison
    of driver changes in one run, interleaved with the rest."""
    host = f"@{label}"
    MODES.append(Mode(f"driver {host}", _on(host, _driver), host=host))
    MODES.append(Mode(f"burst {host}", _on(host, _burst()), host=host))


def add_anticipate_modes(us: float, spins: list[float]) -> str:
    """``--anticipate US``: bursts served by a driver host of this tree with
    ``burst_anticipate_us = US`` (drivers/anticipate.py), without and with each client
    spin of ``--spin``; the host's label."""
    host = f"anticipate {us:g}"
    # What the same CPU spent spinning buys ONNX Runtime in-process: the app awake when
    # its tick comes.
    MODES.append(Mode(f"in-process, spin {us:g} before its tick", _in_process,
                      spin_s=us / US))
    MODES.append(Mode(f"burst, {host}", _on(host, _burst()), host=host))
    for spin in spins:
        MODES.append(Mode(f"burst, {host}, spin {spin:g}", _on(host, _burst(spin)), host=host))
    return host


def add_spin_modes(spins: list[float]) -> None:
    """``--spin``: burst modes that spin before blocking (a measured option, not a default)."""
    for us in spins:
        MODES.append(Mode(f"burst, spin {us:g} µs", _burst(us)))


# --- CPU time per execution, each side -----------------------------------------------------


def process_cpu(pid: int = 0) -> float:
    """CPU seconds (user + system) of every thread of this process (pid 0: getrusage,
    exact) or of ``pid`` (its threads' ``/proc/PID/task/*/schedstat``, in ns: /proc's
    stat counts 10 ms ticks; a thread that is running right now may lag by one tick, and
    threads that ended are not counted, so measure while the measured ones live)."""
    if pid == 0:
        ru = resource.getrusage(resource.RUSAGE_SELF)
        return ru.ru_utime + ru.ru_stime
    base = f"/proc/{pid}/task"
    total = 0
    for tid in os.listdir(base):
        try:
            with open(f"{base}/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass  # the thread just ended
    return total / 1e9


def sized_matmul(drv: ReferenceDriver, target_ms: float) -> tuple[bytes, dict[str, np.ndarray]]:
    batch = 16
    for dim in (128, 192, 256, 320, 384, 448, 512, 640, 768, 896, 1024):
        onnx = matmul_model(dim=dim, depth=4, batch=batch)
        m = drv.compile(onnx, CompileOptions())
        x = {"x": np.ones((batch, dim), np.float32)}
        tight(lambda m=m, x=x: m.run(x), 5)  # type: ignore[misc]
        t = pct(tight(lambda m=m, x=x: m.run(x), 30), 0.5) * 1e3  # type: ignore[misc]
        m.release()
        if t >= target_ms:
            break
    return onnx, x


def build_cases(drv: ReferenceDriver, n: int, keep: Callable[[str], bool]) -> list[Case]:
    """The cases whose names ``keep`` accepts (only those are built and sized)."""
    rng = np.random.default_rng(0)

    def rand(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float32)

    makers: list[tuple[str, Callable[[], Case]]] = [
        ("tiny", lambda: Case("tiny [1,4] add", add_model(4),
                              {"x": np.ones((1, 4), np.float32)}, n)),
        ("gru", lambda: Case("gru step (VAD)", gru_step_model(),
                             {"frame": rand(1, 512), "h": np.zeros((1, 1, 128), np.float32)},
                             n // 2)),
        ("small cnn", lambda: Case("small cnn 48x192", cnn_model(48, 192),
                                   {"image": rand(1, 3, 48, 192)}, max(50, n // 10),
                                   paces=(30.0, 100.0))),
        ("cnn 224", lambda: Case("cnn 224x224", cnn_model(224, 224, (16, 32, 64, 96, 128)),
                                 {"image": rand(1, 3, 224, 224)}, max(10, n // 100),
                                 paces=(30.0,))),
        ("cnn 30ms", lambda: Case("cnn 30ms 352x352",
                                  cnn_model(352, 352, (32, 64, 128, 256, 256)),
                                  {"image": rand(1, 3, 352, 352)}, max(8, n // 250),
                                  paces=(30.0,), shm=True)),
        ("matmul", lambda: matmul_case(drv, max(50, n // 10))),
        ("16 MiB", lambda: Case("16 MiB relu", relu_model((4096, 1024)),
                                {"x": rand(4096, 1024)}, 40, paces=(), shm=True)),
    ]
    return [make() for key, make in makers if keep(key)]


def matmul_case(drv: ReferenceDriver, n: int) -> Case:
    onnx, x = sized_matmul(drv, 2.0)
    batch, dim = x["x"].shape
    return Case(f"matmul {batch}x{dim} (~2 ms)", onnx, x, n, paces=(30.0, 100.0))


# --- running and reporting ----------------------------------------------------------------


def pace_label(hz: float | None) -> str:
    if hz is None:
        return "tight"
    return f"{hz / 1000:g} kHz" if hz >= 1000 else f"{hz:g} Hz"


#: CPU seconds per (case, mode, pace): [client, driver, calls].
CPU: dict[tuple[str, str, str], list[float]] = {}


def run_case(b: Bound, rounds: int, paced_s: float) -> dict[tuple[str, str], list[float]]:
    """Times of every (mode, pace) for one case, the modes interleaved round by round;
    the CPU time each side spent on them goes to ``CPU``."""
    fns = {m.name: (m, fn) for m in MODES if (fn := m.bind(b)) is not None}
    # Outputs must agree before any timing counts.
    ref = MODES[0].name
    want = fns[ref][1]()
    for name, (_, fn) in fns.items():
        got = fn()
        assert isinstance(got, dict) and isinstance(want, dict)
        for k, v in want.items():
            if not np.allclose(np.asarray(got[k]), np.asarray(v), rtol=1e-4, atol=1e-5):
                raise SystemExit(f"{b.case.name}: {name} output {k!r} differs from {ref}")
    for _, fn in fns.values():
        tight(fn, max(5, b.case.n // 20))  # warm up
    res: dict[tuple[str, str], list[float]] = {}

    def timed(name: str, pace: str, run: Callable[[], list[float]]) -> None:
        mode = fns[name][0]
        pid = b.hosts[mode.host].driver_pid if mode.host else b.driver_pid
        c0, d0 = process_cpu(), process_cpu(pid) if pid else 0.0
        ts = run()
        c1, d1 = process_cpu(), process_cpu(pid) if pid else 0.0
        res.setdefault((name, pace), []).extend(ts)
        acc = CPU.setdefault((b.case.name, name, pace), [0.0, 0.0, 0.0])
        acc[0] += c1 - c0
        acc[1] += d1 - d0
        acc[2] += len(ts)

    for _ in range(rounds):
        for name, (_, fn) in fns.items():
            timed(name, "tight", lambda fn=fn: tight(fn, b.case.n))  # type: ignore[misc]
        for hz in b.case.paces:
            calls = max(5, int(paced_s * hz))
            for name, (mode, fn) in fns.items():
                if mode.paced:
                    timed(name, pace_label(hz),
                          lambda fn=fn, hz=hz, calls=calls, s=mode.spin_s:  # type: ignore[misc]
                          paced(fn, calls, hz, s))
    return res


def fmt_t(s: float) -> str:
    return f"{s * US:.1f} µs" if s < 1e-3 else f"{s * 1e3:.3f} ms"


def table(results: dict[str, dict[tuple[str, str], list[float]]]) -> list[tuple[str, ...]]:
    """One row per (case, pace, mode); each mode after the first compared with it."""
    rows: list[tuple[str, ...]] = []
    base = MODES[0].name
    for case, res in results.items():
        paces = list(dict.fromkeys(p for _, p in res))
        shown_case = case
        for pace in paces:
            ref = res.get((base, pace))
            shown_pace = pace
            for mode in MODES:
                ts = res.get((mode.name, pace))
                if ts is None:
                    continue
                p50, p99 = pct(ts, 0.5), pct(ts, 0.99)
                added = ratio = added99 = ""
                if mode.name != base and ref is not None:
                    a50, a99 = pct(ref, 0.5), pct(ref, 0.99)
                    added = f"{(p50 - a50) * US:+.0f} µs"
                    ratio = f"{p50 / a50:.2f}x"
                    added99 = f"{(p99 - a99) * US:+.0f} µs"
                rows.append((shown_case, shown_pace, mode.name, str(len(ts)), fmt_t(p50),
                             fmt_t(p99), added, ratio, added99))
                shown_case = shown_pace = ""  # printed once per group
    return rows


def cpu_rows() -> list[tuple[str, ...]]:
    """CPU per execution on each side (the in-process mode is all client)."""
    rows: list[tuple[str, ...]] = []
    last = ("", "")
    for (case, mode, pace), (client, driver, calls) in CPU.items():
        if not calls:
            continue
        shown = (case if case != last[0] else "", pace if (case, pace) != last else "")
        last = (case, pace)
        rows.append((*shown, mode, f"{client / calls * US:.0f} µs",
                     f"{driver / calls * US:.0f} µs" if mode != MODES[0].name else "-",
                     f"{(client + driver) / calls * US:.0f} µs"))
    return rows


def targets(results: dict[str, dict[tuple[str, str], list[float]]]) -> list[str]:
    out = []

    def p50(case: str, mode: str, pace: str) -> float | None:
        for name, res in results.items():
            if name.startswith(case) and (mode, pace) in res:
                return pct(res[(mode, pace)], 0.5)
        return None

    a, b = p50("tiny", "in-process", "tight"), p50("tiny", "driver", "tight")
    if a and b:
        d = (b - a) * US
        out.append(f"tiny added p50, tight: {d:+.1f} µs (target <= +100 µs) "
                   f"{'PASS' if d <= 100 else 'FAIL'}")
    for pace in ("30 Hz", "100 Hz"):
        a, b = p50("matmul", "in-process", pace), p50("matmul", "driver", pace)
        if a and b:
            r = (b / a - 1) * 100
            out.append(f"~2 ms matmul added p50 at {pace}: {r:+.1f}% (target <= +5%) "
                       f"{'PASS' if r <= 5 else 'FAIL'}")
    a, b = p50("tiny", "in-process", "30 Hz"), p50("tiny", "burst", "30 Hz")
    if a and b:
        d = (b - a) * US
        out.append(f"burst, tiny, added p50 at 30 Hz: {d:+.1f} µs (target <= +100 µs) "
                   f"{'PASS' if d <= 100 else 'FAIL'}")
    for case in ("gru", "small cnn"):
        a, b = p50(case, "in-process", "30 Hz"), p50(case, "burst", "30 Hz")
        if a and b and a < 1e-3:
            d = (b - a) * US
            out.append(f"burst, {case} (sub-ms), added p50 at 30 Hz: {d:+.1f} µs (target "
                       f"<= +100 µs) {'PASS' if d <= 100 else 'FAIL'}")
    for mode in ("burst", "driver"):
        a, b = p50("cnn 30ms", "in-process", "30 Hz"), p50("cnn 30ms", mode, "30 Hz")
        if a and b:
            r = (b / a - 1) * 100
            goal = f"(target <= +3%) {'PASS' if r <= 3 else 'FAIL'}" if mode == "burst" else ""
            out.append(f"{mode}, cnn 30ms ({a * 1e3:.1f} ms), added p50 at 30 Hz: "
                       f"{r:+.1f}% {goal}".rstrip())
    a, b = p50("16 MiB", "in-process", "tight"), p50("16 MiB", "driver", "tight")
    if a and b:
        out.append(f"16 MiB through shared memory: {a / b * 100:.0f}% of in-process "
                   f"throughput (target >= 80%) {'PASS' if a / b >= 0.8 else 'FAIL'}")
    return out


def start_host(hosts: ExitStack, st: Path, config: str, tree: Path | None,
               rt: Path | None = None) -> tuple[nn.Device, int]:
    """A reference driver host with ``config``'s [[driver]] keys, run from ``tree`` (None:
    this tree) in ``rt`` (None: a new directory): its device and pid."""
    if rt is None:
        rt = Path(tempfile.mkdtemp(prefix="npu-bench-", dir="/tmp"))
        hosts.callback(shutil.rmtree, rt, True)
    cfg = None
    if config:
        cfg = Path(tempfile.mkstemp(prefix="npu-", suffix=".toml", dir=st)[1])
        cfg.write_text(f'[[driver]]\nname = "reference"\nplugin = "reference"\n{config}')
    path, cwd = os.environ.get("PYTHONPATH"), os.getcwd()
    if tree is not None:
        # The host is `python -m npumanager driver`: it imports the tree in its working
        # directory first, then PYTHONPATH's.
        os.environ["PYTHONPATH"] = str(tree.resolve())
        os.chdir(tree)
    try:
        proc = hosts.enter_context(running_driver(
            "reference", rt, st, config=cfg, args=["--no-enforce-admission"]))
    finally:
        os.chdir(cwd)
        if path is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = path
    dev = nn.device("reference", rt)
    hosts.callback(dev.close)
    return dev, proc.pid


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=2000, help="tiny-model back-to-back calls per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--paced-s", type=float, default=1.0,
                    help="seconds of paced calls per pace, mode and round")
    ap.add_argument("--quick", action="store_true", help="a few calls of everything (smoke)")
    ap.add_argument("--only", default="", help="comma-separated case name prefixes")
    ap.add_argument("--json", type=Path, help="also write every p50/p99 here")
    ap.add_argument("--spin", default="",
                    help="comma-separated µs: also time bursts that spin that long first")
    ap.add_argument("--foreground", action="store_true",
                    help="the driver counts this uid's work as FOREGROUND (see the docstring)")
    ap.add_argument("--against", type=Path,
                    help="another source tree (a worktree of an older commit): its driver "
                         "host serves the plain and burst modes again, in the same run")
    ap.add_argument("--anticipate", type=float, default=0.0,
                    help="µs: also time bursts served by a host of this tree with "
                         "burst_anticipate_us = that (and each --spin on the client)")
    args = ap.parse_args()
    spins = [float(v) for v in args.spin.split(",") if v.strip()]
    #: The other driver hosts: (label, source tree or None for this one, config text).
    others: list[tuple[str, Path | None, str]] = []
    fg = "foreground_priority = 1000\n" if args.foreground else ""
    if args.against:
        label = args.against.resolve().name
        add_against_modes(label)
        others.append((f"@{label}", args.against, fg))
    add_spin_modes(spins)
    if args.anticipate:
        others.append((add_anticipate_modes(args.anticipate, spins), None,
                       fg + f"burst_anticipate_us = {args.anticipate:g}\n"))
    if args.quick:
        args.n, args.rounds, args.paced_s = 100, 1, 0.1
    rt = Path(tempfile.mkdtemp(prefix="npu-bench-", dir="/tmp"))
    st = Path(tempfile.mkdtemp(prefix="npu-bench-st-", dir="/tmp"))
    started = time.monotonic()
    try:
        raw = raw_socket_rtt(args.n)
        echo = rpc_echo_rtt(args.n, rt)
        drv = ReferenceDriver({})
        wanted = [w.strip() for w in args.only.split(",") if w.strip()]
        cases = build_cases(drv, args.n,
                            lambda key: not wanted or any(key.startswith(w) for w in wanted))
        if args.quick:
            for c in cases:
                c.n = min(c.n, 20)
        results: dict[str, dict[tuple[str, str], list[float]]] = {}
        with ExitStack() as hosts:
            dev, pid = start_host(hosts, st, fg, None, rt)
            devs = {label: start_host(hosts, st, text, tree)
                    for label, tree, text in others}
            for case in cases:
                b = Bound(case, drv.compile(case.onnx, CompileOptions()),
                          dev.prepare_model(case.onnx), driver_pid=pid)
                for label, (d, p) in devs.items():
                    b.hosts[label] = Bound(case, b.local, d.prepare_model(case.onnx),
                                           stack=b.stack, driver_pid=p)
                try:
                    with b.stack:
                        results[case.name] = run_case(b, args.rounds, args.paced_s)
                finally:
                    b.remote.release()
                    for other in b.hosts.values():
                        other.remote.release()
                    b.local.release()
        print(f"\nexecute overhead ({args.rounds} rounds, modes interleaved; "
              f"{'FOREGROUND' if args.foreground else 'BACKGROUND'} work; "
              f"{time.monotonic() - started:.0f} s; load {os.getloadavg()[0]:.2f} "
              f"on {os.cpu_count()} CPUs)")
        print(f"baselines: raw Unix socket round trip p50 {pct(raw, 0.5) * US:.1f} µs; "
              f"transport RPC echo p50 {pct(echo, 0.5) * US:.1f} µs "
              f"(p99 {pct(echo, 0.99) * US:.1f} µs)")
        header = ("case", "pace", "mode", "calls", "p50", "p99", "added p50", "ratio",
                  "added p99")
        rows = table(results)
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
        for r in [header, *rows]:
            print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
        print("\nCPU time per execution (user + system; client = this process, driver = the "
              "driver host process)")
        cheader = ("case", "pace", "mode", "client", "driver", "both")
        crows = cpu_rows()
        widths = [max(len(r[i]) for r in [cheader, *crows]) for i in range(len(cheader))]
        for r in [cheader, *crows]:
            print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
        for line in targets(results):
            print(line)
        if args.json:
            doc: dict[str, Any] = {
                case: {f"{mode} @ {pace}": {"p50_us": pct(ts, 0.5) * US,
                                            "p99_us": pct(ts, 0.99) * US, "n": len(ts)}
                       for (mode, pace), ts in res.items()}
                for case, res in results.items()}
            for (case, mode, pace), (client, driver, calls) in CPU.items():
                if calls:
                    doc[case][f"{mode} @ {pace}"] |= {
                        "client_cpu_us": client / calls * US,
                        "driver_cpu_us": driver / calls * US}
            args.json.write_text(json.dumps(doc, indent=1))
    finally:
        shutil.rmtree(rt, ignore_errors=True)
        shutil.rmtree(st, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
