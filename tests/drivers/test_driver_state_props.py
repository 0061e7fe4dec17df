"""Property test: random sequences of executions, step ends, failures, cancels, revoked
grants, departing clients, pools, thermal changes, the manager leaving and coming back,
and time never break DriverState's invariants (``validate()``, the ledger of what each
uid holds, and the lifecycle checker run after every event)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npumanager.constants import ThermalStatus
from npumanager.drivers import events as ev
from npumanager.drivers.bounds import Limits
from npumanager.drivers.state import DriverParams
from npumanager.errors import NpuError
from npumanager.hal.types import SchedulingConfig

from .state_harness import Harness

UIDS = (1, 2, 3)

ops = st.lists(st.one_of(
    st.tuples(st.just("execute"), st.sampled_from(UIDS), st.integers(0, 1000),
              st.integers(1, 4)),
    st.tuples(st.just("done"), st.integers(0, 50), st.booleans(),
              st.sampled_from([10.0, 1000.0, 9000.0])),
    st.tuples(st.just("cancel"), st.sampled_from(UIDS)),
    st.tuples(st.just("gone"), st.sampled_from(UIDS)),
    st.tuples(st.just("revoke"), st.sampled_from(UIDS)),
    st.tuples(st.just("thermal"), st.sampled_from(list(ThermalStatus))),
    st.tuples(st.just("advance"), st.integers(0, 120)),
    st.tuples(st.just("callback"), st.booleans()),
    st.tuples(st.just("pool"), st.sampled_from(UIDS), st.integers(1, 1 << 20)),
    st.tuples(st.just("unpool"), st.sampled_from(UIDS)),
    st.tuples(st.just("manager"), st.booleans()),
), max_size=60)


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@given(ops=ops, channels=st.integers(1, 3), debounce=st.sampled_from([0, 50]),
       reserved=st.integers(0, 2), threads=st.booleans())
def test_driver_state_invariants(ops: list[tuple[object, ...]], channels: int,
                                 debounce: int, reserved: int, threads: bool) -> None:
    # Execution classes too: a foreground threshold that splits the uids' work, channels
    # kept for foreground work (background work must never fill them), background threads.
    h = Harness(DriverParams(channels=channels, enforce_admission=True, thermal_cutoff=500,
                             orphan_grace_s=0.05,
                             limits=Limits(max_jobs_per_uid=4, max_pools_per_uid=3,
                                           max_pool_bytes_per_uid=2 << 20, max_steps=3),
                             foreground_priority=400, reserved_channels=reserved,
                             background_threads=threads),
                debounce_ms=debounce)
    h.handle(h.mk(ev.ManagerAttached, enforce_admission=True))
    h.configs(SchedulingConfig(uid=1, app_priority=100), SchedulingConfig(uid=2, app_priority=600))
    models: dict[int, int] = {}  # uid -> its model on its current connection
    grant_of: dict[int, str] = {}  # uid -> the grant its current model was prepared under
    conn_of = {uid: uid for uid in UIDS}  # a reconnecting uid gets a new connection
    pools: dict[int, list[int]] = {uid: [] for uid in UIDS}
    grants = 0

    def conn(uid: int) -> int:
        if conn_of[uid] not in h._uids:
            h.connect(conn_of[uid], uid)
        return conn_of[uid]

    def model_of(uid: int) -> int:
        nonlocal grants
        if uid not in models:
            grants += 1
            gid = f"g{grants}"
            h.grant(gid, uid)
            grant_of[uid] = gid
            h.handle(h.mk(ev.PrepareBegun, conn=conn(uid), prepare_id=grants, nbytes=100))
            try:
                out = h.handle(h.mk(ev.ModelPrepared, conn=conn(uid), grant_id=gid,
                                    memory_bytes=1000, inputs=frozenset({"x"}),
                                    outputs=frozenset({"y"}), prepare_id=grants))
            finally:
                h.handle(h.mk(ev.PrepareEnded, prepare_id=grants))
            models[uid] = next(i.model_id for i in out if isinstance(i, ev.ModelReady))
        return models[uid]

    for op in ops:
        kind = op[0]
        if kind == "execute":
            _, uid, prio, steps = op
            try:
                h.execute(conn_of[uid], model_of(uid), prio=prio, steps=steps,  # type: ignore[index, arg-type]
                          feedback=(("y", "x"),))
            except NpuError:
                pass  # e.g. a revoked model: refused, nothing changed
        elif kind == "done":
            running = h.running()
            if running:
                t = running[int(op[1]) % len(running)]  # type: ignore[call-overload]
                h.step_done(t, "RuntimeError: x" if op[2] else None, float(op[3]))  # type: ignore[arg-type]
        elif kind == "cancel" and op[1] in models:
            h.cancel(conn_of[op[1]], models[op[1]])  # type: ignore[index]
        elif kind == "gone" and (op[1] in models or pools[op[1]]):  # type: ignore[index]
            h.gone(conn_of[op[1]])  # type: ignore[index]
            models.pop(op[1], None)  # type: ignore[call-overload]
            pools[op[1]] = []  # type: ignore[index]
            conn_of[op[1]] += 100  # type: ignore[index]
        elif kind == "revoke" and op[1] in models:
            h.end_grant(grant_of[op[1]])  # type: ignore[index]
            del models[int(op[1])]  # type: ignore[call-overload]
        elif kind == "thermal":
            h.thermal(ThermalStatus(op[1]))  # type: ignore[call-overload]
        elif kind == "advance":
            h.advance(int(op[1]) / 1000)  # type: ignore[call-overload]
        elif kind == "callback":
            h.handle(h.mk(ev.CallbackSet, listening=bool(op[1]), debounce_ms=debounce))
        elif kind == "pool":
            try:
                out = h.handle(h.mk(ev.PoolRegistered, conn=conn(op[1]), size=op[2]))  # type: ignore[arg-type]
                pools[op[1]].append(out[0].pool_id)  # type: ignore[index, attr-defined]
            except NpuError:
                pass  # at a bound: refused, nothing changed
        elif kind == "unpool" and pools[op[1]]:  # type: ignore[index]
            h.handle(h.mk(ev.PoolUnregistered, conn=conn(op[1]),  # type: ignore[arg-type]
                          pool_id=pools[op[1]].pop()))  # type: ignore[index]
        elif kind == "manager":
            h.handle(h.mk(ev.ManagerAttached if op[1] else ev.ManagerGone,
                          **({"enforce_admission": True} if op[1] else {})))
    # Drain: every job ends exactly once, every model dropped is released once.
    h.thermal(ThermalStatus.NONE)
    for _ in range(1000):
        running = h.running()
        if not running:
            break
        h.step_done(running[0])
    h.advance(1.0)
    assert h.state.jobs() == []
    assert all(life.finish is not None for life in h.checker.jobs.values())
    if h.state.listening:
        # Every reported burst ended: the last report of each uid is an end (within a
        # burst only its last work item reports its end, as AOSP debounces).
        last: dict[int, ev.ReportWork] = {}
        for _, out in h.log:
            for i in out:
                if isinstance(i, ev.ReportWork):
                    last[i.info.uid] = i
        listening_since = max(n for n, (e, _) in enumerate(h.log)
                              if isinstance(e, ev.CallbackSet))
        if listening_since == 0:  # never switched off: nothing was dropped
            assert all(i.kind is ev.WorkKind.ENDED for i in last.values()), last
    for uid in list(models):
        h.gone(conn_of[uid])
    assert h.state.model_ids() == []
    assert set(h.checker.models.values()) <= {"released"}
