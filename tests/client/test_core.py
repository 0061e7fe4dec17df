"""The client core on its own (no socket): pushes in, callbacks out, in order."""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from typing import Any

import pytest

from npumanager import (
    LoadStatus,
    ModelLoadRequest,
    ModelLoadRequestCallback,
    ModelPriority,
    ModelSize,
    RequestStatus,
    UnloadReason,
)
from npumanager.client.core import ClientCore, ExecutorLike, LiveState, LiveView, Phase
from npumanager.client.request import ListenerBase
from npumanager.errors import InvalidArgument, ServiceUnavailable
from npumanager.proto.v1.manager_pb2 import CanLoad, RequestComplete, UnloadAsk


class Rec(ModelLoadRequestCallback):
    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []

    def on_can_load_model(self, request: ModelLoadRequest, status: LoadStatus,
                          listener: Any) -> None:
        self.events.append(("can", request.id, status, listener.grant_id))

    def on_request_unload_model(self, request: ModelLoadRequest, reason: UnloadReason) -> None:
        self.events.append(("unload", request.id, reason))

    def on_model_load_request_complete(self, request: ModelLoadRequest,
                                       status: RequestStatus) -> None:
        self.events.append(("complete", request.id, status))


class Core:
    """A ClientCore whose deliveries are recorded, then run when the test says so."""

    def __init__(self) -> None:
        self.posted: list[tuple[ExecutorLike | None, Callable[[], object]]] = []
        self.core: ClientCore[ListenerBase] = ClientCore(
            lambda ex, fn, *args: self.posted.append((ex, functools.partial(fn, *args))),
            ListenerBase)

    def run(self) -> None:
        posted, self.posted = self.posted, []
        for _ex, fn in posted:
            fn()

    def can(self, rid: int, status: LoadStatus, grant: str = "") -> None:
        self.core.on_push("on_can_load_model", CanLoad(
            request_id=rid, status=int(status), grant_id=grant).SerializeToString())

    def unload(self, rid: int, reason: int) -> None:
        self.core.on_push("on_request_unload_model",
                          UnloadAsk(request_id=rid, reason=reason).SerializeToString())

    def complete(self, rid: int, status: int) -> None:
        self.core.on_push("on_model_load_request_complete",
                          RequestComplete(request_id=rid, status=status).SerializeToString())


def test_core_tracks_each_request_from_waiting_to_complete() -> None:
    c, cb = Core(), Rec()
    req = ModelLoadRequest(1, ModelSize.GREATER_THAN_2G)
    live = c.core.register(req, cb, None)
    c.can(1, LoadStatus.NOT_PRIORITIZED)
    assert c.core.live_requests() == [LiveView(req, LiveState.WAITING, None)]
    c.can(1, LoadStatus.CAN_LOAD_NOW, "g1")
    assert live.listener.grant_id == "g1"
    assert c.core.live_requests() == [LiveView(req, LiveState.GRANTED, "g1")]
    c.core.reported("loaded", 1)
    assert c.core.live_requests()[0].state is LiveState.LOADED
    c.unload(1, UnloadReason.PREEMPTED)
    assert c.core.live_requests()[0].state is LiveState.UNLOAD_REQUESTED
    c.complete(1, RequestStatus.COMPLETE)
    assert c.core.live_requests() == [] and len(c.core) == 0
    c.run()
    assert cb.events == [
        ("can", 1, LoadStatus.NOT_PRIORITIZED, "g1"),  # the listener is the live object
        ("can", 1, LoadStatus.CAN_LOAD_NOW, "g1"),
        ("unload", 1, UnloadReason.PREEMPTED),
        ("complete", 1, RequestStatus.COMPLETE),
    ]
    # Members, not bare ints: the app can read .name.
    assert [type(e[2]) for e in cb.events] == [LoadStatus, LoadStatus, UnloadReason,
                                               RequestStatus]


def test_core_refuses_a_live_id_and_a_non_request() -> None:
    c = Core()
    c.core.register(ModelLoadRequest(1), Rec(), None)
    with pytest.raises(InvalidArgument, match="already live"):
        c.core.register(ModelLoadRequest(1), Rec(), None)
    with pytest.raises(InvalidArgument, match="expected a ModelLoadRequest"):
        c.core.register(1, Rec(), None)  # type: ignore[arg-type]


def test_withdrawn_request_hears_nothing_and_its_id_is_free_again() -> None:
    c, cb = Core(), Rec()
    live = c.core.register(ModelLoadRequest(1), cb, None)
    c.core.withdraw(live)
    c.can(1, LoadStatus.CAN_LOAD_NOW, "g")
    c.run()
    assert cb.events == []
    c.core.register(ModelLoadRequest(1), cb, None)


def test_lost_connection_ends_every_live_request_cancelled_in_order(
        caplog: pytest.LogCaptureFixture) -> None:
    c, cb = Core(), Rec()
    c.core.reconnect = False
    for rid in (3, 1, 2):
        c.core.register(ModelLoadRequest(rid), cb, None)
    assert c.core.connection_lost(ConnectionResetError("reset by peer")) is False
    c.core.connection_lost(None)  # once only
    c.run()
    assert cb.events == [("complete", rid, RequestStatus.CANCELLED) for rid in (3, 1, 2)]
    assert c.core.phase is Phase.LOST and len(c.core) == 0
    assert caplog.text.count("ends CANCELLED") == 3 and "reset by peer" in caplog.text
    with pytest.raises(ServiceUnavailable, match="reset by peer"):
        c.core.register(ModelLoadRequest(4), cb, None)


def test_closing_drops_requests_silently_and_a_later_loss_changes_nothing() -> None:
    c, cb = Core(), Rec()
    c.core.register(ModelLoadRequest(1), cb, None)
    c.core.close()
    c.core.connection_lost(None)
    c.can(1, LoadStatus.CAN_LOAD_NOW, "g")
    c.run()
    assert cb.events == [] and c.core.phase is Phase.CLOSED
    with pytest.raises(ServiceUnavailable):
        c.core.register(ModelLoadRequest(2), cb, None)


def test_pushes_for_unknown_requests_are_ignored() -> None:
    c, cb = Core(), Rec()
    c.core.register(ModelLoadRequest(1), cb, None)
    c.can(9, LoadStatus.CAN_LOAD_NOW, "g")
    c.unload(9, UnloadReason.THERMAL)
    c.complete(9, RequestStatus.REVOKED)
    c.core.on_push("goodbye", b"shutting down")
    c.core.on_push("on_something_new", b"")
    assert c.posted == [] and len(c.core) == 1


@pytest.mark.parametrize(("push", "what"), [
    ("can", "load status 7"), ("unload", "unload reason 42"), ("complete", "request status 0"),
])
def test_unknown_enum_values_and_garbage_are_logged_and_dropped(
        push: str, what: str, caplog: pytest.LogCaptureFixture) -> None:
    c, cb = Core(), Rec()
    c.core.register(ModelLoadRequest(1), cb, None)
    with caplog.at_level(logging.WARNING, "npumanager.client"):
        if push == "can":
            c.core.on_push("on_can_load_model",
                           CanLoad(request_id=1, status=7).SerializeToString())
        elif push == "unload":
            c.unload(1, 42)
        else:
            c.complete(1, 0)
        c.core.on_push("on_request_unload_model", b"\xff\xff\xff")
    assert what in caplog.text and "malformed on_request_unload_model" in caplog.text
    assert c.posted == [] and len(c.core) == 1  # the request lives on
    c.complete(1, RequestStatus.CANCELLED)
    c.run()
    assert cb.events == [("complete", 1, RequestStatus.CANCELLED)]


def test_fds_sent_with_a_push_are_closed() -> None:
    c = Core()
    r, w = os.pipe()
    c.core.on_push("on_can_load_model", CanLoad(request_id=5).SerializeToString(), [r])
    with pytest.raises(OSError):
        os.fstat(r)
    os.close(w)


def test_the_executor_of_each_request_travels_with_its_callbacks() -> None:
    c = Core()

    def executor(fn: Callable[[], None]) -> None:
        fn()

    c.core.register(ModelLoadRequest(1), Rec(), executor)
    c.core.register(ModelLoadRequest(2), Rec(), None)
    c.can(1, LoadStatus.CAN_LOAD_NOW, "a")
    c.can(2, LoadStatus.CAN_LOAD_NOW, "b")
    assert [ex for ex, _ in c.posted] == [executor, None]


def test_a_lost_connection_keeps_live_requests_and_reclaims_them_on_reconnect() -> None:
    c, cb = Core(), Rec()
    c.core.register(ModelLoadRequest(1, ModelSize.GREATER_THAN_2G), cb, None)
    c.core.register(ModelLoadRequest(2, priority=ModelPriority.BACKGROUND), cb, None)
    c.core.register(ModelLoadRequest(3), cb, None)
    c.can(1, LoadStatus.CAN_LOAD_NOW, "g1")
    c.core.reported("loaded", 1)
    c.can(2, LoadStatus.CAN_LOAD_NOW, "g2")
    c.unload(2, UnloadReason.THERMAL)
    c.run()
    before = len(cb.events)
    assert c.core.connection_lost(ConnectionResetError("npud killed")) is True
    assert c.core.phase is Phase.RECONNECTING and len(c.core) == 3
    with pytest.raises(ServiceUnavailable, match="reconnecting"):
        c.core.register(ModelLoadRequest(4), cb, None)
    reclaim = c.core.reconnected()
    claims = {x.request_id: x for x in reclaim.claims}
    assert (claims[1].state, claims[1].grant_id, claims[1].size) == (
        "loaded", "g1", int(ModelSize.GREATER_THAN_2G))
    assert (claims[2].state, claims[2].unload_reason, claims[2].priority) == (
        "unload_requested", int(UnloadReason.THERMAL), int(ModelPriority.BACKGROUND))
    assert (claims[3].state, claims[3].grant_id, claims[3].HasField("unload_reason")) == (
        "waiting", "", False)
    assert c.core.phase is Phase.CONNECTED and c.core.reconnects == 1
    c.run()
    assert len(cb.events) == before  # adopted: the app hears nothing


def test_after_goodbye_or_when_the_window_passes_live_requests_end_cancelled() -> None:
    c, cb = Core(), Rec()
    c.core.register(ModelLoadRequest(1), cb, None)
    c.core.on_push("goodbye", b"npud is shutting down")
    assert c.core.connection_lost(None) is False
    c.run()
    assert cb.events == [("complete", 1, RequestStatus.CANCELLED)]
    c2, cb2 = Core(), Rec()
    c2.core.register(ModelLoadRequest(1), cb2, None)
    assert c2.core.connection_lost(None) is True
    c2.core.give_up()
    c2.run()
    assert cb2.events == [("complete", 1, RequestStatus.CANCELLED)]
    assert c2.core.phase is Phase.LOST


def test_reconnect_back_off_goes_from_50_ms_to_1_s() -> None:
    import itertools

    from npumanager.client.core import reconnect_delays

    assert list(itertools.islice(reconnect_delays(), 7)) == [
        0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
