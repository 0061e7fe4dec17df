"""bench/contention.py's rows that tune the second driver host (#15, bgtune21).

``rt+app+bg-own-host`` put the LLM, the embedder and the loader on a second reference
``[[driver]]`` (SECOND_HOST) with the first one's keys, and the camera's threads at
SCHED_FIFO (its host's burst thread at 1, its app's thread at 2 through npud). It met
the camera's targets against its own alone, but the embedder stayed at 49 % of
unmanaged: the second host still runs its work the way a host that shares a core with a
paced stream must (background steps on SCHED_IDLE workers, one intra-op thread a
session, a channel kept for foreground work nobody sends there). With the camera at
FIFO in another process, the kernel preempts that work for the camera at once whatever
its priority or thread count, so the second host may be tuned for throughput.

A row's ``"second_host"`` holds [[driver]] keys for the second entry only (its
``"options"`` merged into the first's): the driver keys' own names, so they map one to
one onto the product's background host (``[[driver]] background_host = true``).

Measured (bench/README.md "The second host tuned for throughput"; full runs, --repeat 2, twice):
"here-normal+step-nice" (background_burst_here = "normal", background_step_nice = 19) is
the best host-only setting, the embedder 75 / 71 / 77 / 82 % of unmanaged (49 % without),
LLM 129-153 %, camera 0.67-1.11x its alone; with the embedder app's client spin on top
86 / 85 %, LLM 104 / 106 %. The LLM at normal priority or ONNX Runtime's two threads cost
the embedder or the LLM (quick screens: 13-50 %, or the LLM at 2-7 %); slice-100 and
lower-run (as root) no gain. On the product's lane with the keys on the entry
(rt+app+bg-host+on-entry+*, two full runs): 49 / 50 % -> 76 / 77 %, with the spin 80 / 82 %.

embed22 (#15's embedder without an app change): the lane's follow-on poll
(background_follow_us) and the embedder app's adaptive spin (model.burst(spin_us=None))
gained nothing in two full runs (+spin-auto 76 / 78 %, +follow+spin-auto 79 / 73 % vs
80 / 77 % without; bench/README.md "The second host tuned for throughput"), nor the one-pass
admission of its BACKGROUND repeats (+one-pass, background_one_pass: 81 / 80 % vs 82 /
78 %, two full runs; the admission stage 26 vs 31 µs).

load28 (a background model's load on the lane): "+load-nice" (background_load_nice = 19: the
compile child and the session builds at the step workers' nice value instead of SCHED_IDLE)
cut the load's p50 to 768-961 ms from 1131-3573 in four same-invocation pairs, the camera's
loading p99 0.7-0.9 vs 0.7-1.2 ms, the LLM's rate while loads run 158-236 vs 275-309 tokens/s
(bench/README.md "A background model's load under foreground protection"); the recommended
row since (RECOMMENDED).
"""

from __future__ import annotations

from typing import Any

#: The camera's side of every row here: rt+app+bg-own-host's keys.
BASE: dict[str, Any] = {"foreground_rt_priority": 1, "switch_interval_us": 500,
                        "camera_realtime": 2, "own_host": ["llm", "embedder", "loader"]}

#: The second host's own keys per row (name suffix after "rt+app+bg-own-host+").
SECOND: dict[str, dict[str, Any]] = {
    # Background steps on normal-priority workers instead of SCHED_IDLE ones.
    "bg-normal": {"background_sched": "normal"},
    # The step workers at nice 19 only (the compile child and session builds idle).
    "step-nice": {"background_step_nice": 19},
    # Two intra-op threads per background session, ONNX Runtime's spinning pool (the
    # unmanaged apps' default on this 2-CPU machine).
    "2t": {"options": {"intra_op_threads_background": 2}},
    "bg-normal+2t": {"background_sched": "normal",
                     "options": {"intra_op_threads_background": 2}},
    # The embedder's burst step on the burst's own thread at normal priority (no hand-off
    # to a worker).
    "here-normal": {"background_burst_here": "normal"},
    "here-normal+2t": {"background_burst_here": "normal",
                       "options": {"intra_op_threads_background": 2}},
    "here-normal+bg-normal+2t": {"background_burst_here": "normal",
                                 "background_sched": "normal",
                                 "options": {"intra_op_threads_background": 2}},
    # No channel kept for foreground work (none comes to this host).
    "0-reserved": {"reserved_channels": 0},
    # No quiet window (it has no paced stream to learn on this host).
    "quiet-off": {"quiet_window_us": 0},
    # Background lanes: each running step on a CPU of its own.
    "lanes": {"background_cpus": "lanes"},
    "here-normal+bg-normal": {"background_burst_here": "normal",
                              "background_sched": "normal"},
    "here-normal+step-nice": {"background_burst_here": "normal",
                              "background_step_nice": 19},
    "here-normal+0-reserved": {"background_burst_here": "normal", "reserved_channels": 0},
    "here-normal+lanes": {"background_burst_here": "normal", "background_cpus": "lanes"},
    # Sessions built on normal-priority threads (background_load): their intra-op pools'
    # threads inherit normal priority instead of SCHED_IDLE.
    "here-normal+load-normal+2t": {"background_burst_here": "normal",
                                   "background_load": "normal",
                                   "options": {"intra_op_threads_background": 2}},
    "here-normal+step-nice+load-normal+2t": {"background_burst_here": "normal",
                                             "background_step_nice": 19,
                                             "background_load": "normal",
                                             "options": {"intra_op_threads_background": 2}},
    # Every background thread of this host at normal priority and two intra-op threads a
    # session, spinning: the host runs its apps as they run unmanaged (ONNX Runtime's
    # defaults at nice 0), only the camera's FIFO threads above them.
    "all-normal+2t": {"background_burst_here": "normal", "background_sched": "normal",
                      "background_load": "normal",
                      "options": {"intra_op_threads_background": 2}},
    "all-normal+2t-nospin": {"background_burst_here": "normal", "background_sched": "normal",
                             "background_load": "normal",
                             "options": {"intra_op_threads_background": 2,
                                         "intra_op_spinning_background": 0}},
    # The GIL switch interval of this host (it has no FOREGROUND thread waiting for the
    # GIL): Python's 5 ms, or 100 µs.
    "here-normal+step-nice+sw-5ms": {"background_burst_here": "normal",
                                     "background_step_nice": 19, "switch_interval_us": 0},
    "here-normal+step-nice+sw-100": {"background_burst_here": "normal",
                                     "background_step_nice": 19, "switch_interval_us": 100},
    # The step workers' EEVDF slice at 100 µs (background_slice_us, set before they are
    # lowered): a nice-19 worker keeps its CPU against a woken normal thread only until its
    # slice ends (RUN_TO_PARITY), where a SCHED_IDLE one is preempted at once; the
    # embedder's round trip wakes two threads a batch.
    "here-normal+step-nice+slice-100": {"background_burst_here": "normal",
                                        "background_step_nice": 19,
                                        "background_slice_us": 100},
}

#: Rows that also change an app (bench keys, not the host's): the embedder app's client
#: spin (model.burst(spin_us=N), an app-side choice; bench/README.md "The embedder's opt-ins
#: combined").
APP: dict[str, dict[str, Any]] = {
    "here-normal+embedder-spin": {"embedder_spin_us": 1000,
                                  "second_host": {"background_burst_here": "normal"}},
    # Both hosts as root ([manager] driver_user; this VM's root lacks CAP_SYS_RESOURCE, so
    # only a root host may return from SCHED_IDLE): the second host's step workers lowered
    # only around their native runs (background_lower = "run"), at normal priority under
    # the GIL, against step-nice as root.
    "root+here-normal+step-nice": {"driver_user": "root",
                                   "second_host": {"background_burst_here": "normal",
                                                   "background_step_nice": 19}},
    "root+here-normal+lower-run": {"driver_user": "root",
                                   "second_host": {"background_burst_here": "normal",
                                                   "background_lower": "run"}},
    "here-normal+step-nice+embedder-spin": {
        "embedder_spin_us": 1000,
        "second_host": {"background_burst_here": "normal", "background_step_nice": 19}},
}

#: The product's form (bench row rt+app+bg-host: one [[driver]] with background_host =
#: true, its background lane a second host process): the best host-only keys as the lane's
#: own, [driver.background] (hal/host_config.lane_entry), the same keys SECOND gives the
#: hand-built second entry; and with the embedder app's client spin. "on-entry": the same
#: keys on the [[driver]] entry itself, for both hosts (they change only BACKGROUND steps,
#: and the main host serves none while every background app's grant goes to the lane; an
#: app demoted to BACKGROUND after it loaded on the main host would get them there).
LANE_BASE: dict[str, Any] = {"foreground_rt_priority": 1, "switch_interval_us": 500,
                             "camera_realtime": 2, "background_host": True}
LANE: dict[str, dict[str, Any]] = {
    "here-normal+step-nice": {"background": dict(SECOND["here-normal+step-nice"])},
    "here-normal+step-nice+embedder-spin": {"background": dict(SECOND["here-normal+step-nice"]),
                                            "embedder_spin_us": 1000},
    "on-entry+here-normal+step-nice": dict(SECOND["here-normal+step-nice"]),
    "on-entry+here-normal+step-nice+embedder-spin": {**SECOND["here-normal+step-nice"],
                                                     "embedder_spin_us": 1000},
    # embed22: the lane's follow-on poll (background_follow_us: drivers/follow.py), the
    # embedder app's adaptive spin (model.burst(spin_us=None): nn/burst_spin.py), both.
    "here-normal+step-nice+follow": {"background": {**SECOND["here-normal+step-nice"],
                                                    "background_follow_us": 500}},
    "here-normal+step-nice+spin-auto": {"background": dict(SECOND["here-normal+step-nice"]),
                                        "embedder_spin_us": "auto"},
    # The embedder app's two batches in flight (model.pipeline(), a burst each: so two
    # burst threads on the lane, each running its batch's step itself).
    "here-normal+step-nice+pipeline": {"background": dict(SECOND["here-normal+step-nice"]),
                                       "embedder_inflight": 2},
    # The embedder's repeats admitted in one pass (background_one_pass: state_repeat.py).
    "here-normal+step-nice+one-pass": {"background": {**SECOND["here-normal+step-nice"],
                                                      "background_one_pass": True}},
    # load28: the lane's background load (its compile child and the threads that build
    # the session from its artifacts) at nice 19, the step workers' weight, instead of
    # SCHED_IDLE (background_load_nice): what protect_foreground now sets (RECOMMENDED).
    "here-normal+step-nice+load-nice": {"background": {**SECOND["here-normal+step-nice"],
                                                       "background_load_nice": 19}},
    "here-normal+step-nice+follow+spin-auto": {
        "background": {**SECOND["here-normal+step-nice"], "background_follow_us": 500},
        "embedder_spin_us": "auto"},
}

#: The recommended config (README "Protecting a foreground stream"; what
#: protect_foreground = "on" implies: tests/bench/test_contention_runs.py holds them equal),
#: and (ABLATED, as it was before load28) with one part
#: left out at a time, for #15's ablation rows: without the camera app's FIFO thread
#: (``rt+bg-host+...``), without the host's FIFO burst thread and its switch interval
#: (``app+bg-host+...``), without either (``bg-host+...``: what a machine where npud lacks
#: CAP_SYS_NICE gets, the lane and its keys only). ``rt+app+bg-host`` (the lane untuned)
#: and ``rt+app`` (no lane) are the other two parts left out.
RECOMMENDED = "rt+app+bg-host+here-normal+step-nice+load-nice"
#: The recommended config as its ablation (WITHOUT) measured it, before load28 added the
#: load's nice value: each WITHOUT row is this row less one part.
ABLATED = "rt+app+bg-host+here-normal+step-nice"
_TUNED_LANE = {"background_host": True, "background": dict(SECOND["here-normal+step-nice"])}
WITHOUT: dict[str, dict[str, Any]] = {
    "rt+bg-host+here-normal+step-nice": {"foreground_rt_priority": 1,
                                         "switch_interval_us": 500, **_TUNED_LANE},
    "app+bg-host+here-normal+step-nice": {"camera_realtime": 2, **_TUNED_LANE},
    "bg-host+here-normal+step-nice": dict(_TUNED_LANE),
}

#: The embedder app's adaptive spin on npud's defaults (its steps on SCHED_IDLE workers).
SPIN: dict[str, dict[str, Any]] = {"managed+spin-auto": {"embedder_spin_us": "auto"}}

#: The rows bench/contention.py adds to its VARIANTS.
ROWS: dict[str, dict[str, Any]] = {
    **{f"rt+app+bg-own-host+{k}": {**BASE, "second_host": v} for k, v in SECOND.items()},
    **{f"rt+app+bg-own-host+{k}": {**BASE, **v} for k, v in APP.items()},
    **{f"rt+app+bg-host+{k}": {**LANE_BASE, **v} for k, v in LANE.items()}, **SPIN,
    **WITHOUT}


def embedder_knobs(knobs: dict[str, Any]) -> dict[str, Any]:
    """The embedder app's BenchApp fields a row's bench keys set (taken out of ``knobs``):
    ``embedder_spin_us``, its burst's spin_us (µs; "auto": None, the adaptive spin)."""
    spin = knobs.pop("embedder_spin_us", None)
    if spin is None:
        return {}
    return {"spin_us": None if spin == "auto" else float(spin)}


def second_entry(first: dict[str, Any], name: str,
                 overrides: dict[str, Any] | None) -> dict[str, Any]:
    """The second [[driver]] entry: the first one's keys, then ``overrides`` (its
    ``"options"`` merged into the first's options, not replacing them)."""
    over = dict(overrides or {})
    options = {**first["options"], **over.pop("options", {})}
    return {**first, **over, "name": name, "options": options}
