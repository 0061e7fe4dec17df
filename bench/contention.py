"""Contention: foreground protection, measured against running unmanaged.

The same apps — camera (small conv net, 30 fps), voice (short bursts),
background LLM (multi-step decode loop), embedder (batches back to back) and an
app loading a background model — run as separate processes twice in one
invocation: unmanaged (ONNX Runtime in each process, default settings, loading
whenever it likes) and managed (a real npud and the reference driver, in a temp
runtime dir). Side by side: camera p50/p99/max and frames over 33 ms (alone,
with the background apps, while a background model loads), voice latency, LLM
tokens/s, embedder items/s, load time and peak memory. Targets, from this run:
managed camera p99 <= 1.3x camera alone and <= 0.5x unmanaged; background
throughput managed >= 80 % of unmanaged.

``--ablate`` adds managed runs with the driver's protection mechanisms switched
off in turn and on alone (see ``VARIANTS``). ``--one-queue`` runs the one-queue
device model instead (drivers/device_queue.py: every native run, the apps' own or
the driver's, holds one machine-wide token; a model of a small NPU, on this CPU):
unmanaged-1q-1t, unmanaged-1q, 1q-1ch and 1q, with ``--ablate`` also 1q-1ch
with a mechanism off.
Run it on a quiet machine (here: under ``flock -x /tmp/npu-cpu.lock``).
``--repeat N`` makes N invocations' worth of runs, interleaved (order alternated:
A B C, C B A, ...), prints each invocation's table and verdicts, then each ratio's
median and min-max over the N and the verdicts on the medians
(demo/contention_verdict.py).
Usage: python bench/contention.py
[--quick] [--ablate] [--one-queue] [--only unmanaged,managed,...] [--repeat N]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import contention_second_host as second_host

from npumanager.demo import contention_verdict as cv
from npumanager.demo.contention import (
    ContentionRun,
    RunResult,
    Timing,
    build_models,
    driver_config,
    format_rows,
    side_by_side,
    summary,
    verdicts,
)
from npumanager.demo.contention_split import SplitRun, format_split
from npumanager.words import plural

#: Managed driver configurations: name -> [[driver]] keys. "managed" is npud's default with
#: foreground protection off. Every row runs npud with `--protect-foreground off` (the keys
#: it sets and nothing more) unless it sets "protect_foreground" (None: npud's own default).
VARIANTS: dict[str, dict[str, Any]] = {
    # npud's defaults with protect_foreground = "off": 3 channels, 1 of them kept for
    # foreground work, background threads at SCHED_IDLE, background compiles in a child
    # process, a 1 ms quiet window around the camera's frames; camera, voice and the
    # embedder execute through bursts.
    "managed": {},
    # npud's product default: no protection key set, protect_foreground left to "auto"
    # (service/protection.py), which as root with CAP_SYS_NICE gives the recommended set
    # (rt+app+bg-host+here-normal+step-nice+load-nice). The camera asks for its thread
    # (model.burst(realtime=True)); npud's app_rt_priority comes from "auto".
    # The voice assistant asks for its thread too (model.burst(realtime=True), as an audio
    # app would), which protection's app_rt_importance = 200 grants to a VISIBLE app
    # (voice29; bench/README.md "The voice assistant under foreground protection").
    "default-auto": {"protect_foreground": None, "camera_realtime": 2, "voice_realtime": 2},
    # default-auto as before voice29: the voice does not ask (its host burst thread at FIFO,
    # its own thread at normal priority).
    "default-auto+voice-plain": {"protect_foreground": None, "camera_realtime": 2},
    # default-auto as before voice30: a pause between the voice's phrases breaks its pace
    # (drivers/anticipate.py PAUSE), so none of its requests is anticipated.
    "default-auto+no-pauses": {"protect_foreground": None, "camera_realtime": 2,
                               "voice_realtime": 2, "burst_anticipate_pauses": False},
    # The defaults before this table (2 channels, both open to background work, nice 10).
    "old-defaults": {"channels": 2, "reserved_channels": 0, "background_sched": "nice"},
    # The reserved channel taken from two channels (background keeps one), not kept at
    # all of two or of three.
    "2ch-1-reserved": {"channels": 2},
    "2ch-shared": {"channels": 2, "reserved_channels": 0},
    "3ch-shared": {"reserved_channels": 0},
    # The kernel-level mechanism off: step-boundary preemption in the queue only, and the
    # reserved channel alone.
    "step-preemption-only": {"background_sched": "normal", "channels": 2,
                             "reserved_channels": 0},
    "reserved-channel-only": {"background_sched": "normal"},
    # Background threads niced instead of SCHED_IDLE.
    "bg-nice-10": {"background_sched": "nice"},
    "bg-nice-19": {"background_sched": "nice", "background_nice": 19},
    # Session threads per class: the foreground's sessions get 2 intra-op threads.
    "+fg-2-threads": {"options": {"intra_op_threads_foreground": 2}},
    # The background's sessions get 2 intra-op threads (ONNX Runtime's pool, spinning).
    "+bg-2-threads": {"options": {"intra_op_threads_background": 2}},
    # The same with the pool's spinning off (intra_op_spinning_background = 0): its threads
    # block between kernels instead of keeping a core busy; they inherit SCHED_IDLE from
    # the lowered thread that builds the session. Not kept: the embedder -9 % (median of
    # four quick pairs; its batch is 12 kernels of ~14 µs, each waking the pool), the
    # camera's loading p99 2.4-3.8 vs 2.0-2.8 ms (bench/README.md: intra_op_spinning).
    "+bg-2-threads-nospin": {"options": {"intra_op_threads_background": 2,
                                         "intra_op_spinning_background": 0}},
    # Background models compile in the driver host (a lowered thread, the GIL shared)
    # instead of a lowered child process (drivers/compile_worker.py).
    "bg-compile-in-driver": {"background_compile": "thread"},
    # The camera and the voice assistant execute the plain way (an RPC per execution)
    # instead of through bursts.
    "no-bursts": {"bursts": False},
    # The embedder's back-to-back batches one RPC each instead of through a burst (an
    # app-side choice; bursts are the default since bursts got cheaper: 510c360).
    "embedder-no-burst": {"batch_bursts": False},
    # The embedder keeps two batches in flight through the SDK's pipeline (nn/pipeline.py)
    # instead of a loop of burst executions: its next batch waits queued in the driver
    # instead of behind its round trip (an app-side choice; unmanaged, the embedder is
    # one loop of session.run either way). Not the default: +11 % and +21 % items/s in
    # two paired full runs, but the camera's contended p99 went 2.1 -> 3.5 ms in one of
    # them (2.6 -> 2.0 in the other) and was 2.4-4.2 ms in four runs with it. Session 13
    # (three full runs): +4, +5, -6 %, the LLM -33, -39, -32 %, camera contended p99 2.0
    # vs 1.3, 1.7 vs 1.4, 1.3 vs 1.4 ms (bench/README.md: model.pipeline()).
    "embedder-pipeline": {"embedder_inflight": 2},
    # Three batches in flight.
    "embedder-3-in-flight": {"embedder_inflight": 3},
    # Two batches in flight, each burst's BACKGROUND step run on the burst's own thread
    # (background_burst_here, below).
    "embedder-pipeline+bg-burst-here": {"embedder_inflight": 2,
                                        "background_burst_here": "lowered"},
    # A fourth channel, also open to background work (1 of 4 reserved): the embedder's
    # two batches in flight can run side by side beside the LLM's step, as the unmanaged
    # embedder's two intra-op threads do.
    "4ch-1-reserved": {"channels": 4},
    # The driver host's GIL switch interval: 0.5 ms instead of Python's 5 ms, so a thread
    # serving a foreground execution asks a background thread for the GIL sooner.
    "switch-0.5ms": {"switch_interval_us": 500},
    # The quiet window (drivers/quiet.py): no background step starts while the camera's
    # frame runs or when it would reach within X of the camera's next frame.
    "quiet-2ms": {"quiet_window_us": 2000},
    "quiet-1ms": {"quiet_window_us": 1000},
    "quiet-off": {"quiet_window_us": 0},  # (the defaults before the window)
    # The window's tail (drivers/quiet.py): no background step starts for 1 ms after the
    # camera's frame ends, while the camera app takes its answer.
    "tail-1ms": {"quiet_tail_us": 1000},
    # The window holds background compiles too (drivers/load_hold.py): the compile child
    # is stopped (SIGSTOP) around the camera's frames instead of running through them at
    # SCHED_IDLE only.
    "load-hold": {"hold_loads": True},
    # Fair share among background apps (drivers/share.py): the uid over its share of
    # background time runs at SCHED_IDLE, the others at nice 19 (they preempt it).
    "share-19": {"background_sched": "share", "background_nice": 19},
    "share-19+quiet-2ms": {"background_sched": "share", "background_nice": 19,
                           "quiet_window_us": 2000},
    # Background steps pinned away from CPU 0 (drivers/steps.py: background_cpus).
    "bg-spare-cpus": {"background_cpus": "spare"},
    # Background lanes (drivers/runqueue.py): background steps running at once each on a
    # SCHED_IDLE thread kept on a CPU of its own, never two on one CPU. Not the default:
    # the embedder +7-28 % but the camera's p99 +0.2-1.6 ms contended and +0.9-3.3 ms
    # while a model loads in five full runs (bench/README.md: background_cpus).
    "bg-lanes": {"background_cpus": "lanes"},
    # Lanes steered instead of pinned (drivers/bg_place.py): lane k's thread is given, as
    # its step is handed over, every CPU but those the other background steps run on.
    "bg-steer": {"background_cpus": "steer"},
    # Lanes, but none while a background model prepares (the phase lanes cost most).
    "bg-lanes-except-loads": {"background_cpus": "lanes-except-loads"},
    # Lanes with a 2 ms quiet window: the camera's frames kept clearer of background steps
    # to buy back what the lanes cost it. One full run: the embedder's gain is gone (4576
    # vs 4530 items/s without lanes), the camera's p99 2.8 / 4.9 ms vs 2.6 / 4.2.
    "bg-lanes+quiet-2ms": {"background_cpus": "lanes", "quiet_window_us": 2000},
    # Background threads also in the host's top-level cpu.idle cgroup (hal/idle_cgroup.py;
    # opt-in: in four quick same-run pairs the contended camera p99 was worse with it,
    # 2.3/1.7/2.6/3.4 ms vs 1.5/1.2/1.6/1.5 without).
    "cgroup": {"background_cgroup": "auto"},
    # A background burst step's end submitted on the lowered worker that ran it, as before
    # drivers/bg_ends.py (the default: a normal-priority thread, npu-bgend).
    "bg-ends-worker": {"background_ends": "worker"},
    # The host builds a background model's session from the compile child's artifacts on
    # a normal-priority thread (npu-bgload) instead of a lowered one.
    "bg-load-normal": {"background_load": "normal"},
    # A starved background compile raised by npud where the host may not raise it (as
    # here: the host runs as its driver user without RLIMIT_NICE), compiles in the host
    # and sessions built on the lowered pool bounded too (service/host_raise.py,
    # drivers/compile_watch.py). Opt-in: six quick same-run pairs against the default
    # ("self"), camera p99 while a model loads 3.7, 4.6, 1.9, 1.7, 3.6, 2.7 vs 2.6, 3.2,
    # 3.4, 2.3, 2.7, 2.7 ms (median 3.2 vs 2.7), contended and throughput within noise.
    "compile-raise-npud": {"compile_raise": "npud"},
    # A BACKGROUND burst step's end through the bg_ends thread, as before the handback
    # (drivers/bg_handback.py: the lowered worker hands the run back to the burst's thread).
    "no-handback": {"background_handback": False},
    # A BACKGROUND burst step the state starts at once run on the burst's own thread,
    # lowered only for the run (drivers/bg_here.py), instead of on a SCHED_IDLE worker.
    # Opt-in: the embedder +2 % (eight quick pairs), the camera's loading p99 lower in
    # the quick pairs but not in a full run (bench/README.md: background_burst_here). Those pairs
    # measured the defaults: this VM's host may not return from a lowered run (RLIMIT_NICE
    # 0), so the steps stayed on the workers; see the *-root rows below.
    "bg-burst-here": {"background_burst_here": "lowered"},
    # The same, lowered to nice 19 for the run (a CFS weight of 15 against the other
    # background steps' SCHED_IDLE 3): the embedder takes more of a core it shares with
    # the LLM's step.
    "bg-burst-here-nice": {"background_burst_here": "nice"},
    # The same not lowered at all ("normal", drivers/bg_here.py: the embedder's runs at
    # normal priority, between the quiet windows): needs no RLIMIT_NICE, so unlike the two
    # above it runs here on a host started as a driver user (this VM). Not the default:
    # embedder +42 % and +50 % (two full runs, same invocations; 71 % of unmanaged in the
    # clean one), camera contended p99 1.9 vs 1.4 and 1.7 vs 1.4 ms, LLM -10 % and -8 %
    # (bench/README.md: background_burst_here).
    "bg-burst-here-normal": {"background_burst_here": "normal"},
    "embedder-pipeline+bg-burst-here-normal": {"embedder_inflight": 2,
                                               "background_burst_here": "normal"},
    # The three above with the host running as root ("root-host" their baseline): a host
    # started as a driver user without RLIMIT_NICE 20 (this VM: root lacks
    # CAP_SYS_RESOURCE) may not return from a lowered run, so there background_burst_here
    # leaves every step to the workers and bg-burst-here* measure the defaults.
    "bg-burst-here-root": {"background_burst_here": "lowered", "driver_user": "root"},
    "bg-burst-here-nice-root": {"background_burst_here": "nice", "driver_user": "root"},
    "bg-burst-here-normal-root": {"background_burst_here": "normal", "driver_user": "root"},
    # #15's embedder target (embed18): the opt-ins that each raised the embedder alone,
    # combined (bench/README.md: "The embedder's opt-ins combined"). They do not add up: every
    # combination with "normal" landed where "normal" alone did (66-72 % of unmanaged in
    # one quick invocation), bound by the batch's round trip. The step on the burst's own
    # thread at normal priority, and the workers (the steps it cannot take: those started
    # later, after the quiet window or a channel) at nice 19 instead of SCHED_IDLE.
    "bg-burst-here-normal+step-nice": {"background_burst_here": "normal",
                                       "background_step_nice": 19},
    # The embedder app opens its burst with a client spin (model.burst(spin_us=N), an
    # app-side choice as the pipeline is): its thread polls for the answer instead of
    # sleeping and being woken (the batch's "answer back to the app" stage, and the app's
    # wake-up that is most of its slowest 10 %: bench/README.md "Where the embedder's batch goes").
    # With "normal": 92 % and 76 % of unmanaged in two quick invocations, but the spinning
    # thread keeps a core busy and the LLM's SCHED_IDLE step loses it (52 %, 59 %), the
    # camera's contended p99 2.0-2.5 vs 1.0-1.3 ms; alone (the worker's hand-off kept) no
    # gain; 400 µs, shorter than most answers, no gain; with step-nice the LLM keeps its
    # share (101 %) and the embedder is back at 70 %.
    "bg-burst-here-normal+embedder-spin": {"background_burst_here": "normal",
                                           "embedder_spin_us": 1000},
    "embedder-spin": {"embedder_spin_us": 1000},
    "bg-burst-here-normal+embedder-spin-400": {"background_burst_here": "normal",
                                               "embedder_spin_us": 400},
    "bg-burst-here-normal+embedder-spin+step-nice": {"background_burst_here": "normal",
                                                     "embedder_spin_us": 1000,
                                                     "background_step_nice": 19},
    # Two batches in flight with "normal-pass" (drivers/bg_pass.py): the batch waiting for
    # the model runs on the burst thread that ended the other's step, after its answer,
    # instead of on a SCHED_IDLE worker. One quick invocation: 10178 items/s vs 9308 with
    # "normal" (one in flight with "normal": 11585), LLM 189 vs 261 tokens/s.
    "embedder-pipeline+bg-burst-here-normal-pass": {"embedder_inflight": 2,
                                                    "background_burst_here": "normal-pass"},
    # Lanes (none while a background model prepares) with the step on the burst's thread.
    "bg-lanes-except-loads+bg-burst-here-normal": {"background_cpus": "lanes-except-loads",
                                                   "background_burst_here": "normal"},
    "bg-lanes-except-loads+step-nice": {"background_cpus": "lanes-except-loads",
                                        "background_step_nice": 19},
    "bg-lanes-except-loads+bg-burst-here-normal+step-nice": {
        "background_cpus": "lanes-except-loads", "background_burst_here": "normal",
        "background_step_nice": 19},
    # glibc's own sliding mmap threshold in the host and its compile child (hal/
    # malloc_tune.py) instead of a fixed 4 MiB: released models' buffers stay in the heaps.
    "malloc-sliding": {"malloc_mmap_threshold_kb": 0},
    # The loading phase's load work (#15, load18; bench/load_cpu.py: the compile child 86 %
    # system time, 131 k minor faults a second, the host's session build 73 %): glibc's
    # tunables for the compile child (compile_malloc, hal/malloc_tune.py): "keep" reuses
    # the last compile's memory, "hugepages" faults 2 MiB at a time. compile-keep, three
    # full invocations against managed: the load's p50 241 / 225 / 237 vs 334 / 347 / 342
    # ms, the child 0.25-0.27 vs 0.42-0.43 cores; camera p99 loading 4.0 / 2.6 / 3.7 vs
    # 3.0 / 4.0 / 3.4 ms, contended 1.5 / 1.4 / 1.4 vs 1.1 / 1.1 / 1.1 (bench/README.md:
    # compile_malloc). Opt-in.
    "compile-keep": {"compile_malloc": "keep"},
    "compile-hugepages": {"compile_malloc": "hugepages"},
    "compile-keep-hugepages": {"compile_malloc": "keep-hugepages"},
    # The compile child and the background session builds on the highest CPU only
    # (load_cpus = "last", drivers/load_place.py), the other CPU free of load work; with
    # "split" the FOREGROUND burst threads also keep off it while a background model
    # loads. Camera p99 loading, three full invocations: last 5.8 / 5.1 / 2.8, split 5.5 /
    # 5.2 / 5.1, compile-keep+load-split 4.4 / 4.8 / 4.8 vs managed 3.0 / 4.0 / 3.4 ms:
    # worse (bench/README.md: load_cpus). Opt-in.
    "load-last": {"load_cpus": "last"},
    "load-split": {"load_cpus": "split"},
    "compile-keep+load-split": {"compile_malloc": "keep", "load_cpus": "split"},
    # One channel, like a small NPU (what `npu demo` configures; nothing to reserve).
    "1-channel": {"channels": 1},
    # The camera's own path (#15, cam15g). Driver anticipation (drivers/anticipate.py; on
    # by default, 300 µs): the camera's burst thread wakes before its frame is due, warms
    # up and polls for it, so no doorbell wake-up has to get past a background step.
    "anticipate-off": {"burst_anticipate_us": 0},
    "anticipate-150": {"burst_anticipate_us": 150},
    "anticipate-300": {"burst_anticipate_us": 300},
    "anticipate-500": {"burst_anticipate_us": 500},
    # The camera app opens its burst with a client spin (model.burst(spin_us=N)): its
    # thread stays on the CPU for the answer instead of waking up after it.
    "camera-spin": {"camera_spin_us": 1500},
    "camera-spin-3000": {"camera_spin_us": 3000},
    "anticipate-300+spin": {"burst_anticipate_us": 300, "camera_spin_us": 1500},
    # EEVDF per-task slices (#15, slice18; hal/sched_slice.py): the camera's burst thread
    # in the driver host at a 100 or 300 µs slice while it serves FOREGROUND steps
    # (foreground_slice_us), so that when it wakes it may preempt the thread on its CPU
    # (PREEMPT_SHORT) instead of waiting up to the next tick behind it; "+app": the camera
    # app's own thread too (model.burst(slice_us=100)), paired with "unmanaged-slice" (the
    # unmanaged camera's thread at the same slice: a gain is not the slice given to one
    # side only). Not kept: one quick screen, loading p99 4.9 / 5.2 ms host-side only vs
    # 3.9 managed; two full invocations, 4.6 / 5.2 (slice-100+app) vs 4.0 / 3.0, app-slice
    # 4.5 vs 4.0, the unmanaged camera at 100 µs 2.6 vs 0.4 ms (bench/README.md: "Per-task
    # slices").
    "slice-100": {"foreground_slice_us": 100},
    "slice-300": {"foreground_slice_us": 300},
    "slice-100+app": {"foreground_slice_us": 100, "camera_slice_us": 100},
    "slice-300+app": {"foreground_slice_us": 300, "camera_slice_us": 100},
    "app-slice": {"camera_slice_us": 100},
    # The lowered background threads and the compile child at a 10 ms slice, set before
    # they are lowered (background_slice_us): PREEMPT_SHORT lets a woken thread preempt
    # the running one early only if the wakee's slice is the shorter. Not kept: one full
    # pair, loading p99 4.5 vs 3.0 ms managed, contended 1.3 vs 1.3.
    "bg-slice-10ms": {"background_slice_us": 10000},
    "bg-slice-10ms+slice-100+app": {"background_slice_us": 10000,
                                    "foreground_slice_us": 100, "camera_slice_us": 100},
    # Background threads lowered only around their native runs and session builds
    # (drivers/lowering.py, #15 gil16): at normal priority while they hold the host's GIL.
    # Opt-in: against root-host, loading p99 3.6/2.9/3.6/3.8 vs 2.9/3.2/3.3/3.5 ms in four
    # quick pairs and 3.3 vs 2.2 in a full run, LLM -4 to -7 % (bench/README.md: background_lower).
    # Returning from SCHED_IDLE needs RLIMIT_NICE 20 (npud as root gives it where root
    # has CAP_SYS_RESOURCE); without it the host falls back to "thread", so on a machine
    # whose root lacks that capability (this VM) only a host running as root shows it:
    # "root-host" is the same-run baseline of "lower-run-root" (the bench's
    # "driver_user" sets [manager] driver_user).
    # The camera app's executing thread at SCHED_FIFO 2, granted by npud (npud's
    # [manager] app_rt_priority = 2, model.burst(realtime=True); service/rt_apps.py);
    # priority 2 so that it stays above a host thread at FIFO 1. Paired with
    # "unmanaged-rt". bench/README.md "Real-time app threads".
    "app-rt": {"camera_realtime": 2},
    # The camera's burst thread in the driver host at SCHED_FIFO 1 while it serves its
    # FOREGROUND frames (foreground_rt_priority: the unprivileged host asks, npud applies;
    # drivers/rt_threads.py, service/host_rt.py), with and without the host's GIL switch
    # interval at 500 µs. Two full invocations, paired with "managed": camera p99 while a
    # model loads 3.0 / 2.3 (rt) and 3.3 / 2.9 ms (rt-nosw) vs 4.2 / 3.4; contended
    # 0.9 / 0.9, 0.8 / 0.7 vs 0.8 / 0.8; LLM 448 / 440, 458 / 473 vs 501 / 487 tokens/s.
    # Off by default (bench/README.md "Real-time foreground threads").
    "rt": {"foreground_rt_priority": 1, "switch_interval_us": 500},
    "rt-nosw": {"foreground_rt_priority": 1},
    # Both: the host's burst thread at FIFO 1 while it serves the camera's FOREGROUND
    # frames and the camera app's executing thread at FIFO 2 (npud's grant, "app-rt"),
    # with "rt"'s switch interval. Paired with "unmanaged-rt". bench/README.md "Real-time app
    # threads".
    "rt+app": {"foreground_rt_priority": 1, "switch_interval_us": 500, "camera_realtime": 2},
    "lower-run": {"background_lower": "run"},
    "root-host": {"driver_user": "root"},
    "lower-run-root": {"background_lower": "run", "driver_user": "root"},
    # The background step workers at nice 19 instead of SCHED_IDLE, the compile child and
    # the session builds still SCHED_IDLE (background_step_nice; drivers/classes.py,
    # step_policy): a worker handed the host's GIL preempts the compile work at once
    # instead of waiting for a CPU behind it while the camera's burst thread sleeps on the
    # GIL (bench/trace_stacks.py, #15 trace17).
    "step-nice-19": {"background_step_nice": 19},
    # A released model freed off the host's lock where no paced foreground frame is near
    # (quiet_release, drivers/quiet_release.py) instead of at once on the event loop under
    # the lock: dropping the 32 MiB LLM's session holds the GIL 1.6-2.6 ms, once per load
    # (py-spy of the loading phase, bench/trace_loop.py). Not kept: loading p99 4.1 / 3.4
    # / 3.5 vs 3.3 / 3.6 / 5.2 ms in three full pairs (bench/README.md: quiet_release).
    "quiet-release": {"quiet_release": True},
    # The one-queue device model (--one-queue; drivers/device_queue.py): every native run,
    # here the driver's, holds one machine-wide token, first come first served, as on an
    # NPU with one queue; paired with unmanaged-1q-1t, whose apps' runs hold it and run as
    # the driver's do (one intra-op thread, so the same device on both sides), and with
    # unmanaged-1q (the apps' sessions unchanged). 1q-1ch is the faithful analogue: the
    # driver puts one job at a time on the device, so its own queue (priority at step
    # boundaries, quiet window, anticipation) decides who runs next. 1q keeps the default
    # 3 channels: a reserved channel's job then queues at the token behind background jobs
    # already there, in arrival order, as in a vendor queue.
    "1q-1ch": {"device_queue": True, "channels": 1},
    "1q": {"device_queue": True},
    # What carries over to one queue: 1q-1ch with one mechanism off.
    "1q-1ch-quiet-off": {"device_queue": True, "channels": 1, "quiet_window_us": 0},
    "1q-1ch-anticipate-off": {"device_queue": True, "channels": 1, "burst_anticipate_us": 0},
    "1q-1ch-bg-normal": {"device_queue": True, "channels": 1, "background_sched": "normal"},
    # The driver's sessions with ONNX Runtime's default 2 intra-op threads, as unmanaged-1q's
    # apps: their pools' threads spin after each run, the driver host burns both CPUs (1.96
    # cores contended) and the camera's p99 was 24.4 ms contended (1.1 ms in 1q-1ch, same
    # quick run): the spinning, not the queue, so 1q-1ch's device is the one-thread run.
    "1q-1ch-2t": {"device_queue": True, "channels": 1, "options": {"intra_op_threads": 2}},
    # Background work in a driver host process of its own (#15, iso17): a second reference
    # [[driver]] (SECOND_HOST, the same knobs), and the apps named here ask npud for it and
    # prepare on it; the camera and voice stay on the first host. Is sharing the host
    # process (its GIL, lock, event loop, the background session's build) what costs the
    # camera while a model loads? Each device has its own budget in npud (max_budget each).
    # Seven full invocations, order alternated (bench/README.md: "Background work in a
    # driver host of its own"), camera p99 while a model loads: bg-own-host 3.5 / 1.7 /
    # 2.8 / 2.3 / 2.0 / 2.7 / 2.5 ms vs managed 4.4 / 3.5 / 4.3 / 3.6 / 4.2 / 4.2 / 4.3
    # (lower in every pair, still 1.9-5.2x alone; A/A pairs with bg-own-host+quiet-off 3.4
    # vs 2.0, 1.9 vs 2.7), loader-own-host 3.9 / 4.1 / 3.5 / 3.3 (no gain); contended
    # bg-own-host worse in five of six clean pairs (the second host has no quiet window);
    # LLM +2-13 %, embedder -8 to +37 %. Isolation does not reach the target: not a
    # product option.
    "loader-own-host": {"own_host": ["loader"]},
    "bg-own-host": {"own_host": ["llm", "embedder", "loader"]},
    # The same without the quiet window, against quiet-off: a second host does not see the
    # camera's frames, so bg-own-host also loses the window (drivers/quiet.py is per host).
    # On this bench it is bg-own-host's configuration (no host has both a paced stream and
    # background steps): A/A pairs with it, 3.4 vs 2.0 and 1.9 vs 2.7 ms loading p99.
    "bg-own-host+quiet-off": {"own_host": ["llm", "embedder", "loader"],
                              "quiet_window_us": 0},
    # Both (#15, load20): rt+app's FIFO threads with bg-own-host's second host. Each
    # removes the other's remaining cause: rt+app's slow loading frames were host-lock
    # holds and GIL hand-offs in the camera's host (the background shares it), bg-own-host's
    # the camera's burst thread runnable behind the other host's SCHED_IDLE threads (FIFO
    # preempts those). "loader-own-host": only the loading app moved. Five full runs (a
    # --repeat 3 with unmanaged, managed, rt+app; a --frame-split one; one with
    # bg-own-host), camera p99 while a model loads 0.5 / 0.4 / 0.4 / 0.4 / 0.4 ms, 0.64-0.96x
    # its own alone (rt+app 1.2 / 1.2 / 1.4 / 1.8, 2.2-3.2x; managed 4.0 / 2.4 / 2.6, one run
    # with foreign CPU; bg-own-host 1.9 in the fifth), contended 0.63-0.90x; LLM -2..-5 %,
    # embedder -13..+5 % vs managed; loader-own-host 1.1 ms (3.4x). Not a product option yet
    # (two budgets, apps pointed at the second host by name): bench/README.md "Real-time threads and
    # a background host together".
    "rt+app+bg-own-host": {"foreground_rt_priority": 1, "switch_interval_us": 500,
                           "camera_realtime": 2, "own_host": ["llm", "embedder", "loader"]},
    "rt+app+loader-own-host": {"foreground_rt_priority": 1, "switch_interval_us": 500,
                               "camera_realtime": 2, "own_host": ["loader"]},
    # The product form of rt+app+bg-own-host (#15, bghost21): one [[driver]] entry with
    # background_host = true (service/host_lanes.py). One device and one budget; npud
    # spawns the second host process and tells the BACKGROUND requests' grants (the LLM,
    # the embedder, the loader) to it, and the SDK prepares them there; every app uses the
    # default device. bench/README.md "Real-time threads and a background host together".
    "rt+app+bg-host": {"foreground_rt_priority": 1, "switch_interval_us": 500,
                       "camera_realtime": 2, "background_host": True},
}

# The second host tuned for throughput, hand-built (rt+app+bg-own-host+*) and as the
# product's lane (rt+app+bg-host+*; #15, bgtune21, embed22; contention_second_host.py).
VARIANTS.update(second_host.ROWS)

#: The second driver host's [[driver]] name (variants with "own_host").
SECOND_HOST = "reference-bg"

#: Runs held against unmanaged besides "managed" (the same apps, devices or hosts chosen).
OWN_HOST = [n for n, k in VARIANTS.items() if k.get("own_host") or k.get("background_host")
            or k.get("protect_foreground", "off") != "off"]

#: Unmanaged runs: each app's own ONNX Runtime, default settings; "unmanaged-1q" on the
#: one-queue device model (each session.run holds the token). With ORT's default pool the
#: threads of apps not holding the token spin after their runs and keep both CPUs busy
#: (1.99 cores contended vs 1.08 in 1q-1ch, one quick run), which no NPU's waiting app
#: does: "unmanaged-1q-1t" runs each app's sessions on one intra-op thread (no pool, no
#: spinning), the driver's sessions' setting, so both sides have the same device;
#: "unmanaged-1q-nospin" keeps the 2 threads, not spinning
#: (session.intra_op.allow_spinning = 0).
UNMANAGED: dict[str, dict[str, Any]] = {
    "unmanaged": {},
    "unmanaged-1q": {"device_queue": True},
    "unmanaged-1q-1t": {"device_queue": True, "ort_config": {"intra_op_num_threads": "1"}},
    "unmanaged-1q-nospin": {"device_queue": True,
                            "ort_config": {"session.intra_op.allow_spinning": "0"}},
    # The camera app's thread at a 100 µs EEVDF slice (hal/sched_slice.py): the baseline
    # of the slice-*+app rows, whose managed camera asks for the same.
    "unmanaged-slice": {"camera_slice_us": 100},
    # The camera app's frame thread at SCHED_FIFO 2, set by the bench as root (an admin
    # by hand): the baseline of the rows whose managed camera asks npud for the same
    # (camera_realtime: model.burst(realtime=True), npud's [manager] app_rt_priority).
    "unmanaged-rt": {"camera_realtime": 2},
}


def run_names(ablate: bool, one_queue: bool) -> list[str]:
    """The runs of an invocation without --only: the one-queue rows (those with the
    device queue) only with --one-queue, their ablations only with --ablate too."""
    queued = [n for n, k in VARIANTS.items() if k.get("device_queue")]
    names = (["unmanaged", "managed"] if not one_queue
             else ["unmanaged-1q-1t", "unmanaged-1q", *queued[:2]])
    if ablate:
        names += [n for n in (queued[2:] if one_queue else VARIANTS)
                  if n not in names and (one_queue or n not in queued)]
    return names


def pairs(names: list[str]) -> list[tuple[str, str]]:
    """(unmanaged, managed) runs to hold against each other: managed against unmanaged,
    each one-queue run against unmanaged-1q."""
    out = [("unmanaged", n) for n in ("managed", *OWN_HOST) if n in names] \
        if "unmanaged" in names else []
    if "unmanaged-rt" in names:
        out += [("unmanaged-rt", n) for n in names
                if VARIANTS.get(n, {}).get("camera_realtime")]
    if "unmanaged-slice" in names:
        out += [("unmanaged-slice", n) for n in names
                if VARIANTS.get(n, {}).get("camera_slice_us")]
    for un in ("unmanaged-1q-1t", "unmanaged-1q", "unmanaged-1q-nospin"):
        if un in names:
            out += [(un, n) for n in names if VARIANTS.get(n, {}).get("device_queue")]
    return out


def npud_config(knobs: dict[str, Any]) -> dict[str, Any]:
    """npud's config for a managed variant's knobs (bench keys already taken out): the
    [[driver]] keys, ``driver_user`` for [manager], and ``own_host`` (apps on a second
    driver host): a second [[driver]] entry, SECOND_HOST, with the first one's keys and
    ``second_host``'s own (bench/contention_second_host.py)."""
    user = knobs.pop("driver_user", None)
    own_host = knobs.pop("own_host", None)
    second = knobs.pop("second_host", None)
    cfg = driver_config(**knobs)
    if user is not None:
        cfg["manager"]["driver_user"] = user
    if own_host:
        cfg["driver"].append(second_host.second_entry(cfg["driver"][0], SECOND_HOST, second))
    return cfg


def run_args(name: str) -> tuple[bool, dict[str, Any] | None, dict[str, Any]]:
    """A run's (managed, npud's config, ContentionRun's other keyword arguments) from its
    row's knobs (UNMANAGED or VARIANTS): the bench keys taken out, the rest npud's."""
    managed = name not in UNMANAGED
    knobs = dict(VARIANTS.get(name, {}) if managed else UNMANAGED[name])
    device_queue = bool(knobs.pop("device_queue", False))
    ort_config = knobs.pop("ort_config", None)
    bursts = bool(knobs.pop("bursts", True))
    batch_bursts = bool(knobs.pop("batch_bursts", True))
    inflight = int(knobs.pop("embedder_inflight", 1))
    spin = float(knobs.pop("camera_spin_us", 0))
    cam_slice = int(knobs.pop("camera_slice_us", 0))
    cam_rt = int(knobs.pop("camera_realtime", 0))
    voice_rt = int(knobs.pop("voice_realtime", 0))
    protect = knobs.pop("protect_foreground", "off")
    camera = {**({"spin_us": spin} if spin else {}),
              **({"slice_us": cam_slice} if cam_slice else {}),
              **({"realtime": cam_rt} if cam_rt else {})}
    embedder = second_host.embedder_knobs(knobs)  # (its spin)
    app_knobs = {**({"camera": camera} if camera else {}),
                 **({"voice": {"realtime": voice_rt}} if voice_rt else {}),
                 **({"embedder": embedder} if embedder else {})}
    devices = {app: SECOND_HOST for app in knobs.get("own_host", [])}
    cfg = npud_config(knobs) if managed else None
    if cfg is not None and (cam_rt or voice_rt) and protect == "off":
        # (else: what protection implies)
        cfg["manager"]["app_rt_priority"] = cam_rt or voice_rt
        if voice_rt:
            cfg["manager"]["app_rt_importance"] = 200  # (the voice is VISIBLE)
    return managed, cfg, {"bursts": bursts, "batch_bursts": batch_bursts,
                          "embedder_inflight": inflight, "app_knobs": app_knobs or None,
                          "device_queue": device_queue, "ort_config": ort_config,
                          "devices": devices, "protect_foreground": protect}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="short phases (about 15 s a run)")
    ap.add_argument("--ablate", action="store_true", help="also the ablation variants")
    ap.add_argument("--one-queue", action="store_true",
                    help="the one-queue device model instead: unmanaged-1q(-1t), 1q-1ch, 1q")
    ap.add_argument("--only", default="", help="comma-separated runs: "
                    + ", ".join([*UNMANAGED, *VARIANTS]))
    ap.add_argument("--json", default="", help="also write every run's numbers to this file")
    ap.add_argument("--device-time", action="store_true",
                    help="managed runs: poll the driver's step records (device time per app)")
    ap.add_argument("--frame-split", action="store_true",
                    help="managed runs: where the camera's frames went, each paired with "
                    "the driver's record of its burst request (demo/contention_split.py)")
    ap.add_argument("--repeat", type=int, default=1, metavar="N",
                    help="N invocations, interleaved (order alternated), then each ratio's "
                    "median and min-max over them, with verdicts on the medians")
    args = ap.parse_args()
    if args.repeat < 1:
        ap.error("--repeat must be at least 1")
    timing = Timing.quick() if args.quick else Timing()
    names = run_names(args.ablate, args.one_queue)
    if args.only:
        names = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = [n for n in names if n not in UNMANAGED and n not in VARIANTS]
        if unknown:
            ap.error(f"unknown run(s) {', '.join(unknown)}")
    models = build_models()
    orders = cv.run_order(names, args.repeat)
    invocations: list[list[RunResult]] = [[] for _ in orders]
    splits: list[dict[str, dict[str, Any]]] = [{} for _ in orders]
    t_start = time.monotonic()
    for inv, name in [(i, n) for i, order in enumerate(orders) for n in order]:
        results = invocations[inv]
        managed, cfg, kwargs = run_args(name)
        kind = SplitRun if args.frame_split else ContentionRun
        run = kind(name, managed, timing, models, cfg, device_probe=args.device_time,
                   log=lambda m: print(f"  [{time.monotonic() - t_start:5.1f}s] {m}",
                                       file=sys.stderr, flush=True), **kwargs)
        results.append(run.run())
        if isinstance(run, SplitRun):
            splits[inv][name] = run.frame_split
        if len(results) == len(names):
            results.sort(key=lambda r: names.index(r.name))  # the table's columns as given
            report(args, timing, names, results, splits[inv],
                   f" (invocation {inv + 1} of {args.repeat}: {', '.join(orders[inv])})"
                   if args.repeat > 1 else "")
    by_pair = cv.over_invocations(invocations, pairs(names))
    if args.repeat > 1:
        print(f"\ncontention, {args.repeat} invocations interleaved: each ratio's median "
              "(min-max) over them")
        print(format_rows(cv.summary_rows(by_pair)))
        for (un, m), agg in by_pair.items():
            print(f"\nverdicts on the medians, {m} against {un}:")
            for line in cv.lines(cv.medians(agg)):
                print(line)
    if args.json:
        import json

        runs = [[{**summary(r), "frame_split": sp.get(r.name, {})} for r in rs]
                for rs, sp in zip(invocations, splits, strict=True)]
        # One invocation: the list of its runs, as before (bench/contention_spread.py
        # reads either shape).
        Path(args.json).write_text(json.dumps(
            runs[0] if args.repeat == 1 else
            {"invocations": runs, "orders": orders, "repeat": cv.summary_json(by_pair)},
            indent=1))
    errors = [r for rs in invocations for r in rs if r.errors]
    return 1 if errors else 0


def report(args: argparse.Namespace, timing: Timing, names: list[str],
           results: list[RunResult], splits: dict[str, dict[str, Any]], which: str) -> None:
    """One invocation's table, frame splits, verdicts and errors."""
    print(f"\ncontention{which}: {plural(len(names), 'run')} ({'quick' if args.quick else 'full'} "
          f"phases: alone {timing.alone_s:g} s, contended {timing.contended_s:g} s, loading "
          f"{timing.loading_s:g} s; load {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs; "
          f"{'one uid per app' if os.getuid() == 0 else 'one uid, job priorities'})")
    print(format_rows(side_by_side(results)))
    for name, by_phase in splits.items():
        print()
        for phase, sp in by_phase.items():
            print("\n".join(format_split(name, phase, sp)))
    by = {r.name: r for r in results}
    for un, m in pairs(names):
        print(f"\n{m} against {un}:" if (un, m) != ("unmanaged", "managed") else "")
        for line in verdicts(by[un], by[m]):
            print(line)
    for r in results:
        for e in r.errors:
            print(f"error in {r.name}: {e}")


if __name__ == "__main__":
    raise SystemExit(main())
