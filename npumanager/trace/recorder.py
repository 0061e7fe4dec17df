"""Record what npud and its drivers do, from outside, as an admin client.

While recording, the recorder polls npud's dump (every ``interval`` s: budget,
thermal status, the live requests) and each driver's ``device.trace`` (every
execution step with its channel, uid, feature and times, which the driver keeps
while someone polls). When it stops it asks npud for every decision taken since
the recording began (``decisions``): the exact times of each (requested,
granted, loaded, asked to unload and why, revoked, ended), grouped into one story
per request — so a request that began and ended between two polls is in the
trace too. All times are CLOCK_MONOTONIC, the clock npud and the drivers stamp
with, so the three sources line up.

The budget and thermal samples are the polls' (every ``interval``). An npud too
old for ``decisions`` gets a story call per request the polls saw instead.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from npumanager.client import NpuManager
from npumanager.errors import NpuError, PermissionDenied, ProtocolError
from npumanager.fds import close_fds

#: device.trace replies read per device and poll, at most (each holds up to the driver's
#: MAX_REPLY_STEPS steps; a second's steps of a busy device fit in a few).
MAX_PAGES = 20


@dataclass
class Recording:
    """What one recording saw (plain data: JSON-able)."""

    t0: float
    t1: float = 0.0
    #: (t, budget used, budget max, thermal status 0-6)
    samples: list[tuple[float, float, float, int]] = field(default_factory=list)
    #: device name -> its steps (dicts from device.trace)
    steps: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    #: device name -> channels
    channels: dict[str, int] = field(default_factory=dict)
    #: "uid:id" -> decisions (dicts from npud's story)
    stories: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    #: uid -> display name (a systemd unit when npud keys apps by unit)
    uid_names: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


class TraceRecorder:
    def __init__(self, runtime_dir: Any = None, *, interval: float = 0.05,
                 steps_interval: float = 0.5) -> None:
        self.runtime_dir = runtime_dir
        self.interval = interval
        self.steps_interval = steps_interval
        self.rec = Recording(t0=time.monotonic())
        self._mgr = NpuManager(runtime_dir, client_name="npu trace")
        if not self._mgr.admin:
            self._mgr.close()
            raise PermissionDenied("npu trace needs admin rights on npud (root, npud's uid or its "
                           "admin group): it reads every request's story and the drivers' "
                           "execution steps")
        self._keys: set[tuple[int, int]] = set()
        self._keys_at_start: set[tuple[int, int]] = set()
        self._drivers: dict[str, Any] = {}
        self._cursors: dict[str, int] = {}
        self._devices: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_steps = 0.0

    # --- polling ---------------------------------------------------------------------

    def poll(self) -> None:
        dump = self._mgr.dump()
        now = time.monotonic()
        budget = dump.get("budget") or {}
        cap = budget.get("thermal_scaled")
        total = budget.get("total") if cap is None else cap
        thermal = dump.get("thermal") or {}
        status = thermal.get("status_value")
        if not isinstance(status, int):
            from npumanager.constants import ThermalStatus

            status = int(ThermalStatus[str(thermal.get("status", "NONE"))])
        self.rec.samples.append((now, float(budget.get("used") or 0), float(total or 0),
                                 status))
        for r in dump.get("requests") or []:
            self._keys.add((int(r["uid"]), int(r["request_id"])))
            if r.get("uid_name"):
                self.rec.uid_names[str(r["uid"])] = str(r["uid_name"])
        self._devices = list(dump.get("devices") or [])
        if now - self._last_steps >= self.steps_interval:
            self._last_steps = now
            self.poll_steps()

    def poll_steps(self) -> None:
        from npumanager.hal.wire import SERVICE
        from npumanager.wire.client import SyncRpcClient

        for d in self._devices:
            name, path = str(d.get("name")), str(d.get("socket_path") or "")
            if not d.get("available") or not path:
                continue
            self.rec.channels[name] = int(d.get("channels") or 1)
            try:
                client = self._drivers.get(name)
                if client is None:
                    client = self._drivers[name] = SyncRpcClient(path, SERVICE,
                                                                 client_name="npu trace")
                for _ in range(MAX_PAGES):  # a reply is bounded: ask while more follow
                    payload, fds = client.call("device.trace",
                                               str(self._cursors.get(name, 0)).encode())
                    close_fds(fds)
                    got = json.loads(payload)
                    self._cursors[name] = int(got["cursor"])
                    # The ring keeps an earlier recording's steps for its lease: not ours.
                    t0 = self.rec.t0
                    self.rec.steps.setdefault(name, []).extend(
                        st for st in got["steps"] if float(st["start"]) >= t0)
                    if not got.get("more"):
                        break
            except NpuError as exc:
                old = self._drivers.pop(name, None)
                if old is not None:
                    old.close()
                note = f"driver {name}: {type(exc).__name__}: {exc}"
                if note not in self.rec.notes:
                    self.rec.notes.append(note)
                continue

    # --- running ---------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll()
            except NpuError as exc:
                self.rec.notes.append(f"npud: {type(exc).__name__}: {exc}")
                return
            self._stop.wait(self.interval)

    def start(self) -> TraceRecorder:
        self.poll_steps_now()
        self._keys_at_start = set(self._keys)
        self._thread = threading.Thread(target=self._run, name="npu-trace", daemon=True)
        self._thread.start()
        return self

    def poll_steps_now(self) -> None:
        """Turn the drivers' step recording on at once (before the first work arrives)."""
        self.poll()
        self._last_steps = time.monotonic()
        self.poll_steps()

    def record(self, duration: float) -> Recording:
        self.start()
        try:
            self._stop.wait(duration)
        finally:
            self.stop()
        return self.rec

    def _collect_stories(self) -> None:
        since = self.rec.t0
        try:
            while True:
                page = self._mgr.decisions(since)
                got = page.get("decisions") or []
                for d in got:
                    key = d.get("key")
                    if key is not None:
                        self.rec.stories.setdefault(f"{key[0]}:{key[1]}", []).append(d)
                if page.get("lost"):
                    note = ("npud's decision log is bounded and had already dropped some "
                            "of this recording's decisions: the earliest stories are "
                            "incomplete")
                    if note not in self.rec.notes:
                        self.rec.notes.append(note)
                if not page.get("truncated") or not got:
                    return
                # The next page starts after this one's last time; decisions sharing that
                # time were all in this page unless the page ended inside them, which
                # a page of thousands does not.
                since = float(got[-1]["at"]) + 1e-9
        except ProtocolError as exc:
            if "unknown method" not in str(exc):
                raise
            # An older npud: one story call per request the polls saw.
            self._stories_of(self._keys)
            return
        # A request live when the recording began has decisions from before it: its whole
        # story, so the trace knows its state at the start.
        self._stories_of(self._keys_at_start)

    def _stories_of(self, keys: set[tuple[int, int]]) -> None:
        for uid, rid in sorted(keys):
            story = self._mgr.story(uid, rid)
            if story:
                self.rec.stories[f"{uid}:{rid}"] = story

    def abandon(self, timeout: float = 1.0) -> None:
        """Stop recording and keep nothing (an interrupted demo): none of :meth:`stop`'s
        last polls and story pages, RPCs to an npud that may be going away. The polling
        thread gets ``timeout`` to end; one still in a call keeps its connections (they
        close with the process) rather than have them closed under it."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                return
        for c in self._drivers.values():
            c.close()
        self._drivers.clear()
        self._mgr.close()

    def stop(self) -> Recording:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        try:
            self.poll()
            self.poll_steps()
            self._collect_stories()
        except NpuError as exc:
            self.rec.notes.append(f"npud: {type(exc).__name__}: {exc}")
        self.rec.t1 = time.monotonic()
        for c in self._drivers.values():
            c.close()
        self._drivers.clear()
        self._mgr.close()
        return self.rec
