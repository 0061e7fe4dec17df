"""DriverState's trust boundary on virtual time: what one uid may make the driver hold
(bounds, max_steps), round robin among equals so nobody waits behind an endless job, the
orphaned driver (no new loads, then grace-then-release), and ownership of models and
pools. The harness validates the state (the ledger included) after every event."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npumanager.drivers import events as ev
from npumanager.drivers.bounds import Holdings, Limits
from npumanager.drivers.state import ORPHAN_TIMER, DriverParams
from npumanager.errors import (
    GrantRequired,
    GrantRevoked,
    InvalidArgument,
    LimitExceeded,
    NoManagerAttached,
)
from npumanager.hal.types import EndReason

from .state_harness import INITIAL, PAUSED, Harness, reports

GiB = 1 << 30


def limited(channels: int = 1, **limits: int) -> Harness:
    return Harness(DriverParams(name="ref", channels=channels, enforce_admission=False,
                                limits=Limits(**limits)))


def begin(h: Harness, conn: int, prepare_id: int, nbytes: int) -> list[ev.Instruction]:
    return h.handle(h.mk(ev.PrepareBegun, conn=conn, prepare_id=prepare_id, nbytes=nbytes))


def prepared(h: Harness, conn: int, prepare_id: int = 0, memory: int = 1000,
             grant: str | None = None) -> int:
    out = h.handle(h.mk(ev.ModelPrepared, conn=conn, grant_id=grant, memory_bytes=memory,
                        inputs=frozenset({"x"}), outputs=frozenset({"y"}),
                        prepare_id=prepare_id))
    (ready,) = [i for i in out if isinstance(i, ev.ModelReady)]
    return ready.model_id


def pool(h: Harness, conn: int, size: int) -> int:
    out = h.handle(h.mk(ev.PoolRegistered, conn=conn, size=size))
    (ready,) = [i for i in out if isinstance(i, ev.PoolReady)]
    return ready.pool_id


# --- max_steps and round robin -------------------------------------------------------------


def test_more_steps_than_max_steps_is_an_invalid_argument_and_changes_nothing() -> None:
    h = limited(max_steps=1000)
    m = h.prepare(1)
    with pytest.raises(InvalidArgument, match="at most 1000 steps on driver ref, not 1001"):
        h.execute(1, m, steps=1001)
    assert h.state.jobs() == [] and h.state.holdings(1) == Holdings(models=1,
                                                                    model_bytes=1000)
    t, _ = h.execute(1, m, steps=1000)
    assert h.state.jobs()[0].steps == 1000 and h.running() == [t]


def test_the_default_max_steps_is_a_million() -> None:
    h = Harness()
    m = h.prepare(1)
    with pytest.raises(InvalidArgument, match="at most 1000000 steps"):
        h.execute(1, m, steps=2**31 - 1)


def test_an_equals_single_execute_never_waits_behind_endless_jobs() -> None:
    # The attack: two jobs of a million steps take both channels; an equally important
    # app's single execute must run at the next step boundary, not after them.
    h = Harness(channels=2, debounce_ms=0)
    a, b = h.prepare(1), h.prepare(2)
    e1, _ = h.execute(1, a, steps=1_000_000)
    e2, _ = h.execute(1, a, steps=1_000_000)
    single, _ = h.execute(2, b)
    assert h.running() == [e1, e2]
    out = h.step_done(e1)
    assert reports(out) == [("ended", 1, PAUSED), ("started", 3, INITIAL)]
    assert out[-1] == ev.RunStep(single, 0, True, False, 0, 3)
    h.step_done(single)
    assert h.finish_of(single).reason is EndReason.COMPLETED
    # Both endless jobs go on, taking turns with nobody left waiting.
    assert sorted(h.running()) == [e1, e2]


@settings(max_examples=200, deadline=None)
@given(ops=st.lists(st.one_of(st.tuples(st.just("endless"), st.integers(1, 3)),
                              st.tuples(st.just("single"), st.integers(1, 3)),
                              st.tuples(st.just("done"), st.integers(0, 9))),
                    max_size=80),
       channels=st.integers(1, 3))
def test_round_robin_among_equals_bounds_every_wait(ops: list[tuple[str, int]],
                                                    channels: int) -> None:
    """Every job of equal priority starts within as many step ends as there were live
    jobs when it arrived, however long the others run."""
    h = Harness(channels=channels, debounce_ms=0)
    models = {uid: h.prepare(uid) for uid in (1, 2, 3)}
    budget: dict[int, int] = {}  # queued ticket -> step ends it may still wait
    for kind, arg in ops:
        if kind == "done":
            running = h.running()
            if not running:
                continue
            h.step_done(running[arg % len(running)])
            started = set(h.running()) | {t for t, life in h.checker.jobs.items()
                                          if life.next_step > 0 or life.finish}
            for ticket in list(budget):
                if ticket in started:
                    del budget[ticket]
                else:
                    budget[ticket] -= 1
                    assert budget[ticket] >= 0, f"ticket {ticket} waited too long"
        else:
            live = len(h.state.jobs())
            ticket, _ = h.execute(arg, models[arg], steps=1_000_000 if kind == "endless" else 1)
            if ticket not in h.running():
                budget[ticket] = live


# --- bounds ------------------------------------------------------------------------------


def test_jobs_are_bounded_per_connection_and_per_uid() -> None:
    h = limited(max_jobs_per_connection=2, max_jobs_per_uid=3)
    m1 = h.prepare(1)
    h.connect(11, uid=1)
    m11 = prepared(h, 11)
    h.execute(1, m1)
    h.execute(1, m1)
    with pytest.raises(LimitExceeded, match="this connection already has 2 executions "
                       "queued or running on driver ref"):
        h.execute(1, m1)
    h.execute(11, m11)
    with pytest.raises(LimitExceeded, match=r"uid 1 already has 3 executions queued or "
                       r"running on driver ref \(the bound is 3\)"):
        h.execute(11, m11)
    m2 = h.prepare(2)
    h.execute(2, m2)  # another uid is served
    assert h.state.holdings(1).jobs == 3 and h.state.holdings(2).jobs == 1
    h.step_done(h.running()[0])  # one of uid 1's ends: room again
    h.execute(11, m11)


def test_prepares_are_bounded_in_bytes_read_and_models_held() -> None:
    h = limited(max_models_per_uid=2, max_prepare_bytes_per_uid=GiB, max_model_bytes_per_uid=3000)
    h.connect(1)
    h.connect(2)
    begin(h, 1, 1, GiB // 2)
    # Sparse memfds count by their size: a second half GiB fits, one byte more does not.
    with pytest.raises(LimitExceeded, match=r"uid 1 has 512 MiB of models being read for "
                       r"prepares on driver ref; 512 MiB more would pass the bound of 1 GiB"):
        begin(h, 1, 2, GiB // 2 + 1)
    begin(h, 2, 3, GiB)  # another uid is served
    begin(h, 1, 2, GiB // 2)
    assert h.state.holdings(1) == Holdings(prepares=2, prepare_bytes=GiB)
    with pytest.raises(LimitExceeded, match="uid 1 already has 2 models"):
        begin(h, 1, 4, 0)  # two prepares in progress hold both model slots
    prepared(h, 1, prepare_id=1, memory=2000)
    h.handle(h.mk(ev.PrepareEnded, prepare_id=1))  # after ModelPrepared: nothing more
    assert h.state.holdings(1) == Holdings(models=1, model_bytes=2000, prepares=1,
                                           prepare_bytes=GiB // 2)
    with pytest.raises(LimitExceeded, match="uid 1 has 2000 bytes of prepared models on "
                       "driver ref; 1001 bytes more would pass the bound of 3000 bytes"):
        prepared(h, 1, prepare_id=2, memory=1001)
    h.handle(h.mk(ev.PrepareEnded, prepare_id=2))  # the shell released what it compiled
    assert h.state.holdings(1) == Holdings(models=1, model_bytes=2000)
    h.handle(h.mk(ev.PrepareEnded, prepare_id=3))
    assert h.state.holdings(2) == Holdings()


def test_a_model_without_a_prepare_event_counts_against_the_model_bound() -> None:
    h = limited(max_models_per_uid=1)
    h.prepare(1)
    with pytest.raises(LimitExceeded, match="uid 1 already has 1 models"):
        h.prepare(1)
    h.prepare(2)


def test_pools_are_bounded_in_count_and_bytes_by_their_size() -> None:
    h = limited(max_pools_per_connection=2, max_pools_per_uid=3, max_pool_bytes_per_uid=4 * GiB)
    h.connect(1)
    h.connect(11, uid=1)
    p1 = pool(h, 1, GiB)  # a sparse 1 GiB memfd costs its sender nothing: 1 GiB here
    pool(h, 1, GiB)
    with pytest.raises(LimitExceeded, match="this connection already has 2 shared-memory"):
        pool(h, 1, 4096)
    pool(h, 11, GiB)
    with pytest.raises(LimitExceeded, match="uid 1 already has 3 shared-memory pools"):
        pool(h, 11, 4096)
    h.handle(h.mk(ev.PoolUnregistered, conn=1, pool_id=p1))
    with pytest.raises(LimitExceeded, match=r"uid 1 has 2 GiB of shared-memory pools on "
                       r"driver ref; 2 GiB more would pass the bound of 4 GiB"):
        pool(h, 11, 2 * GiB + 1)
    pool(h, 11, 2 * GiB)
    h.connect(2)
    pool(h, 2, 4 * GiB)  # another uid has its own share
    h.gone(11)
    assert h.state.holdings(1) == Holdings(pools=1, pool_bytes=GiB)


def test_a_uid_that_holds_nothing_is_forgotten() -> None:
    h = limited()
    m = h.prepare(1)
    pool(h, 1, 4096)
    t, _ = h.execute(1, m)
    assert h.state.holdings(1) == Holdings(jobs=1, models=1, model_bytes=1000, pools=1,
                                           pool_bytes=4096)
    h.step_done(t)
    h.gone(1)
    assert h.state.ledger.held() == {}


# --- ownership ---------------------------------------------------------------------------


def test_another_connections_revoked_model_answers_as_if_it_never_existed() -> None:
    # model_for used to check ownership with an always-true expression: any connection
    # got the revoked model's message (GrantRevoked and why) for any model id.
    h = Harness()
    h.grant("g1", 1)
    m = h.prepare(1, grant="g1")
    h.connect(2)
    h.end_grant("g1")
    with pytest.raises(GrantRevoked, match="was revoked by npud"):
        h.execute(1, m)
    with pytest.raises(InvalidArgument, match=f"no prepared model {m} on this connection"):
        h.execute(2, m)
    h.connect(3, uid=1)  # even another connection of the same uid
    with pytest.raises(InvalidArgument, match=f"no prepared model {m} on this connection"):
        h.execute(3, m)


def test_a_connection_uses_only_its_own_models_and_pools() -> None:
    h = Harness(channels=1)
    m = h.prepare(1)
    p = pool(h, 1, 4096)
    t, _ = h.execute(1, m)
    h.connect(2)
    with pytest.raises(InvalidArgument, match=f"no prepared model {m} on this connection"):
        h.execute(2, m)
    assert h.cancel(2, m) == [] and h.release(2, m) == []
    assert h.handle(h.mk(ev.PoolUnregistered, conn=2, pool_id=p)) == []
    assert h.running() == [t] and h.state.model_ids() == [m]


def test_a_model_is_refused_under_another_uids_grant() -> None:
    h = Harness()
    h.grant("g1", 1)
    h.connect(2)
    with pytest.raises(GrantRequired, match="not issued to uid 2"):
        prepared(h, 2, grant="g1")
    assert h.state.model_ids() == []


# --- the orphaned driver ---------------------------------------------------------------


def attached(grace: float = 10.0) -> Harness:
    h = Harness(DriverParams(name="ref", channels=1, enforce_admission=True,
                             orphan_grace_s=grace), debounce_ms=0)
    h.handle(h.mk(ev.ManagerAttached, enforce_admission=True))
    return h


def test_without_a_manager_nothing_new_is_loaded_and_models_go_after_the_grace() -> None:
    h = attached(grace=10.0)
    h.grant("g1", 1)
    m = h.prepare(1, grant="g1")
    t, _ = h.execute(1, m, steps=1_000)
    out = h.handle(h.mk(ev.ManagerGone))
    assert out == [ev.ArmTimer(ORPHAN_TIMER, h.now + 10.0)]
    h.advance(5.0)
    with pytest.raises(NoManagerAttached, match="driver ref has no manager attached "
                       r"\(npud went away 5\.0 s ago\): it loads nothing new"):
        begin(h, 1, 1, 100)
    h.step_done(t)  # loaded models keep running meanwhile
    assert h.running() == [t]
    out = h.advance(5.0)
    assert ev.AbortStep(t) in out and ev.GraceExpired(1) in out
    assert h.state.model_ids() == [] and h.state.grant_ids() == []
    out = h.step_done(t, error="aborted")
    why = "no manager attached again within 10 s; the model was released"
    (finish,) = [i for i in out if isinstance(i, ev.FinishJob)]
    assert finish.reason is EndReason.CANCELLED_SYSTEM and why in (finish.revoked or "")
    assert ev.ReleaseModel(m) in out
    with pytest.raises(GrantRevoked, match=why):
        h.execute(1, m)


def test_a_manager_that_attaches_within_the_grace_keeps_the_models() -> None:
    h = attached(grace=10.0)
    h.grant("g1", 1)
    m = h.prepare(1, grant="g1")
    h.handle(h.mk(ev.ManagerGone))
    h.advance(9.0)
    out = h.handle(h.mk(ev.ManagerAttached, enforce_admission=True))
    assert out == [ev.CancelTimer(ORPHAN_TIMER)]
    assert h.advance(60.0) == []
    assert h.state.model_ids() == [m]
    begin(h, 1, 1, 100)  # loads again
    assert [d.what for d in h.state.decisions() if d.subject == "driver ref"] == [
        "manager gone", "manager back"]


def test_a_driver_that_never_had_a_manager_is_not_orphaned() -> None:
    h = Harness()
    h.connect(1)
    h.handle(h.mk(ev.ManagerGone))  # an admin connection that closes: nothing changes
    begin(h, 1, 1, 100)
    assert h.state.orphaned_at is None


def test_the_bounds_come_from_manager_config_keys_with_the_documented_defaults() -> None:
    from dataclasses import asdict

    from npumanager.config import Config
    from npumanager.drivers.messages import params_from
    from npumanager.hal.host_config import DRIVER_LIMIT_KEYS, HostConfig

    hc = HostConfig.from_config(Config.load(None), "reference")
    assert tuple(Limits.keys()) == DRIVER_LIMIT_KEYS
    assert hc.limits == asdict(Limits()) and hc.orphan_grace_s == 10.0
    cfg = Config.load(None)
    cfg.data["manager"]["max_pools_per_uid"] = 7
    params = params_from(HostConfig.from_config(cfg, "reference"))
    assert params.limits.max_pools_per_uid == 7 and params.limits.max_steps == 1_000_000
