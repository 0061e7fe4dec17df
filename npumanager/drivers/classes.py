"""Execution classes: effective priority mapped onto what the machine really schedules.

Step-boundary preemption (the run queue) decides *which* work gets a channel
next. On the reference driver a channel is a CPU thread, and once a
background step runs it competes for the cores with the foreground's step,
the foreground app's own process and everything else on the machine: the
kernel, not the queue, decides who runs. So the driver maps each job's
effective priority onto an execution class, a pure function of that priority,
and the shell (:mod:`.steps`, :mod:`.prepare`) applies it:

* ``BACKGROUND`` work runs on worker threads the kernel ranks below normal
  threads (``SCHED_IDLE``, or a high nice value): a foreground step, or the
  camera app's own process, takes a core from them at once instead of sharing
  it (CFS would give a nice-0 background thread half the core).
* A channel can be kept free for foreground work (``reserved_channels``): a
  foreground job then starts at once instead of waiting for a background step
  to end.
* Sessions are compiled with an intra-op thread count chosen per class, and a
  background model's compile runs in a lowered child process
  (:mod:`.compile_worker`, ``background_compile = "process"``), not on a
  lowered thread of the host: a thread still runs its Python (protobuf parsing
  of the model, copies of its weights) under the host's GIL, and a lowered
  thread holding the GIL while the kernel runs the camera instead is a
  priority inversion for the burst thread that serves the camera's next frame.

Measured (bench/contention.py, full phases, one run, 2 vCPUs, same-run
baseline; camera p50 / p99 / max in ms while a background model loads again
and again): compile in a child process 3.0 / 11.4 / 23.4, 0 of 232 frames
late; on a lowered thread of the host 3.8 / 36.1 / 53.5, 5 of 216 late (py-spy
--gil: the compile path's share of GIL samples fell from 148 to 13 in 6 s).
The price: a background load takes longer (p50 387 ms vs 174 ms: the child
runs at the background's priority and ships the weights back), and the
child's RSS while it lives.

What each mechanism bought, measured (bench/contention.py --quick, one run of
nine, 2 vCPUs under the bench lock, 2026-12-01; camera p50 / p99 ms with
voice + LLM + embedder, then p99 while a background model loads; LLM tokens/s
and embedder items/s; the unmanaged baseline of the same run: 0.4 / 4.5,
16.5; 109 and 5083):

=========================  ===========  =======  =====  ======
run                        contended    loading  LLM    embed
=========================  ===========  =======  =====  ======
defaults (nice 10, 2 ch)   3.2 / 10.0   13.8     187    2493
background threads normal  3.5 / 11.6   13.0     192    2476
background SCHED_IDLE      2.7 / 7.8    13.4     200    2553
+1 reserved of 2 channels  2.6 / 5.2    7.5      160    1284
3 channels, 1 reserved     1.8 / 6.8    8.8      200    2609
compile on a host thread   3.2 / 10.0   39.7     157    2519
foreground 2 ORT threads   4.0 / 43.2   46.0     93     1775
=========================  ===========  =======  =====  ======

So: compiling background models in a child process is kept on by default (its
row is the only one that moves the loading column by 3x, in every run: 36.1 vs
11.4 ms p99 in a full-length run). Lowered background threads (nice or
SCHED_IDLE) are kept but buy little on this machine (SCHED_IDLE against nice
10 went either way in two runs): CFS already wakes a mostly sleeping camera
promptly. A reserved channel halves the camera's wait
behind background steps but, taken from 2 channels, halves the embedder;
taken as a third channel (``channels = 3``, ``reserved_channels = 1``) it keeps
background throughput: the best row, left as configuration, not a default.
Two intra-op threads for the foreground on 2 cores are harmful (the camera's
threads then fight each other and the background) and stay off. Single quick
runs vary by about 2x in p99 on this VM: the compile row held in three runs
(one full-length), the reserved-channel, 3-channel and 2-thread rows in two.

Re-measured on 2026-12-01 after npud began pushing root's entry (bench/contention.py,
2 vCPUs, cpu-exclusive, each row's unmanaged baseline from its own run). The
unmanaged camera's contended p99 swings from 0.6 to 12.5 ms between runs (the
kernel wakes a sleeping camera promptly unless another process's spinning ORT
pool happens to hold the core), so ratios are taken against the managed run's
own "alone" phase. Camera p50 / p99 ms with voice + LLM + embedder:

====================================  ==========  ==========  ==========
run (driver config)                   quick #1    quick #2    full
====================================  ==========  ==========  ==========
2 ch shared, nice 10 (old defaults)   2.5 / 10.7
3 ch, 1 reserved, nice 10             1.2 / 5.4   1.7 / 7.3   1.5 / 5.4
3 ch, 1 reserved, SCHED_IDLE                      1.3 / 3.3   1.4 / 3.7
2 ch shared, SCHED_IDLE               2.3 / 6.0   2.3 / 6.9   2.3 / 6.7
2 ch, 1 reserved, nice 10             1.2 / 4.7
====================================  ==========  ==========  ==========

Hence the defaults: three channels with one reserved (a foreground execution
never waits for a background step to end: the camera's p50 halves, and
background work keeps two channels: embedder 3913 vs 2815 items/s in quick #1,
where taking the reserved channel from two channels halved it to 1409) and
SCHED_IDLE background threads (lower contended p99 than nice 10 in all four
runs that compared them; the full run: 3.7 ms = 1.27x the camera alone, LLM 233
vs 199 tokens/s, embedder 3084 vs 3091 items/s). A per-frame breakdown of the
3-channel run (bench/contention_diag.py) found no queueing left: the slow
frames' time went to the camera's own ORT run (0.5 ms -> 2.9 ms in the worst
1 %, sharing cores and the 8 MiB L3 with the LLM's 32 MiB of weights) and to
wake-ups of the camera app and the burst thread. The GIL switch interval
(0.5 ms instead of 5) did not help (8.7 and 5.1 ms vs 10.7 and 7.3 ms for its
nice-10 baseline in two runs: within the noise) and stays off.

With these defaults, two more full runs (unmanaged / managed, same run): camera
contended p99 2.7 / 5.8 and 0.7 / 4.9 ms (1.34x and 1.04x the managed camera
alone, whose own p99 moved between 4.4 and 4.7 ms); the old defaults 7.2 ms
in the second (14.9 ms while loading, 8.0 with the defaults). Tried and not
kept: the host's thread that loads a compile worker's result at nice 10 instead of SCHED_IDLE
(loading p99 7.4 vs 7.6 ms: the GIL it holds there was not the loading
phase's cost) and the embedder's batches through a burst (3088 vs 2645, 3372
vs 2759, 2707 vs 2833 items/s in three runs). Background throughput: the LLM
gets 160-240 % of its unmanaged rate (one ORT thread per session: unmanaged,
every app's ORT pool spins on both cores), the embedder 58-76 % (not split
per app yet; likely: each batch is an RPC through the host whose step waits
for a SCHED_IDLE thread, while the LLM's back-to-back steps always have work
for theirs); both apps' ratios averaged: 156 % and 127 % in those two runs.

Session 6 (bench/contention.py with a 30 s contended phase, 900 frames; per
phase the CPU of the run's processes, of everyone else's and steal, so a run
another user's compiler disturbed shows; cpu-exclusive, 2 vCPUs). Why the
unmanaged camera's p99 swung from 0.6 to 12.5 ms: its tail is a handful of
isolated stalls (mostly 12-18 ms, about three scheduler ticks; 3 to 12 per 900
frames, spread over the phase) among 0.5-1 ms frames, so its p99 (the
9th-worst frame) lands either on the plain frames or on a stall, as a run had
fewer or more than nine: 0.8, 1.1, 2.2 and 12.5 ms in four runs of the same
code, the max 16-40 ms in each. The managed
camera's tail is broad and steady instead (its 2 % worst all 3.3-6 ms). The
managed camera *alone* is 1.3-1.6 ms p50, 1.5-3.9 ms p99 (an RPC to another
process each frame), against 0.4-0.5 / 0.5-1.1 ms for ONNX Runtime in the
camera's own process, so "managed p99 <= 0.5x unmanaged" is out of reach for a
CPU-backed driver: the kernel's own scheduler already protects an unmanaged
camera that sleeps between frames, as no NPU queue does.

The quiet window (:mod:`.quiet`, ``quiet_window_us``) is the one mechanism
that moved the contended p99 in every paired run (same invocation, same
code): 3.1 vs 4.6, 3.3 vs 4.7, 3.4 vs 4.0 and 2.8 vs 3.9 ms (2, 1, 2 and 1 ms
windows) against the defaults before it (the last: 1.27x the camera alone,
0.22x unmanaged in a run where the unmanaged camera stalled). It costs the LLM
0-28 % of its tokens/s (still 1.7-2x its unmanaged rate) and the embedder
4-21 %. Hence ``quiet_window_us = 1000`` by default. What did not help:
fair share among background uids as kernel classes (``background_sched =
"share"``, :mod:`.share`: the embedder 2963 vs 2863 items/s, camera p99 5.1 vs
4.3 ms): the run queue never holds both background apps (two background
channels, one synchronous execution each) and the machine is not saturated
(1.7-1.8 cores busy), so the embedder is bound by the latency of its
executions, not by its share; its batches through a burst instead of an RPC
each did help (4076 vs 2906 items/s with the LLM decoding, one npud). ONNX
Runtime's spinning is moot with one intra-op thread per session (no pool).

Session 7, with the window the default (one full run, cpu-exclusive): camera
contended p99 3.3 ms (window) vs 5.2 ms (quiet-off), max 6.4 vs 21.8. Where
the embedder's throughput goes (68 % of unmanaged in that run): its batch
takes 0.70 ms p50 unmanaged (ONNX Runtime's default pool, two threads, in the
app) and 2.24 ms managed (one intra-op thread, the round trip, the wait for a
SCHED_IDLE worker and the window's holds); without the window 1.98 ms (76 %).
With two batches in flight (``embedder-2-in-flight``, an app-side choice: two
threads, a burst each, so the next batch waits queued in the driver instead of
behind the round trip) it reached 3923 items/s, 95 % of unmanaged, with the
camera's contended p99 unchanged (3.3 ms) and the LLM at 111 tokens/s (128 %
of unmanaged). The loading phase's slowest 5 % of frames ended spread evenly
over their loads' fifths (4 5 4 3 5 of 21): no single stage of a load (the
grant, the compile child, the host loading the result) causes them; the whole
load keeps the second core busy (1.87 cores used against 1.59 without it).

Session 8 (full runs, cpu-exclusive; a run's unmanaged baseline from the same
invocation). The embedder through the SDK's pipeline (``model.pipeline()``, two
batches in flight: the next one waits queued in the driver, not behind the round
trip): 4700 vs 3875 and 3820 vs 3438 items/s for one in flight in the same run,
but the camera's contended p99 2.0 vs 2.6 and 3.5 vs 2.1 ms, and 2.4-4.2 ms in
the four runs that had it as the bench's default; so the bench's embedder keeps
one batch in flight (row embedder-pipeline). Against the unmanaged embedder of
each run the pipeline reached 76 %, 91 %, 74 %, 107 % and 98 %; that baseline
itself moved from 3315 to 6147 items/s between clean runs (no foreign CPU).
Neither a third batch in flight nor a fourth channel open to background work
added anything in a full run (3951 and 3880 vs 3923 items/s).
The load hold (:mod:`.load_hold`, ``hold_loads``: the compile child stopped around
the camera's frames, bounded) reached the child hundreds of times per load
(tests/security/test_load_hold.py saw 591 stops) but did not move the loading
phase's p99: with / without 6.7 / 5.4, 5.1 / 5.7, 8.3 / 9.6 and 5.4 / 4.9 ms in
four paired runs, so it is off by default. What it leaves: after the child, the
host builds the ONNX Runtime session from the child's artifacts (45-95 ms of
native work per load of the 32 MiB model, GIL released; weights copied and
prepacked) on a lowered thread of the host itself, and the loader app writes the
model into a memfd at normal priority; the slowest loading-phase frames stay
spread over the whole load. Identical configurations differed by up to 1.7x in
the camera's contended p99 between runs of one invocation (load-hold and managed
do not differ in that phase: 1.8 vs 3.0 ms in one run), so only pooled runs
(bench/contention_spread.py) say anything below that.

Session 9: where the managed camera's slow frames go, from a kernel scheduler trace
(bench/contention_trace.py: every context switch and wake-up on the machine, CLOCK_MONOTONIC,
laid next to each frame and the driver's record of its burst request; quick runs, 2 vCPUs,
kernel 6.18 with EEVDF, HZ 250, no kernel preemption):

* ONNX Runtime's pool threads are not it: with one intra-op thread per session (both
  classes' default) a session creates no pool thread (one made with two adds two, and they
  inherit the creating thread's SCHED_IDLE), so nothing spins either. The host had 5
  SCHED_IDLE threads (npu-bg_0..2 for steps, npu-bgcompile_0..1 for loads) and 7 normal
  ones (event loop, burst threads, foreground channels), none of them ORT's.
* Nor the GIL in the host's load of a background model: building the session from the
  compile child's artifacts (32 MiB) left a Python counter thread gaps of 3.0-4.6 ms at
  most, the same as a sleep on that busy machine; freeing the LLM's session holds it
  0.2 ms. (Building one from the 32 MiB ONNX bytes holds it 20-23 ms, the protobuf
  parse: the child does that.)
* The camera app's thread, after the driver answered, waited 2-4.7 ms runnable while a
  SCHED_IDLE step worker (npu-bg_N) held the CPU: in 4 of the 6 slowest loading-phase
  frames of one run, the slowest of the next (3.3 ms behind npu-bg_0). The step had
  started the moment the frame ended. Under EEVDF SCHED_IDLE is a weight (3 against
  1024) plus a wake-up preemption rule, not a strict priority: a normal thread that is
  not eligible (it ran a moment ago: a preemption, a wake-up with negative lag) is passed
  over for an eligible SCHED_IDLE one, which keeps the CPU until the next tick. (A
  normal thread burning 1 ms every 20 ms beside two SCHED_IDLE spinners: 1 frame in 282
  waited 2.6 ms, none without them.) Hence the quiet window's tail (:mod:`.quiet`,
  ``quiet_tail_us``): no background step starts for T after a paced frame ends. Three
  quick runs (180 contended frames each), tail 1 ms vs none, camera p99: contended 9.3
  vs 1.2 (the tail's run saw 0.2 cores of foreign CPU), 3.3 vs 2.2, 1.7 vs 1.3 ms;
  loading 5.1 vs 5.2, 2.8 vs 5.9, 4.1 vs 4.2 ms. Not a gain that shows above the noise
  (and the tail's run went first each time), so it stays off.
* Other slow frames waited behind the loader app's own normal-priority thread (its
  memfd write, 2.2 ms: the app's, as unmanaged) and behind processes outside the run
  (other users' test runs: up to 9 ms of CPU inside one 5 ms frame in the first run,
  which had the worst contended tail, 12.8 ms p99): the run-to-run spread of the
  contended p99 follows the foreign CPU each phase saw.
* Slow loading-phase frames by cause, two quick traced runs (34 frames over 1.3x the
  camera-alone p99 of 300): behind a SCHED_IDLE host thread on the CPU the camera's
  thread or its burst thread waited for, 8 frames and 21.4 ms of excess; the burst
  thread blocked (on a CPU, not runnable: the GIL or the host's lock) before it saw the
  request, 9 and 11.7 ms; a slow ORT run (the other core busy), 6 and 8.1; unexplained,
  5 and 8.3; the loader app's own thread, 2 and 2.7; processes outside the run, 2 and
  2.0; a vCPU waking from idle, 2 and 3.2. While the burst thread was blocked, host
  step workers at SCHED_IDLE waited runnable (npu-bg_1 3.6 ms in one run): a lowered
  thread holding the GIL or the lock, preempted, is a priority inversion. One holder
  the driver controls: a BACKGROUND burst execution's step submits its own end, under
  the host's lock, from the SCHED_IDLE worker that ran it (host._burst_step_done), so
  that no loop wake-up is needed. Handing that end to the event loop instead was tried
  and not kept this session: it changes the burst path's design (test_burst_shell's
  "no loop wake-up" tests) and was not measured. Session 10 hands it to a thread of its
  own at normal priority instead (:mod:`.bg_ends`): no loop wake-up, and no lowered
  thread ever holds the host's lock for a step's end.
* The compile child built its throwaway session with ONNX Runtime's weight prepacking:
  now off (the blobs are byte for byte the same), half the child's CPU per load of the
  32 MiB LLM (156 -> 77 ms, 119 -> 54 ms). The host's own load keeps prepacking: without
  it the LLM's load takes 15-26 ms instead of 56-64, but the embedder's batches run
  twice as long.

Session 10: a cpu.idle cgroup for the background threads (``background_cgroup``,
hal/idle_cgroup.py). Under EEVDF a SCHED_IDLE thread is only a weight of 3: where the
waking foreground thread is not eligible (it ran a moment ago), the idle thread keeps the
CPU until the next tick. In a top-level group with ``cpu.idle = 1`` the comparison is made
between that group and the waking thread (or its own top-level group): an idle entity there
is preempted at once (check_preempt_wakeup_fair: cse_is_idle && !pse_is_idle) and weighs
the minimum. The group must sit at the top: nested in a normal group it is idle only
against its siblings, and measured that way it is worse than SCHED_IDLE alone
(bench/cgroup_idle.py, row "nested"). The micro-test (one spinner per CPU beside a camera
process waking every 33 ms; three rounds each, cpu-exclusive, foreign CPU 0.04-0.09 cores;
p99 / max in ms):

========================  ==========================  ==============================
spinners                  wake-up lateness (15 s)     wait after a driver's answer
                                                      (--pingpong, 12 s)
========================  ==========================  ==============================
none                      0.28-0.62 / 0.41-3.5        0.10-0.14 / 0.13-0.19
SCHED_IDLE, root group    0.10-0.13 / 0.15-0.85       0.07-0.12 / 0.10-1.55
normal, cpu.idle group    0.10-0.11 / 0.12-8.7        0.05-0.08 / 0.09-2.4
SCHED_IDLE + cpu.idle     0.11-0.14 / 0.13-0.26       0.03-0.07 / 0.07-0.16
nested cpu.idle group     2.4-4.3 / 3.5-7.5           0.06-3.5 / 2.4-3.5
========================  ==========================  ==============================

On a quiet machine the stall is rare either way (the p99s are alike); the idle group
with SCHED_IDLE kept the worst frame under 0.3 ms in all six rounds, SCHED_IDLE alone
had 0.85 and 1.55 ms, and on a loaded machine (an earlier run, 0.1-0.9 cores of others)
SCHED_IDLE alone reached 6.8 ms p99 where the group stayed at 1.05.

In bench/contention.py (variant ``cgroup``; ``no-cgroup`` while it was the default).
One quick run, six configurations in one invocation (cpu-exclusive, no
foreign CPU; camera p99 contended / loading, ms; LLM tokens/s, embedder items/s):
managed 2.3 / 3.9 and 1.7 / 5.8, 181 and 181, 3571 and 3687; no-cgroup 1.5 / 4.6 and
1.2 / 5.6, 168 and 208, 3787 and 3651; background_cpus = "spare" 2.4 / 5.8, 181, 2175
(still harmful: the embedder -40 %); unmanaged 0.5 / 0.7, 117, 5701. Within a quick run's
noise the group neither helps nor harms the contended camera; it stayed on at first: the
micro-test's worst frames are lower with it and it costs nothing measurable.
Two more quick pairs (the coordinator, after the full runs below; same invocation each):
camera contended p99 2.6 and 3.4 ms with the group vs 1.6 and 1.5 without (loading 3.9 and
6.1 vs 5.0 and 4.7). Four pairs of four had the contended camera worse with the group, so it
is now off by default (``background_cgroup = "off"``), an opt-in until a trace says why the
whole system's tail rises where the micro-test's falls.
Full runs of the defaults (group + :mod:`.bg_ends`; unmanaged / managed, same run):
two runs, F1 / F2: camera contended p99 0.6 / 1.6 and 3.3 / 2.3 ms (1.26x and 1.88x the
managed camera alone; 2.74x and 0.70x unmanaged, whose p99 again followed its few stalls),
while a model loads 0.5 / 3.4 and 0.6 / 3.5 ms (2.63x, 2.86x alone), LLM 117 / 222 and 95 /
201 tokens/s, embedder 6345 / 3647 and 5004 / 3498 items/s (57 %, 70 %). That is session 9's
range (contended 0.41-1.33x, loading 1.84-3.35x): neither mechanism moved the camera's tail
measurably, and the loading phase's 3.4-3.5 ms p99 is where it was.
The end of a BACKGROUND burst step now runs on a normal thread (:mod:`.bg_ends`): 0.07-0.08
cores at normal priority in these runs (the LLM's steps' ends), which the SCHED_IDLE worker
used to do while holding the host's lock; no same-run ablation of it yet (it has no
switch), and no trace of the loading phase's causes after it.

Session 12: lowering a background thread only around its native work (``background_lower
= "run"``, :mod:`.lowering`): the step worker runs its Python at normal priority (GIL held)
and switches to SCHED_IDLE just for ONNX Runtime's run, which releases the GIL; the thread
that builds a background session likewise. Two quick traces each (bench/trace_sleeps.py: the
burst thread's sleeps in slow loading frames by the thread that woke it, a GIL or lock
hand-over naming the holder): a step worker woke it after 0.5 and 2.9 ms with "run" against
11.9 (one 11 ms frame) and 0 ms with threads lowered for good, the host's event loop after 4.1
and 6.1 against 2.8 and 1.7 ms: a step worker's GIL held while descheduled is rare, and the
event loop's holds are the larger share. It did not move the camera's tail, and it costs
throughput (host running as root, this VM's root lacking CAP_SYS_RESOURCE
for the RLIMIT_NICE that lets a driver user return to nice 0; "run" vs "thread", same
invocations; camera p99 while a model loads, ms): four quick pairs 3.6 / 2.9 / 3.6 / 3.8 vs
2.9 / 3.2 / 3.3 / 3.5, a full run 3.3 vs 2.2 (contended 1.1 vs 0.8); LLM 4-7 % fewer tokens/s
in every pair (498 vs 527 full), embedder fewer items/s in four of five (7933 vs 9139 full).
So it stays opt-in. Switches cost 1.0 µs a pair (bench/lower_switch.py). The host as root is
no better a baseline than the driver user (root lets the compile child's starvation bound
raise it, :mod:`.compile_starve`): loading p99 3.4 / 3.2 / 2.1 / 2.7 vs 3.3 / 2.2 / 5.0 / 3.5 ms
against the same defaults as the unprivileged driver user in four quick pairs (2.2 vs 4.4 in
the full run above): the noise of one run.

Session 13: kernel stacks of the loading phase's slow frames (bench/trace_stacks.py,
``contention_trace.py --stacks``; bench/README.md, "What the camera's path sleeps on while a model
loads"): the camera's burst thread asleep on the GIL 18-35 % of their excess in three
quick traces, on the host's lock 5-8 %, runnable behind SCHED_IDLE work 14-22 %, behind
the loader app 1-21 %; no page-fault I/O or mmap_lock. The GIL's holders were mostly
waiting for it themselves, rooted in SCHED_IDLE threads handed the GIL (CPython 3.11
hands it to one waiter at a time) and waiting for a CPU behind the compile work. Step
workers at nice 19 (``background_step_nice``, :func:`step_policy`) did not lower the
loading p99 in two full pairs (4.2 vs 4.2, 7.1 vs 3.9 ms; the embedder +24-26 %, the LLM
-8-10 %), nor did freeing released models at quiet moments (:mod:`.quiet_release`: three
pairs, no gain beyond the spread): both opt-ins.

On an accelerator with one hardware queue and no CPU contention, only the
queue-level parts carry over (the class of a job, the reserved channel as a
reserved queue or context, the quiet window: there a background step started
just before a frame delays the frame by the step's whole length); the thread
priorities map onto the backend's own priority knobs (OpenVINO MODEL_PRIORITY,
CUDA stream priorities). Two in flight (the pipeline) matters more there: an
accelerator left idle while a reply travels and the next request comes back is
throughput lost outright, where here the other core was busy anyway. The load
hold's policy (pure, bounded) carries over as the time a compile or a weight
upload to device memory may run; its SIGSTOP does not (a compile there runs on
the host CPU, not on the device's queue).
"""

from __future__ import annotations

from dataclasses import dataclass

# The class rule itself is the HAL's (npud routes grants by it too): re-exported here.
from npumanager.hal.exec_class import DEFAULT_FOREGROUND_PRIORITY as DEFAULT_FOREGROUND_PRIORITY
from npumanager.hal.exec_class import ExecClass as ExecClass
from npumanager.hal.exec_class import exec_class as exec_class


@dataclass(frozen=True)
class Protection:
    """The pure core's knobs ([[driver]] keys); the shell has its own (thread policy)."""

    #: Effective priorities at or below this are FOREGROUND, above it BACKGROUND.
    foreground_priority: int = DEFAULT_FOREGROUND_PRIORITY
    #: Channels background work may never take: kept free for foreground work.
    reserved_channels: int = 0

    def reserved(self, channels: int) -> int:
        """The reservation that leaves background work at least one channel."""
        return max(0, min(self.reserved_channels, channels - 1))


def may_start(cls: ExecClass, background_running: int, channels: int, reserved: int) -> bool:
    """May a job of ``cls`` take a free channel while ``background_running`` background
    steps run and ``reserved`` of the ``channels`` are kept for foreground work?
    Foreground work takes any free channel; background work at most
    ``channels - reserved`` of them at once, whichever channels those are."""
    return cls is ExecClass.FOREGROUND or background_running < channels - reserved


def step_policy(background_sched: str, background_nice: int, step_nice: int
                ) -> tuple[str, int]:
    """The background step workers' policy and nice value: ``background_sched``'s, or
    with ``step_nice`` 0-19 (``background_step_nice``) where that is "idle", nice
    ``step_nice``; the host's compile and load threads keep ``background_sched``'s.

    Why (#15, kernel stacks of the loading phase's slow frames, bench/trace_stacks.py): a
    step worker takes the host's GIL back after each run, and CPython hands a dropped GIL
    to one waiter at a time, oldest first. A SCHED_IDLE worker handed it waits for a CPU
    behind the compile child and the session build, SCHED_IDLE as well (no preemption
    among them), while the GIL is free and the camera's burst thread sleeps on it: in
    two quick traces the burst thread slept on the GIL 12 and 70 ms of the slow frames'
    70 and 212 ms excess, its holders mostly waiting in turn for such a worker. A woken
    thread at a nice value preempts a SCHED_IDLE one at once."""
    return _instead_of_idle(background_sched, background_nice, step_nice,
                            "background_step_nice")


def load_policy(background_sched: str, background_nice: int, load_nice: int
                ) -> tuple[str, int]:
    """A BACKGROUND model's load's policy and nice value (the compile child, every thread
    of it, and the host's threads that build the session from its artifacts):
    ``background_sched``'s ("share" compiles at "idle": fair share is for steps), or with
    ``load_nice`` 0-19 (``background_load_nice``) where that is "idle", nice ``load_nice``.

    Why (#15, load28): at SCHED_IDLE a load runs only where no other thread wants the CPU,
    at a weight of 3 beside other SCHED_IDLE threads. Where the background steps run at
    a nice value (``background_step_nice``; an embedder's steps on its burst's own thread,
    ``background_burst_here = "normal"``: foreground protection's lane), one background
    app's load waits behind the other background apps' steps, a class it belongs to:
    bench/load_cpu.py on the lane (one 15 s loading phase each), the compile 1045 ms and
    the session build 403 ms of a 1536 ms load (p50) at SCHED_IDLE, 588 and 254 of 896 at
    nice 19, against 366 and 157 of 563 with protection off, the same CPU time per load.
    At the steps' nice value the load shares the CPU with them as their equal; the
    foreground's threads (SCHED_FIFO under protection, nice 0 otherwise) still win."""
    sched = "idle" if background_sched == "share" else background_sched
    return _instead_of_idle(sched, background_nice, load_nice, "background_load_nice")


def _instead_of_idle(background_sched: str, background_nice: int, nice: int, key: str
                     ) -> tuple[str, int]:
    if not -1 <= nice <= 19:
        raise ValueError(f"{key} must be between -1 and 19, not {nice}")
    if background_sched == "idle" and nice >= 0:
        return "nice", nice
    return background_sched, background_nice
