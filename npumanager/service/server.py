"""The manager RPC handlers: wire messages in, ManagerState events out.

Each handler turns one call into one event (identity from SO_PEERCRED via
``ctx.peer``, never from the payload), checks admin rights where the API says
so, and lets :meth:`Daemon.submit` decide and act. The callbacks the state
decides on (on_can_load_model, ...) go out as pushes BEFORE the call's reply,
so a client always sees a request's first status no later than its reply.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from google.protobuf.message import DecodeError, Message

from npumanager.constants import ModelPriority, ModelSize, ThermalStatus, UnloadReason
from npumanager.errors import InvalidArgument, LimitExceeded, NpuError, PermissionDenied
from npumanager.proto.v1.manager_pb2 import (
    DecisionsSince,
    DeviceList,
    JsonReply,
    LoadRequest,
    Reclaim,
    RequestRef,
    SetImportance,
    SetPolicy,
    StoryRequest,
    ThermalOverride,
    ThermalReply,
    ThreadRealtime,
)
from npumanager.service import events as ev
from npumanager.service.observe import call as observe
from npumanager.service.visibility import admin_view, own_view
from npumanager.wire.conn import CallContext, Handler, HandlerResult

if TYPE_CHECKING:
    from npumanager.service.daemon import Daemon

EMPTY = b""
SIZES = {int(m): m for m in ModelSize}
PRIORITIES = {int(m): m for m in ModelPriority}
REASONS = {int(m): m for m in UnloadReason}
#: Most decisions one `decisions` reply carries (a page; the caller asks again from the
#: last one's time).
MAX_DECISIONS = 5000


def _require_admin(ctx: CallContext, what: str) -> None:
    if not ctx.conn.admin:
        raise PermissionDenied(
            f"{what} is for admins (root, npud's uid or the admin group); uid {ctx.peer.uid} "
            f"is not one"
        )


def _own_keys(d: Daemon, ctx: CallContext) -> set[int]:
    """The keys the caller's requests are filed under: its uid, or its app's unit key."""
    keys = {ctx.peer.uid}
    client = d.clients.get(ctx.conn)
    if client is not None:
        keys.add(client.key)
    return keys


def _parse(msg: Message, payload: bytes) -> None:
    try:
        msg.ParseFromString(payload)
    except DecodeError as exc:
        raise InvalidArgument(f"malformed {type(msg).__name__}: {exc}") from None


def _enum(cls: type[ModelSize] | type[ModelPriority], value: int, what: str) -> int:
    try:
        return int(cls(value))
    except ValueError:
        allowed = ", ".join(f"{m.name}={m.value}" for m in cls)
        raise InvalidArgument(f"{what} {value} is not one of {allowed}") from None


def manager_handlers(d: Daemon) -> dict[str, Handler]:
    clock = d.clock
    submit = d.submit
    stimulus = d.stimulus
    clients = d.clients

    def request(ctx: CallContext, payload: bytes) -> HandlerResult:
        """A load request; one npud refuses before deciding anything is counted by reason
        (``npu_requests_dropped_total``): it never gets a status."""
        m = LoadRequest()
        try:
            _parse(m, payload)
        except NpuError:
            refused("malformed")
            raise
        try:
            return load(ctx, m)
        except LimitExceeded:
            refused("over_limit")
            raise
        except InvalidArgument:  # a bad size, priority or device; an id in use
            refused("invalid")
            raise
        except NpuError:
            refused("error")
            raise

    def refused(reason: str) -> None:
        if d.observers:
            observe(d.observers, "on_request_refused", reason)

    def load(ctx: CallContext, m: LoadRequest) -> HandlerResult:
        client = clients[ctx.conn]
        if not client.seen:
            d.client_seen(client)
        size = SIZES.get(m.size)
        priority = PRIORITIES.get(m.priority)
        if size is None or priority is None:
            _enum(ModelSize, m.size, "size")
            _enum(ModelPriority, m.priority, "priority")
        submit(ev.RequestLoad(
            stimulus_id=stimulus("request"), now=clock.now(), uid=client.key,
            pid=ctx.conn.peer.pid, conn=client.cid, request_id=m.request_id,
            size=size, priority=priority,  # type: ignore[arg-type]  # checked above
            device=m.device or None,
        ))
        return EMPTY

    def by_request_ref(event: type[ev.CancelLoad | ev.ModelLoaded | ev.ModelUnloaded],
                       kind: str) -> Handler:
        """cancel / loaded / unloaded: the caller names one of its own requests by id."""

        def handler(ctx: CallContext, payload: bytes) -> HandlerResult:
            m = RequestRef()
            _parse(m, payload)
            client = clients[ctx.conn]
            submit(event(stimulus_id=stimulus(kind), now=clock.now(), uid=client.key,
                         conn=client.cid, request_id=m.request_id))
            return EMPTY

        return handler

    def reclaim(ctx: CallContext, payload: bytes) -> HandlerResult:
        """A client reconnected after npud restarted: re-register its live requests
        (service/adoption.py decides; a refused claim ends REVOKED by push)."""
        m = Reclaim()
        _parse(m, payload)
        client = clients[ctx.conn]
        if not client.seen:
            d.client_seen(client)
        for c in m.claims:
            reason = None
            if c.HasField("unload_reason") and c.unload_reason in REASONS:
                reason = REASONS[c.unload_reason]
            d.submit_quietly(ev.ClaimRequest(
                stimulus_id=stimulus("claim"), now=clock.now(), uid=client.key,
                pid=ctx.conn.peer.pid, conn=client.cid, request_id=c.request_id,
                size=c.size, priority=c.priority,  # type: ignore[arg-type]  # checked there
                state=c.state, grant_id=c.grant_id, unload_reason=reason,
                device=c.device or None))
        return EMPTY

    cancel = by_request_ref(ev.CancelLoad, "cancel")
    loaded = by_request_ref(ev.ModelLoaded, "loaded")
    unloaded = by_request_ref(ev.ModelUnloaded, "unloaded")

    def set_policy(ctx: CallContext, payload: bytes) -> HandlerResult:
        _require_admin(ctx, "set_policy")
        m = SetPolicy()
        _parse(m, payload)
        weights = {int(w.size): int(w.weight) for w in m.weights} or None
        event = ev.PolicySet(
            stimulus_id=stimulus("policy"), now=clock.now(), policy=m.policy,
            max_budget=m.max_budget if m.HasField("max_budget") else None,
            weights=weights,
            memory_budget_bytes=(
                m.memory_budget_bytes if m.HasField("memory_budget_bytes") else None),
        )
        submit(event)
        d.settings.remember_policy(event)
        return EMPTY

    def set_importance(ctx: CallContext, payload: bytes) -> HandlerResult:
        _require_admin(ctx, "set_uid_importance")
        m = SetImportance()
        _parse(m, payload)
        submit(ev.ImportanceChanged(stimulus_id=stimulus("importance"), now=clock.now(),
                                    uid=m.uid, importance=m.importance))
        d.extras.admin_set(m.uid)
        d.settings.remember_importance(m.uid, m.importance)
        return EMPTY

    def dump(ctx: CallContext, payload: bytes) -> HandlerResult:
        from npumanager.service.daemon import to_json

        full = d.dump()
        dump = admin_view(full) if ctx.conn.admin else own_view(full, _own_keys(d, ctx))
        text = to_json(dump)
        limit = ctx.conn.max_frame - 1024
        requests = dump.get("requests")
        if len(text) > limit and isinstance(requests, list):
            # Thousands of requests do not fit a frame: keep the oldest that do, say so.
            total = len(requests)
            keep = max(0, int(total * limit / len(text)) - 1)
            while True:
                dump["requests"] = requests[:keep]
                dump["requests_truncated"] = total - keep
                for k in ("queue", "parked"):
                    if isinstance(dump.get(k), list) and len(dump[k]) > keep:
                        dump[k] = dump[k][:keep]
                text = to_json(dump)
                if len(text) <= limit or keep == 0:
                    break
                keep //= 2
        return JsonReply(json=text)

    def story(ctx: CallContext, payload: bytes) -> HandlerResult:
        from npumanager.service.daemon import to_json

        m = StoryRequest()
        _parse(m, payload)
        if not ctx.conn.admin and m.uid not in _own_keys(d, ctx):
            raise PermissionDenied(
                f"the story of uid {m.uid}'s request is for admins and that uid; "
                f"uid {ctx.peer.uid} may read its own (`npu status --story "
                f"{ctx.peer.uid}:ID`)")
        decisions = d.state.story(m.uid, m.request_id)
        return JsonReply(json=to_json([
            {"at": x.at, "stimulus_id": x.stimulus_id,
             "key": list(x.key) if x.key is not None else None,
             "what": x.what, "details": x.details}
            for x in decisions
        ]))

    def decisions(ctx: CallContext, payload: bytes) -> HandlerResult:
        # A trace that polls the dump misses a request that starts and ends between two
        # polls; the log from the trace's start on has every one of them.
        from npumanager.service.daemon import to_json

        _require_admin(ctx, "the decision log")
        m = DecisionsSince()
        _parse(m, payload)
        limit = min(m.limit or MAX_DECISIONS, MAX_DECISIONS)
        got, lost = d.state.decisions_since(m.since, limit)
        return JsonReply(json=to_json({
            "decisions": [
                {"at": x.at, "stimulus_id": x.stimulus_id,
                 "key": list(x.key) if x.key is not None else None,
                 "what": x.what, "details": x.details}
                for x in got],
            "truncated": len(got) == limit,
            "lost": lost,
        }))

    def list_devices(ctx: CallContext, payload: bytes) -> HandlerResult:
        return DeviceList(devices=d.drivers.devices())

    def _thermal_reply() -> ThermalReply:
        from npumanager.service.daemon import to_json

        info = d.thermal_info()
        headroom = info.get("headroom")
        return ThermalReply(
            status=int(ThermalStatus[info["status"]]),
            overridden=bool(info.get("overridden")),
            headroom=float(headroom) if headroom is not None else float("nan"),
            details_json=to_json(info),
        )

    def thermal_status(ctx: CallContext, payload: bytes) -> HandlerResult:
        return _thermal_reply()

    def thermal_override(ctx: CallContext, payload: bytes) -> HandlerResult:
        _require_admin(ctx, "thermal override")
        m = ThermalOverride()
        _parse(m, payload)
        try:
            status = ThermalStatus(m.status)
        except ValueError:
            raise InvalidArgument(f"thermal status {m.status} out of range 0-6") from None
        d.thermal_override(status)
        d.settings.remember_thermal_override(status)
        return _thermal_reply()

    def thermal_reset(ctx: CallContext, payload: bytes) -> HandlerResult:
        _require_admin(ctx, "thermal reset")
        d.thermal_override(None)
        d.settings.remember_thermal_override(None)
        return _thermal_reply()

    def set_thread_realtime(ctx: CallContext, payload: bytes) -> HandlerResult:
        """One of the caller's own threads to SCHED_FIFO (service/rt_apps.py checks whose
        it is, the caller's importance and the per-uid bound)."""
        m = ThreadRealtime()
        _parse(m, payload)
        return d.realtime.request(ctx, m.tid)

    return {
        "request": request,
        "reclaim": reclaim,
        "cancel": cancel,
        "loaded": loaded,
        "unloaded": unloaded,
        "set_policy": set_policy,
        "set_importance": set_importance,
        "dump": dump,
        "story": story,
        "decisions": decisions,
        "list_devices": list_devices,
        "thermal_status": thermal_status,
        "thermal_override": thermal_override,
        "thermal_reset": thermal_reset,
        "set_thread_realtime": set_thread_realtime,
    }
