"""Request records and the rank-ordered queue of requests waiting for the budget.

A live request is one :class:`ManagedRequest`; its :class:`RequestState` says
where it is in the lifecycle. Requests that wait for the budget sit in a
:class:`RankQueue`: a binary heap ordered by (rank, arrival seq) with lazy
deletion, so adding, removing and re-ranking a waiter are O(log n) and finding
the best waiter is amortised O(1) however long the queue is — the grant hot
path never scans it.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

from npumanager.constants import LoadStatus, ModelPriority, ModelSize, UnloadReason
from npumanager.service.events import RequestKey

if TYPE_CHECKING:
    from npumanager.service.devices import Device


class RequestState(Enum):
    """Lifecycle of a live request; terminal requests are no longer live."""

    PENDING = "pending"  # only inside one handle() call, before its first answer
    QUEUED = "queued"  # answered NOT_PRIORITIZED; waits for the budget
    WAITING = "waiting"  # answered WAIT_FOR_UNLOAD; victims are unloading for it
    GRANTED = "granted"  # CAN_LOAD_NOW sent with a grant; not reported loaded yet
    LOADED = "loaded"
    UNLOAD_REQUESTED = "unload_requested"  # a holder asked to unload; still holds

    @property
    def holds(self) -> bool:
        return self in _HOLDING

    @property
    def waits(self) -> bool:
        return self in _WAITING_STATES


_HOLDING = frozenset({RequestState.GRANTED, RequestState.LOADED, RequestState.UNLOAD_REQUESTED})
_WAITING_STATES = frozenset({RequestState.QUEUED, RequestState.WAITING})


@dataclass(slots=True, eq=False)
class ManagedRequest:
    """One live request (keyed by (uid, request id)) and everything decided about it."""

    key: RequestKey
    conn: int
    pid: int
    size: ModelSize
    priority: ModelPriority
    created: float
    seq: int  # arrival order; ties in rank are served first come, first served
    rank: int
    dev: Device  # the device it will be prepared on: its budget, queue and holders
    state: RequestState = RequestState.PENDING
    last_status: LoadStatus | None = None
    grant_id: str | None = None
    charge: int = 0  # what it counts against the budget while holding
    real_bytes: int = 0  # the drivers' reports under its grant
    loaded: bool = False
    unload_reason: UnloadReason | None = None
    unload_deadline: float | None = None
    unload_timer: str | None = None
    wait_timer: str | None = None
    # Queue bookkeeping (RankQueue only).
    qtoken: int = -1
    in_queue: bool = False
    parked: bool = False  # waiting, but not eligible now (thermal, larger than the budget)

    @property
    def uid(self) -> int:
        return self.key[0]

    @property
    def request_id(self) -> int:
        return self.key[1]

    @property
    def opportunistic(self) -> bool:
        return self.priority == ModelPriority.OPPORTUNISTIC


_Entry = tuple[int, int, int, ManagedRequest]


class RankQueue:
    """Eligible waiters by (rank, seq): best rank first, first come first served on ties.

    Also counts waiters per (rank, uid), so the fairness rule ("is an equal-rank
    peer of another uid waiting?") is O(1).
    """

    def __init__(self) -> None:
        self._heap: list[_Entry] = []
        self._tokens = itertools.count()
        self._live = 0
        self._by_rank: dict[int, dict[int, int]] = {}

    def __len__(self) -> int:
        return self._live

    def push(self, req: ManagedRequest) -> None:
        assert not req.in_queue, f"{req.key} is already queued"
        req.qtoken = next(self._tokens)
        req.in_queue = True
        heapq.heappush(self._heap, (req.rank, req.seq, req.qtoken, req))
        self._live += 1
        per_uid = self._by_rank.setdefault(req.rank, {})
        per_uid[req.uid] = per_uid.get(req.uid, 0) + 1

    def remove(self, req: ManagedRequest) -> None:
        """Take ``req`` out (its heap entry goes stale and is dropped lazily)."""
        assert req.in_queue, f"{req.key} is not queued"
        req.in_queue = False
        req.qtoken = -1
        self._live -= 1
        per_uid = self._by_rank[req.rank]
        per_uid[req.uid] -= 1
        if not per_uid[req.uid]:
            del per_uid[req.uid]
            if not per_uid:
                del self._by_rank[req.rank]
        # Keep stale entries from piling up when many leave from the middle.
        if len(self._heap) > 64 and len(self._heap) > 2 * self._live:
            self._heap = [e for e in self._heap if self._valid(e)]
            heapq.heapify(self._heap)

    @staticmethod
    def _valid(entry: _Entry) -> bool:
        req = entry[3]
        return req.in_queue and req.qtoken == entry[2]

    def peek(self) -> ManagedRequest | None:
        heap = self._heap
        while heap and not self._valid(heap[0]):
            heapq.heappop(heap)
        return heap[0][3] if heap else None

    def pop(self) -> ManagedRequest | None:
        req = self.peek()
        if req is not None:
            self.remove(req)
        return req

    def ordered(self) -> list[ManagedRequest]:
        """Every waiter in service order (O(n log n): for dumps and checks, not the hot path)."""
        return [e[3] for e in sorted(e for e in self._heap if self._valid(e))]

    def peer_waiting(self, rank: int, uid: int) -> bool:
        """Whether a waiter of another uid has exactly ``rank``."""
        per_uid = self._by_rank.get(rank)
        if not per_uid:
            return False
        return sum(per_uid.values()) > per_uid.get(uid, 0)

    def check(self) -> None:
        """Invariants of the structure itself (used by ManagerState.validate)."""
        live = [e[3] for e in self._heap if self._valid(e)]
        assert len(live) == self._live == len({id(r) for r in live}), (
            f"queue counts {self._live} live, heap holds {len(live)}"
        )
        counted = sum(sum(u.values()) for u in self._by_rank.values())
        assert counted == self._live, f"rank counters {counted} != {self._live} waiters"
        for req in live:
            assert req.rank in self._by_rank and req.uid in self._by_rank[req.rank], (
                f"{req.key} rank {req.rank} is not counted"
            )
