"""Busy loops that keep every CPU busy at normal priority, for starvation tests.

A test that starts ``python -c "while True: pass"`` and goes on at once does not have a
busy machine yet: each loop spins only once its interpreter has started, which on a
loaded machine takes from tens of milliseconds to seconds. A background job run in that
gap can finish before any loop takes a CPU (seen: a starvation test's counters at 0 in a
full suite beside other helpers' runs, passing alone). :func:`spin_every_cpu` returns only
once every loop has said it is in its loop, so the load is there, made by the test
itself, whatever else the machine is doing.
"""

from __future__ import annotations

import os
import subprocess
import sys

#: Keeps to its CPU (argv[1]), says it is about to spin (its interpreter is up), then
#: spins until killed.
_LOOP = ("import os, sys\nos.sched_setaffinity(0, {int(sys.argv[1])})\n"
         "sys.stdout.write('spinning\\n')\nsys.stdout.flush()\nwhile True: pass\n")


def spin_every_cpu(n: int | None = None) -> list[subprocess.Popen[bytes]]:
    """``n`` normal-priority busy loops (default: one per CPU this process may use, two at
    least), each kept to a CPU of its own (in turn over this process's CPUs) and in its
    loop when this returns. Kept, because the kernel placed two fresh loops on one CPU
    at times and balanced them only later: a background job run meanwhile had the other
    CPU to itself (seen once in ten runs under load, before the loops were pinned). Stop
    them with :func:`stop`."""
    cpus = sorted(os.sched_getaffinity(0))
    count = n if n is not None else max(2, len(cpus))
    loops = [subprocess.Popen([sys.executable, "-c", _LOOP, str(cpus[i % len(cpus)])],
                              stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
             for i in range(count)]
    try:
        for p in loops:
            assert p.stdout is not None
            line = p.stdout.readline()  # EOF (b"") if it died before its loop
            if line != b"spinning\n":
                raise RuntimeError(f"busy loop {p.pid} did not start (said {line!r})")
    except BaseException:
        stop(loops)
        raise
    return loops


def stop(loops: list[subprocess.Popen[bytes]]) -> None:
    """Kill and reap the loops."""
    for p in loops:
        p.kill()
    for p in loops:
        p.wait(30)
        if p.stdout is not None:
            p.stdout.close()
