"""How npud starts a driver host: one [[driver]] entry plus the manager keys it needs.

Kept apart from the driver host itself so npud can build and JSON-encode a
host's config (``npu driver NAME --host-config-json``) without importing the
host (numpy, ONNX Runtime).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from npumanager.config import LANE_FIXED, Config
from npumanager.errors import InvalidArgument
from npumanager.paths import lane_name

#: Tensors above this many bytes go through a shared-memory pool when the client has one.
DEFAULT_INLINE_LIMIT = 64 * 1024
#: The [manager] keys that bound what one uid may make a driver host hold
#: (npumanager.drivers.bounds.Limits has a field of each name).
DRIVER_LIMIT_KEYS = ("max_steps", "max_jobs_per_uid", "max_jobs_per_connection",
                     "max_models_per_uid", "max_model_bytes_per_uid",
                     "max_prepare_bytes_per_uid", "max_pools_per_uid",
                     "max_pools_per_connection", "max_pool_bytes_per_uid")


@dataclass
class HostConfig:
    """A [[driver]] entry and the manager keys the host needs."""

    name: str
    plugin: str = "reference"
    #: defaults.toml's: three channels, one kept for foreground work (drivers/classes.py).
    channels: int = 3
    enforce_admission: bool = True
    thermal_cutoff: int = 500
    inline_limit: int = DEFAULT_INLINE_LIMIT
    grant_wait_s: float = 0.5
    inline_run_us: float = 150.0
    inline_idle_run_us: float = 5000.0
    max_model_bytes: int = 4 << 30
    socket_mode: int = 0o666
    admin_group: str | int | None = None
    max_frame: int = 1 << 20
    cache_max_entries: int = 4096
    cache_max_entries_per_uid: int = 512
    #: [manager] bounds (DRIVER_LIMIT_KEYS) that differ from the built-in defaults.
    limits: dict[str, int] = field(default_factory=dict)
    orphan_grace_s: float = 10.0
    #: Execution classes (drivers/classes.py): the foreground threshold, channels kept
    #: for foreground work, and how background threads are lowered ("idle", "nice",
    #: "normal") with the nice value for "nice".
    foreground_priority: int = 200
    reserved_channels: int = 1
    background_sched: str = "idle"
    background_nice: int = 10
    #: Background step workers at this nice value instead of ``background_sched``'s
    #: policy, where that is "idle" (-1: as background_sched says; drivers/steps.py says
    #: why); compiles and session builds follow background_load_nice instead.
    background_step_nice: int = -1
    #: A BACKGROUND model's load (the compile child and the host's threads that build its
    #: session) at this nice value instead, where background_sched is "idle" (-1: as
    #: background_sched says; drivers/classes.load_policy says why).
    background_load_nice: int = -1
    #: Where a BACKGROUND model compiles when the driver can hand it off
    #: (drivers/compile_worker.py): "process" (a lowered child process, off the driver's
    #: GIL) or "thread" (a lowered thread of the driver host).
    background_compile: str = "process"
    #: Where a BACKGROUND burst step's end is submitted (drivers/bg_ends.py): "thread" (a
    #: normal-priority thread of the host) or "worker" (the lowered worker that ran it).
    background_ends: str = "thread"
    #: The thread on which the host builds a BACKGROUND model's ONNX Runtime session from
    #: compiled artifacts (the compile child's, or the cache's): "lowered" (as
    #: background_sched says) or "normal" (drivers/prepare.py says what each measured).
    background_load: str = "lowered"
    #: How long a lowered background thread stays lowered (drivers/lowering.py):
    #: "thread" (for good, from its start) or "run" (only around its native runs and
    #: session builds: at normal priority while it holds the GIL).
    background_lower: str = "thread"
    #: glibc's mmap threshold for the host process and its compile child, KiB
    #: (hal/malloc_tune.py; 0: glibc's own, which slides up to 32 MiB).
    malloc_mmap_threshold_kb: int = 4096
    #: glibc's tunables for the compile child: "default", "keep" (no mappings, no trim:
    #: the next compile reuses the memory), "hugepages" (THP on malloc's memory) or
    #: "keep-hugepages" (hal/malloc_tune.py says what each cuts).
    compile_malloc: str = "default"
    #: Where a background load's work runs: "all" CPUs, "last" (the compile child and the
    #: host's lowered session builds on the highest CPU only) or "split" ("last", and the
    #: FOREGROUND burst threads off that CPU while a background load runs): .load_place.
    load_cpus: str = "all"
    #: The host process's GIL switch interval in microseconds (sys.setswitchinterval;
    #: 0 or less: Python's own, 5000): how long a thread that wants the GIL waits before it asks
    #: the holder to drop it (drivers/classes.py says what it bought).
    switch_interval_us: int = 0
    #: The quiet window around paced foreground frames, µs (drivers/quiet.py; 0: off).
    quiet_window_us: int = 1000
    #: After a paced frame ends, µs more with no background step starting (the window's
    #: tail, drivers/quiet.py; 0: none). Only with the window on. Off: not yet measured
    #: to help (drivers/classes.py).
    quiet_tail_us: int = 0
    #: A released model is freed off the host's lock where no paced foreground frame is
    #: near (drivers/quiet_release.py) instead of at once on the loop under the lock.
    quiet_release: bool = False
    #: The window holds background compiles too: the compile child is stopped around
    #: paced foreground frames, bounded (drivers/load_hold.py). Off: no measured gain yet.
    hold_loads: bool = False
    #: A burst's poll for its paced stream's next request, µs (drivers/anticipate.py; 0: off).
    burst_anticipate_us: int = 300
    #: After a BACKGROUND burst answer, its thread polls for the stream's next request for
    #: up to this long, µs, where the stream's recent gaps say it comes that soon
    #: (drivers/follow.py; 0: off).
    background_follow_us: int = 0
    #: A BACKGROUND burst repeat takes the one-pass admission where the dispatch has
    #: nothing to weigh for it (drivers/state_repeat.py).
    background_one_pass: bool = False
    #: Anticipation's one poll slot in turns between uids whose windows overlap
    #: (drivers/poll_turns.py); false: first come, first served (PollTurns vs FirstCome).
    burst_poll_turns: bool = True
    #: A paced stream's pause between phrases keeps its pace (drivers/anticipate.py PAUSE).
    burst_anticipate_pauses: bool = True
    #: The EEVDF slice of a burst's thread while it serves FOREGROUND steps, µs
    #: (hal/sched_slice.py; 0: the kernel's own, 1.4 ms here).
    foreground_slice_us: int = 0
    #: A burst's thread at SCHED_FIFO this priority while it serves FOREGROUND steps,
    #: applied by npud (drivers/rt_threads.py; 0: off, 1..10).
    foreground_rt_priority: int = 0
    #: A run at FIFO longer than this (µs) lowers the thread, which then does not ask
    #: again for a second (drivers/rt_policy.py).
    foreground_rt_max_run_us: int = 5000
    #: The EEVDF slice of the host's lowered background threads and compile child, set
    #: before they are lowered (a SCHED_IDLE thread's cannot be set), µs (0: the kernel's).
    background_slice_us: int = 0
    #: Where background steps run: "all" CPUs, "spare" (every CPU but the lowest), or
    #: "lanes" (each background step running at once on a CPU of its own: drivers/runqueue.py),
    #: "steer" (lanes unpinned, each steered off the others' CPUs: drivers/bg_place.py), or
    #: "lanes-except-loads" (lanes, none while a background model prepares).
    background_cpus: str = "all"
    #: Background threads in a cpu.idle cgroup: "auto" or "off" (hal/idle_cgroup.py).
    #: Off: measured to cost the contended camera (drivers/classes.py).
    background_cgroup: str = "off"
    #: A BACKGROUND burst step's run handed back to the burst's own thread, which records
    #: its end and answers (drivers/bg_handback.py), instead of its end going through the
    #: bg_ends thread first.
    background_handback: bool = True
    #: A BACKGROUND burst step the state starts at once runs on the burst's thread,
    #: lowered only for the run (drivers/bg_here.py), instead of on a lowered worker:
    #: "off", "lowered" (as background_sched says) or "nice" (nice background_nice).
    background_burst_here: str = "off"
    #: The group npud made for this host ("" = none): set by npud, never from a client.
    background_cgroup_dir: str = ""
    #: A background step that waited longer than this for the CPU at SCHED_IDLE makes the
    #: next one run at normal priority, ms (drivers/starve.py; 0: no bound).
    background_starve_ms: int = 200
    #: Who raises a starved background compile (drivers/compile_starve.py): "self" (only
    #: the compile child, only where the host may raise it itself) or "npud" (the host
    #: itself where RLIMIT_NICE lets it, npud on its request otherwise; compiles in the
    #: host bounded too: drivers/compile_watch.py). Opt-in: bench/README.md has the numbers.
    compile_raise: str = "self"
    options: dict[str, Any] = field(default_factory=dict)
    #: Its device's index in ``nn.devices()`` (the [[driver]] entry's position): what
    #: ``WorkInfo.device_number`` says, so npud charges work to the right device.
    device_number: int = 0
    #: The [fleet] section (the fleet cache tier; off unless it names Redis and trusted keys).
    fleet: dict[str, Any] = field(default_factory=dict)
    #: The [[driver]] entry (the host process) this device belongs to; "" = ``name`` (a
    #: host serving one device). See :func:`device_entries`.
    host: str = ""
    #: The device has a second host process, its background lane ([[driver]]
    #: background_host; service/host_lanes.py).
    background_host: bool = False
    #: Which of the device's hosts this is: "" (its main host) or "background" (set by
    #: npud for the second process, never from a client).
    lane: str = ""

    @property
    def host_name(self) -> str:
        return self.host or self.name

    @property
    def lane_name(self) -> str:
        """This host's socket and state-dir name (``NAME``, ``NAME.background``)."""
        return lane_name(self.name, self.lane)

    @classmethod
    def from_config(cls, cfg: Config, name: str, lane: str = "") -> HostConfig:
        """Device ``name``'s host; ``lane`` "background": its background lane's, the
        entry's [driver.background] keys over its own (:func:`lane_entry`)."""
        listed = device_entries(cfg)
        entries = [d for d in listed if d.get("name") == name]
        number = 0
        if entries:
            d = entries[0]
            number = listed.index(d)
        else:  # `npu driver X` for a driver the config does not list: X is the plugin
            template = Config().drivers()[0]
            d = {**template, "name": name, "plugin": name}
        if lane:
            d = lane_entry(d)
        mgr = cfg.section("manager")
        return cls(
            name=name,
            plugin=str(d.get("plugin", name)),
            channels=int(d.get("channels", 3)),
            enforce_admission=bool(mgr.get("enforce_admission", True)),
            thermal_cutoff=int(d.get("thermal_holdback_priority", 500)),
            inline_limit=int(d.get("inline_limit_bytes", DEFAULT_INLINE_LIMIT)),
            grant_wait_s=float(d.get("grant_wait_s", 0.5)),
            inline_run_us=float(d.get("inline_run_us", 150.0)),
            inline_idle_run_us=float(d.get("inline_idle_run_us", 5000.0)),
            max_model_bytes=int(d.get("max_model_bytes", 4 << 30)),
            socket_mode=int(mgr.get("socket_mode", 0o666)),
            admin_group=mgr.get("admin_group") or None,
            max_frame=int(mgr.get("max_frame", 1 << 20)),
            cache_max_entries=int(cfg.section("cache").get("max_entries", 4096)),
            cache_max_entries_per_uid=int(cfg.section("cache").get("max_entries_per_uid", 512)),
            limits={k: int(mgr[k]) for k in DRIVER_LIMIT_KEYS if k in mgr},
            orphan_grace_s=float(mgr.get("orphan_grace_s", 10.0)),
            foreground_priority=int(d.get("foreground_priority", 200)),
            reserved_channels=int(d.get("reserved_channels", 1)),
            background_sched=str(d.get("background_sched", "idle")),
            background_nice=int(d.get("background_nice", 10)),
            background_step_nice=int(d.get("background_step_nice", -1)),
            background_load_nice=int(d.get("background_load_nice", -1)),
            background_compile=str(d.get("background_compile", "process")),
            background_ends=str(d.get("background_ends", "thread")),
            background_load=str(d.get("background_load", "lowered")),
            background_lower=str(d.get("background_lower", "thread")),
            malloc_mmap_threshold_kb=int(d.get("malloc_mmap_threshold_kb", 4096)),
            compile_malloc=str(d.get("compile_malloc", "default")),
            load_cpus=str(d.get("load_cpus", "all")),
            switch_interval_us=int(d.get("switch_interval_us", 0)),
            quiet_window_us=int(d.get("quiet_window_us", 1000)),
            quiet_tail_us=int(d.get("quiet_tail_us", 0)),
            quiet_release=bool(d.get("quiet_release", False)),
            hold_loads=bool(d.get("hold_loads", False)),
            burst_anticipate_us=int(d.get("burst_anticipate_us", 300)),
            burst_poll_turns=bool(d.get("burst_poll_turns", True)),
            burst_anticipate_pauses=bool(d.get("burst_anticipate_pauses", True)),
            background_follow_us=int(d.get("background_follow_us", 0)),
            background_one_pass=bool(d.get("background_one_pass", False)),
            foreground_slice_us=int(d.get("foreground_slice_us", 0)),
            foreground_rt_priority=int(d.get("foreground_rt_priority", 0)),
            foreground_rt_max_run_us=int(d.get("foreground_rt_max_run_us", 5000)),
            background_slice_us=int(d.get("background_slice_us", 0)),
            background_cpus=str(d.get("background_cpus", "all")),
            background_cgroup=str(d.get("background_cgroup", "off")),
            background_handback=bool(d.get("background_handback", True)),
            background_burst_here=str(d.get("background_burst_here", "off")),
            background_starve_ms=int(d.get("background_starve_ms", 200)),
            compile_raise=str(d.get("compile_raise", "self")),
            options=dict(d.get("options", {})),
            device_number=number,
            fleet=dict(cfg.section("fleet")),
            host=str(d.get("host", "")),
            background_host=bool(d.get("background_host", False)),
            lane=lane,
        )

    @classmethod
    def group(cls, cfg: Config, name: str) -> list[HostConfig]:
        """The devices one host process serves: every device of the [[driver]] entry
        ``name``, or the one device ``name`` names (``DRIVER:DEVICE``), or a host of the
        plugin ``name`` that the config does not list."""
        listed = device_entries(cfg)
        mine = [str(d["name"]) for d in listed if d.get("host") == name]
        return [cls.from_config(cfg, n) for n in (mine or [name])]


#: Keys npud sets on each host itself, whatever its entry: at attach (enforce_admission)
#: and at its start (the group npud made for it).
NPUD_SET = ("enforce_admission", "background_cgroup_dir")


def entry_summary(hc: HostConfig) -> dict[str, Any]:
    """What a host tells npud of the entry it runs (hal.attach_manager's reply), for npud to
    name the keys that differ from the entry it would run it with (service/supervisor.py):
    each key's value, a digest for a table (options, fleet, limits: paths and credentials
    npud has no need to be told), none of those npud sets itself (:data:`NPUD_SET`)."""
    out: dict[str, Any] = {}
    for key, value in dataclasses.asdict(hc).items():
        if key in NPUD_SET:
            continue
        if isinstance(value, (dict, list)):
            text = json.dumps(value, sort_keys=True, default=str)
            value = "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:16]
        out[key] = value
    return out


def entry_differences(expected: Mapping[str, Any], running: Mapping[str, Any]) -> list[str]:
    """``KEY = RUNNING (npud's: EXPECTED)`` for each key of two entry summaries
    whose values differ, values as TOML writes them; a key only one side has (another
    version's host) is left out."""
    return [f"{key} = {_shown(running[key])} (npud's: {_shown(value)})"
            for key, value in expected.items()
            if key in running and running[key] != value]


def _shown(value: Any, limit: int = 80) -> str:
    """``value`` as TOML writes it, cut at ``limit`` characters (a host's reply is read as
    untrusted: it runs code an app chose)."""
    text = json.dumps(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def lane_entry(entry: dict[str, Any]) -> dict[str, Any]:
    """A [[driver]] entry as its device's background lane runs it: its [driver.background]
    keys over its own, less those the lane keeps (config.LANE_FIXED: refused at load)."""
    lane = entry.get("background")
    if not isinstance(lane, dict) or not lane:
        return entry
    return {**entry, **{k: v for k, v in lane.items() if k not in LANE_FIXED}}


def host_devices(entry: dict[str, Any]) -> list[str]:
    """The backend devices a [[driver]] entry serves as devices of their own: its
    ``options.devices`` when that lists two or more (one device, or none: the entry is one
    device named like the driver, as before)."""
    wanted = (entry.get("options") or {}).get("devices")
    if isinstance(wanted, list) and len(wanted) > 1:
        return [str(d) for d in wanted]
    return []


def device_entries(cfg: Config) -> list[dict[str, Any]]:
    """The [[driver]] entries expanded into one entry per device, in ``nn.devices()``
    order (API.md "Devices and budgets"): an entry whose ``options.devices`` lists several
    backend devices is one host process serving each as the device ``DRIVER:DEVICE``
    (its own socket, budget, channels and queue); the expanded entry has ``host`` (the
    entry's name) and ``options.devices`` narrowed to its one device. Any other entry is
    one device named like the driver."""
    out: list[dict[str, Any]] = []
    for entry in cfg.drivers():
        devs = host_devices(entry)
        if not devs:
            out.append(entry)
            continue
        if len(set(devs)) != len(devs) or any(not d or "/" in d or d in (".", "..")
                                              for d in devs):
            raise InvalidArgument(f"[[driver]] {entry.get('name')!r}: options.devices must "
                                  f"be distinct device names; got {devs}")
        name = str(entry["name"])
        if entry.get("background_host"):
            # One socket pair per host process: a second process for several devices
            # would need a lane per device; not built.
            raise InvalidArgument(f"[[driver]] {name!r}: background_host is for an entry "
                                  f"serving one device (options.devices lists {len(devs)})")
        for dev in devs:
            opts = {**entry.get("options", {}), "devices": [dev]}
            out.append({**entry, "name": f"{name}:{dev}", "host": name, "options": opts})
    return out
