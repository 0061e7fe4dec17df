"""A prepared model follows its grant between its device's two hosts (the runtime's side of
service/grant_moves.py).

A device with a background lane runs two host processes, and npud moves a live grant
to the other one when its app's class changes (an app brought to the foreground, or
sent to the back). The host the model was prepared on keeps serving it, and each of its
answers says where the grant went (``ExecuteResult.moved``, ``BurstOpened.moved``).
The :class:`~npumanager.nn.model.Model` then:

* prepares the model again on the new host, on a thread of its own (its answers keep
  coming from the old host meanwhile), as the app first prepared it: the same source,
  grant, preference, priority and cache (``cache_dir``/``token``: a cache hit once the
  new host compiled it once; each host keeps cache files of its own, nn/device.py);
* swaps to it before its next execution (when none of its executions is in flight and
  none of its bursts is open), and releases the old copy: the old host frees it and npud
  counts the grant's memory once;
* a burst's answers carry the notice too (MOVED bits in its status: tensorio/burst.py).
  The model's one open burst re-opens on the new host between two frames once the copy
  is ready, if its stream leaves the time (its last gap between executions at least
  10 ms: a camera's; the re-open is a few round trips, and a frame that comes meanwhile
  waits for it: ``Burst.move_now``); a back-to-back stream's burst, or one of several
  open, keeps running on the old host and moves when the app next opens a burst
  (``Model.burst`` follows first, then opens on the new host);
* if the prepare there fails, the model stays where it is, still served, with a log
  line; it tries again after a back-off (1 s doubling to 60 s), never failing an
  execution.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from npumanager.nn.device import Device
    from npumanager.nn.model import Model

log = logging.getLogger("npumanager.nn")

_FIRST_BACKOFF_S = 1.0
_MAX_BACKOFF_S = 60.0


@dataclass(frozen=True)
class Recipe:
    """How a model was prepared: what its runtime prepares again on the other host."""

    home: Device  # the device as nn.device() opened it (its main host's)
    source: str | os.PathLike[str] | bytes
    grant_id: str
    preference: int
    priority: int
    cache_dir: str | os.PathLike[str] | None
    token: bytes | None

    def prepare_on(self, lane: str) -> Model:
        return self.home.lane(lane).prepare_here(self.source, self.grant_id, self.preference,
                                                 self.priority, self.cache_dir, self.token)


class Follow:
    """One model's following: what its answers said, the copy prepared on the other host,
    and the back-off after a failed prepare. Its lock is never held across a call."""

    def __init__(self, recipe: Recipe, on_ready: Callable[[], None] = lambda: None) -> None:
        self.recipe = recipe
        #: Called (on the preparing thread, no lock held) once a copy is ready.
        self._on_ready = on_ready
        self._lock = threading.Lock()
        #: The lane the latest answer said the grant moved to (None: it did not).
        self.target: str | None = None
        #: A copy prepared on ``target``'s host, waiting for the swap.
        self.ready: Model | None = None
        self._running = False
        self._retry_at = 0.0
        self._backoff = _FIRST_BACKOFF_S
        self.closed = False
        #: Swaps done: how many times the model moved.
        self.moves = 0

    def noted(self, lane: str | None, here: str, *, start: bool = True) -> None:
        """An answer from the host ``here`` said the grant moved to ``lane`` (None: it is
        valid here). Starts a prepare there (``start``) if none runs and none is ready."""
        stale: Model | None = None
        with self._lock:
            self.target = lane
            if lane is None or lane == here:
                self.target = None
                stale, self.ready = self.ready, None  # it moved back: not needed
            elif self.ready is not None and self.ready.device.lane_name != lane:
                stale, self.ready = self.ready, None
            start = (start and self.target is not None and self.ready is None
                     and not self._running and not self.closed
                     and time.monotonic() >= self._retry_at)
            if start:
                self._running = True
        if stale is not None:
            stale.release()
        if start:
            assert lane is not None
            threading.Thread(target=self._prepare, args=(lane,), daemon=True,
                             name="npu-model-follow").start()

    def prepare_now(self, lane: str) -> None:
        """The same, on this thread (Model.burst: before it opens)."""
        with self._lock:
            if (self._running or self.ready is not None or self.closed
                    or time.monotonic() < self._retry_at):
                return
            self._running = True
        self._prepare(lane)

    def _prepare(self, lane: str) -> None:
        try:
            model = self.recipe.prepare_on(lane)
        except Exception as exc:
            with self._lock:
                self._running = False
                self._retry_at = time.monotonic() + self._backoff
                wait, self._backoff = self._backoff, min(self._backoff * 2, _MAX_BACKOFF_S)
            log.warning("%s: could not prepare the model on the %s host its grant moved "
                        "to (%s); it keeps running where it is, next try in %g s",
                        self.recipe.home.name, lane or "main", exc, wait)
            return
        with self._lock:
            self._running = False
            self._backoff = _FIRST_BACKOFF_S
            keep = not self.closed and self.target == lane
            if keep:
                self.ready = model
        if not keep:
            model.release()  # released meanwhile, or the grant moved back
            return
        self._on_ready()

    def take(self) -> Model | None:
        """The copy to swap to, if one is ready for where the grant is now."""
        with self._lock:
            model, self.ready = self.ready, None
            return model

    def arrived(self) -> None:
        """The model swapped to its copy: it runs where its grant is now."""
        with self._lock:
            self.target = None
            self.moves += 1

    def close(self) -> None:
        """The model was released: a copy ready or on its way is released too."""
        with self._lock:
            self.closed = True
            model, self.ready = self.ready, None
        if model is not None:
            model.release()


__all__ = ["Follow", "Recipe"]
