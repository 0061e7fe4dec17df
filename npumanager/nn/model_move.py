"""A prepared model follows its grant between its device's two hosts (the runtime's side of
service/grant_moves.py).

A device with a background lane runs two host processes, and npud moves a live grant
to the other one when its app's class changes (an app brought to the foreground, or
sent to the back). The host the model was prepared on keeps serving it, and each of its
answers says where the grant went (``ExecuteResult.moved``, ``BurstOpened.moved``, a
burst answer's MOVED status bits: tensorio/burst.py).
The :class:`~npumanager.nn.model.Model` then:

* prepares the model again on the new host, on a thread of its own (its answers keep
  coming from the old host meanwhile), as the app first prepared it: the same source,
  grant, preference, priority and cache (``cache_dir``/``token``: a cache hit once the
  new host compiled it once; each host keeps cache files of its own, nn/device.py);
* hands its open bursts over to it, while they stream (a paced camera's, a back-to-back
  embedder's or LLM's, a pipeline's): each gets a standby channel on the new host, and
  between two of its executions switches to it as the model swaps, pointer work only
  (nn/burst_handover.py); the old host then frees the old copy and npud counts the
  grant's memory once. Bursts opened or closed meanwhile, a plain execution in flight or
  a standby refused (the new host's burst limits) leave the model served where it is:
  the hand-over is tried again on a later answer's notice after a back-off (1 s doubling
  to 60 s), one thread at a time;
* with none of its bursts open, swaps to it before its next execution, or its next
  burst's open (``Model.burst``: a first burst whose open said the grant moved waits for
  the copy, prepared on its thread, and is handed over before its stream starts);
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


class Backoff:
    """Tries spaced after failures: 1 s, doubling to 60 s; a success starts over."""

    def __init__(self) -> None:
        self.at = 0.0
        self.wait = _FIRST_BACKOFF_S

    def due(self) -> bool:
        return time.monotonic() >= self.at

    def failed(self) -> float:
        """A try failed: the next waits; how long."""
        wait = self.wait
        self.at, self.wait = time.monotonic() + wait, min(wait * 2, _MAX_BACKOFF_S)
        return wait

    def succeeded(self) -> None:
        self.at, self.wait = 0.0, _FIRST_BACKOFF_S


class Follow:
    """One model's following: what its answers said, the copy prepared on the other host,
    and the back-off after a failed prepare or hand-over. Its lock is never held across a
    call."""

    def __init__(self, recipe: Recipe, on_ready: Callable[[], bool] = lambda: True) -> None:
        self.recipe = recipe
        #: Called (on the preparing thread, no lock held) once a copy is ready, and again
        #: on a later notice while it is: hands the model's open bursts over to it
        #: (nn/burst_handover.py). False or an exception: try again after the back-off.
        self._on_ready = on_ready
        #: A hand-over's refusal was logged since the last move (logged once).
        self._warned = False
        #: The back-offs after a failed prepare, and after a failed hand-over.
        self._prepares, self._handovers = Backoff(), Backoff()
        self._lock = threading.Lock()
        #: The lane the latest answer said the grant moved to (None: it did not).
        self.target: str | None = None
        #: A copy prepared on ``target``'s host, waiting for the swap.
        self.ready: Model | None = None
        self._running = False
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
            # A prepare if no copy is ready, else a hand-over of the bursts open (the
            # one after the prepare failed, or none was open then): one thread at a
            # time, each after its back-off.
            ready = self.ready is not None
            start = (start and self.target is not None and not self._running
                     and not self.closed
                     and (self._handovers if ready else self._prepares).due())
            if start:
                self._running = True
        if stale is not None:
            stale.release()
        if start:
            assert lane is not None
            run, args = (self._hand_over, ()) if ready else (self._prepare, (lane,))
            threading.Thread(target=run, args=args, daemon=True,
                             name="npu-model-follow").start()

    def prepare_now(self, lane: str) -> None:
        """The same, on this thread (Model.burst: its stream's first burst open)."""
        with self._lock:
            if (self._running or self.ready is not None or self.closed
                    or not self._prepares.due()):
                return
            self._running = True
        self._prepare(lane)

    def _prepare(self, lane: str) -> None:
        try:
            model = self.recipe.prepare_on(lane)
        except Exception as exc:
            with self._lock:
                self._running = False
                wait = self._prepares.failed()
            log.warning("%s: could not prepare the model on the %s host its grant moved "
                        "to (%s); it keeps running where it is, next try in %g s",
                        self.recipe.home.name, lane or "main", exc, wait)
            return
        with self._lock:
            self._prepares.succeeded()
            keep = not self.closed and self.target == lane
            if keep:
                self.ready = model
            else:
                self._running = False
        if not keep:
            model.release()  # released meanwhile, or the grant moved back
            return
        self._hand_over()

    def _hand_over(self) -> None:
        """The model's open bursts to the copy ready (``_running`` set: this thread's);
        a failure backs off, and a refusal is logged once until one succeeds."""
        try:
            done, why = self._on_ready(), ""
        except Exception as exc:
            done, why = False, str(exc) or type(exc).__name__
        with self._lock:
            self._running = False
            wait = 0.0 if done else self._handovers.failed()
            warn = bool(why) and not self._warned
            self._warned = self._warned or warn
        if warn:
            log.warning("%s: the model's open bursts could not move to the host its grant "
                        "moved to (%s); they keep running where they are, next try in %g "
                        "s", self.recipe.home.name, why, wait)

    def take(self, expect: Model | None = None) -> Model | None:
        """The copy to swap to, if one is ready for where the grant is now (and is
        ``expect``, if given)."""
        with self._lock:
            model = self.ready
            if expect is not None and model is not expect:
                return None
            self.ready = None
            return model

    def arrived(self) -> None:
        """The model swapped to its copy: it runs where its grant is now."""
        with self._lock:
            self.target = None
            self.moves += 1
            self._handovers.succeeded()
            self._warned = False

    def close(self) -> None:
        """The model was released: a copy ready or on its way is released too."""
        with self._lock:
            self.closed = True
            model, self.ready = self.ready, None
        if model is not None:
            model.release()


__all__ = ["Follow", "Recipe"]
