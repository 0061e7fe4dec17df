"""How much CPU a driver host's thread may use at SCHED_FIFO before npud takes it back.

The host lowers its own burst threads (a long run, SIGXCPU: drivers/rt_threads.py), and
the kernel kills a thread that runs 500 ms at RT without blocking (RLIMIT_RTTIME). But a
thread that blocks for a moment now and then restarts that count, and a compromised host
need not lower anything: so npud samples each thread it granted (its CPU time from
/proc/<pid>/task/<tid>/schedstat, every ``SAMPLE_S``) and demotes one that used more than
``MAX_CPU_MS`` in the last ``WINDOW_S`` (the camera's burst thread uses a few ms a
frame, ~3-10 % of a CPU at 30 fps; a spinner is taken back within the budget plus one
sampling period). Its host then gets no grant for ``COOLDOWN_S``, so rotating threads
gains nothing. The same limits as npud's grants to app threads (service/rt_watch.py).

Pure: samples in with ``now``, what to demote out.
"""

from __future__ import annotations

from npumanager.service.rt_watch import CpuWindow, RtLimits

#: CPU a granted thread may use in any WINDOW_S (ms), how often npud samples it, and how
#: long its host then gets no grant: the defaults of the app threads' limits.
_APP = RtLimits()
MAX_CPU_MS = _APP.max_cpu_ms
WINDOW_S = _APP.window_s
SAMPLE_S = _APP.sample_s
COOLDOWN_S = _APP.cooldown_s


class HostRtWatch:
    """Granted threads' CPU samples, by (host pid, tid)."""

    def __init__(self, max_cpu_ms: float = MAX_CPU_MS, window_s: float = WINDOW_S,
                 cooldown_s: float = COOLDOWN_S) -> None:
        self.max_cpu_ns = int(max_cpu_ms * 1e6)
        self.window_s = window_s
        self.cooldown_s = cooldown_s
        self._samples: dict[tuple[int, int], CpuWindow] = {}
        self._cooling: dict[int, float] = {}
        self.demoted = 0

    def granted(self, pid: int, tid: int, now: float, cpu_ns: int) -> None:
        w = self._samples[(pid, tid)] = CpuWindow(self.window_s)
        w.add(now, cpu_ns)

    def cooling(self, pid: int, now: float) -> bool:
        """Host ``pid`` is in its cooldown (no grant now)."""
        until = self._cooling.get(pid)
        if until is None:
            return False
        if now >= until:
            del self._cooling[pid]
            return False
        return True

    def watched(self) -> list[tuple[int, int]]:
        return list(self._samples)

    def tick(self, now: float, cpu: dict[tuple[int, int], int | None]
             ) -> list[tuple[int, int]]:
        """Each watched thread's CPU time now (None: gone or no longer at FIFO: forgotten);
        the threads to demote (each forgotten, its host cooling down)."""
        out = []
        for key in list(self._samples):
            ns = cpu.get(key)
            if ns is None:
                del self._samples[key]
                continue
            if self._samples[key].add(now, ns) > self.max_cpu_ns:
                out.append(key)
                del self._samples[key]
                self._cooling[key[0]] = now + self.cooldown_s
                self.demoted += 1
        return out
