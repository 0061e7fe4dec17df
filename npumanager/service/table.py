"""The live requests of npud and every index over them.

:class:`RequestTable` holds each live :class:`ManagedRequest` by its key
(uid, request id) and keeps the indexes the rules need in step with it: by
connection (a death drops exactly its requests), by uid (importance changes,
the per-uid limit), the ids each connection ever submitted (a request may be
submitted once per connection), the holders and their live grants, and the
armed timers. It checks a new request against those rules before anything
changes; what happens to a request is decided in
:class:`~npumanager.service.state.ManagerState`.
"""

from __future__ import annotations

from npumanager.errors import InvalidArgument, LimitExceeded, UnknownRequest
from npumanager.service.events import RequestKey
from npumanager.service.ranking import ManagedRequest, RequestState


def _index_add(index: dict[int, set[RequestKey]], k: int, key: RequestKey) -> None:
    keys = index.get(k)
    if keys is None:
        index[k] = {key}
    else:
        keys.add(key)


def _index_discard(index: dict[int, set[RequestKey]], k: int, key: RequestKey) -> None:
    keys = index[k]
    keys.discard(key)
    if not keys:
        del index[k]


class RequestTable:
    __slots__ = ("by_conn", "by_uid", "grants", "holders", "max_per_uid", "requests",
                 "submitted", "timers")

    def __init__(self, max_per_uid: int) -> None:
        self.max_per_uid = max_per_uid
        self.requests: dict[RequestKey, ManagedRequest] = {}
        self.by_conn: dict[int, set[RequestKey]] = {}
        self.by_uid: dict[int, set[RequestKey]] = {}
        self.submitted: dict[int, set[int]] = {}  # conn -> request ids ever submitted on it
        self.holders: dict[RequestKey, ManagedRequest] = {}
        self.grants: dict[str, RequestKey] = {}
        self.timers: dict[str, RequestKey] = {}

    def __len__(self) -> int:
        return len(self.requests)

    def __repr__(self) -> str:
        return f"<RequestTable {len(self.requests)} live, {len(self.holders)} holding>"

    def check_new(self, uid: int, conn: int, request_id: int) -> None:
        """Raise (changing nothing) if (uid, request_id) may not be submitted on ``conn``."""
        submitted = self.submitted.get(conn)
        if submitted is not None and request_id in submitted:
            raise InvalidArgument(
                f"request {request_id} was already submitted on this connection; "
                "a request may be submitted once per connection"
            )
        if (uid, request_id) in self.requests:
            raise InvalidArgument(
                f"request {request_id} of uid {uid} is still live (requests are keyed by "
                "(uid, id): another connection of this uid holds that id; use distinct ids, "
                'or [importance] identity = "unit" to tell apps of one uid apart)'
            )
        if len(self.by_uid.get(uid, ())) >= self.max_per_uid:
            raise LimitExceeded(f"uid {uid} already has {self.max_per_uid} live requests")

    def get(self, uid: int, request_id: int) -> ManagedRequest:
        req = self.requests.get((uid, request_id))
        if req is None:
            raise UnknownRequest(f"uid {uid} has no live request {request_id}")
        return req

    def add(self, req: ManagedRequest) -> None:
        key = req.key
        submitted = self.submitted.get(req.conn)
        if submitted is None:
            self.submitted[req.conn] = {key[1]}
        else:
            submitted.add(key[1])
        self.requests[key] = req
        _index_add(self.by_conn, req.conn, key)
        _index_add(self.by_uid, key[0], key)

    def remove(self, req: ManagedRequest) -> None:
        """Forget a request that ended (its grant and timers are gone already)."""
        key = req.key
        del self.requests[key]
        _index_discard(self.by_conn, req.conn, key)
        _index_discard(self.by_uid, key[0], key)

    def of_conn(self, conn: int) -> list[RequestKey]:
        return sorted(self.by_conn.get(conn, ()))

    def of_uid(self, uid: int) -> list[RequestKey]:
        return sorted(self.by_uid.get(uid, ()))

    def count_of_uid(self, uid: int) -> int:
        return len(self.by_uid.get(uid, ()))

    def forget_conn(self, conn: int) -> None:
        """The connection is gone: its ids may be reused by whoever gets its number."""
        self.submitted.pop(conn, None)

    def add_holder(self, req: ManagedRequest, grant_id: str) -> None:
        if grant_id in self.grants:
            raise AssertionError(f"grant id {grant_id!r} issued twice")
        self.holders[req.key] = req
        self.grants[grant_id] = req.key

    def remove_holder(self, req: ManagedRequest) -> str:
        """Returns the grant id that ended."""
        grant_id = req.grant_id
        assert grant_id is not None
        del self.holders[req.key]
        del self.grants[grant_id]
        return grant_id

    def counts(self) -> dict[str, int]:
        counts = {s.value: 0 for s in RequestState}
        for r in self.requests.values():
            counts[r.state.value] += 1
        return counts
