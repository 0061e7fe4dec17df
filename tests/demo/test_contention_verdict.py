"""The contention bench's verdicts and their summary over repeated invocations
(demo/contention_verdict.py, bench/contention.py --repeat): pure functions on
RunResults made here, no processes."""

from __future__ import annotations

import math

from npumanager.demo import contention_verdict as cv
from npumanager.demo.contention import RunResult, Stats, verdicts


def pair(p99_un: float, p99_m: float, alone: float = 1.0, llm: float = 90.0,
         emb: float = 50.0) -> tuple[RunResult, RunResult]:
    """An unmanaged and a managed run whose camera p99 is the given value in each phase
    (every frame that long), throughput against an unmanaged 100/s."""
    u, m = RunResult("unmanaged"), RunResult("managed")
    u.camera = {"alone": Stats([alone]), "contended": Stats([p99_un]),
                "loading": Stats([p99_un * 2])}
    m.camera = {"alone": Stats([alone]), "contended": Stats([p99_m]),
                "loading": Stats([p99_m * 2])}
    u.llm_tokens_s, m.llm_tokens_s = 100.0, llm
    u.embedder_items_s, m.embedder_items_s = 100.0, emb
    return u, m


def test_ratios_are_the_verdicts_numbers() -> None:
    r = cv.ratios(*pair(10.0, 1.2))
    assert r == {"camera p99 contended x alone": 1.2,
                 "camera p99 contended x unmanaged": 0.12,
                 "camera p99 loading x alone": 2.4,
                 "camera p99 loading x unmanaged": 0.12,
                 # The floors: the unmanaged camera alone (1 ms) over its phase's p99.
                 "camera p99 contended x unmanaged floor": 0.1,
                 "camera p99 loading x unmanaged floor": 0.05,
                 "LLM tokens/s % of unmanaged": 0.9,
                 "embedder items/s % of unmanaged": 0.5,
                 "background work % of unmanaged": 0.7}
    lines = cv.lines(r)
    assert lines == verdicts(*pair(10.0, 1.2))
    assert lines[0] == ("camera p99 contended: managed 1.20x alone (target <= 1.3x: PASS), "
                        "0.12x unmanaged (target <= 0.5x: PASS)")
    assert "2.40x alone (target <= 1.3x: FAIL)" in lines[1]
    assert lines[2] == "LLM tokens/s: managed 90 % of unmanaged (target >= 80 %: PASS)"
    assert lines[3] == "embedder items/s: managed 50 % of unmanaged (target >= 80 %: FAIL)"
    assert lines[4].startswith("background work, both apps (mean of the two): managed 70 %")


def test_an_unmanaged_camera_near_its_alone_makes_the_x_unmanaged_target_unreachable(
        ) -> None:
    """#15 on 2 CPUs: the unmanaged camera's p99 while a model loads stays near its own
    alone (0.25 vs 0.2 ms), so 0.5x unmanaged asks for a frame faster than the camera's own
    frame alone; the failed verdict says so, and a verdict whose floor is under the limit
    does not."""
    u, m = RunResult("unmanaged"), RunResult("managed")
    u.camera = {"alone": Stats([0.2] * 99 + [0.3]), "contended": Stats([2.0]),
                "loading": Stats([0.25])}
    m.camera = {"alone": Stats([0.6]), "contended": Stats([0.4]), "loading": Stats([0.4])}
    r = cv.ratios(u, m)
    assert r["camera p99 loading x unmanaged floor"] == 0.2 / 0.25  # the alone's p50
    assert r["camera p99 contended x unmanaged floor"] == 0.1
    contended, loading = cv.lines(r)[:2]
    assert contended.endswith("0.20x unmanaged (target <= 0.5x: PASS)")
    assert loading.endswith("1.60x unmanaged (target <= 0.5x: FAIL; unreachable here: the "
                            "camera's own frame alone, unmanaged (p50), is already 0.80x "
                            "this phase's unmanaged p99)")
    # A managed camera under the floor cannot happen, but a FAIL above a floor under the
    # limit is the managed path's own: no excuse printed.
    u.camera["loading"] = Stats([1.0])
    assert "unreachable" not in cv.lines(cv.ratios(u, m))[1]
    # Over invocations the floor has its own row and no verdict.
    by_pair = cv.over_invocations([[u, m]], [("unmanaged", "managed")])
    cells = dict((row[0], row[1:]) for row in cv.summary_rows(by_pair))
    assert cells["camera p99 loading x unmanaged floor"] == ("0.20x (0.20x-0.20x)",)
    ratios = cv.summary_json(by_pair)[0]["ratios"]
    assert isinstance(ratios, dict)
    assert ratios["camera p99 loading x unmanaged floor"]["pass"] is None


def test_a_phase_a_run_lacks_gives_no_ratio_and_no_verdict() -> None:
    u, m = pair(10.0, 1.0)
    del m.camera["loading"]
    u.embedder_items_s = float("nan")  # nan > 0 is False: no unmanaged rate to hold to
    r = cv.ratios(u, m)
    assert "camera p99 loading x alone" not in r and "camera p99 contended x alone" in r
    assert "embedder items/s % of unmanaged" not in r
    assert "background work % of unmanaged" not in r  # needs both apps
    assert not [ln for ln in cv.lines(r) if "loading" in ln or "embedder" in ln]


def test_invocations_alternate_their_order() -> None:
    assert cv.run_order(["a", "b", "c"], 1) == [["a", "b", "c"]]
    assert cv.run_order(["a", "b", "c"], 4) == [["a", "b", "c"], ["c", "b", "a"],
                                                 ["a", "b", "c"], ["c", "b", "a"]]
    # Over an even count each run is first as often as last.
    orders = cv.run_order(["u", "m"], 6)
    assert sum(o[0] == "u" for o in orders) == sum(o[-1] == "u" for o in orders) == 3


def test_spread_is_median_and_range_without_missing_values() -> None:
    s = cv.spread([3.0, 1.0, float("nan"), 2.0, 10.0])
    assert (s.median, s.lo, s.hi) == (2.5, 1.0, 10.0)
    assert len(s.values) == 5  # by invocation, the missing one kept as NaN
    empty = cv.spread([float("nan")])
    assert math.isnan(empty.median) and empty.values == ()


def test_verdicts_over_invocations_are_read_on_the_medians() -> None:
    """Three invocations: the managed camera's contended p99 is 1.2, 1.5 and 1.25x alone;
    one invocation alone would say PASS or FAIL by chance, the median (1.25x) passes."""
    invocations = [list(pair(10.0, p99, emb=emb)) for p99, emb in
                   ((1.2, 85.0), (1.5, 70.0), (1.25, 82.0))]
    by_pair = cv.over_invocations(invocations, [("unmanaged", "managed")])
    agg = by_pair[("unmanaged", "managed")]
    s = agg["camera p99 contended x alone"]
    assert (s.median, s.lo, s.hi) == (1.25, 1.2, 1.5)
    assert s.values == (1.2, 1.5, 1.25)  # in invocation order
    assert agg["embedder items/s % of unmanaged"].median == 0.82
    lines = cv.lines(cv.medians(agg))
    assert lines[0].startswith("camera p99 contended: managed 1.25x alone (target <= 1.3x: "
                               "PASS)")
    assert "embedder items/s: managed 82 % of unmanaged (target >= 80 %: PASS)" in lines
    rows = cv.summary_rows(by_pair)
    assert rows[0] == ("median (min-max)", "managed")
    cells = dict((r[0], r[1:]) for r in rows)
    assert cells["camera p99 contended x alone"] == ("1.25x (1.20x-1.50x)",)
    assert cells["embedder items/s % of unmanaged"] == ("82 % (70 %-85 %)",)
    js = cv.summary_json(by_pair)
    assert js[0]["unmanaged"] == "unmanaged" and js[0]["managed"] == "managed"
    ratios = js[0]["ratios"]
    assert isinstance(ratios, dict)
    assert ratios["camera p99 contended x alone"] == {
        "median": 1.25, "min": 1.2, "max": 1.5, "values": [1.2, 1.5, 1.25], "pass": True}


def test_each_pair_is_held_against_runs_of_its_own_invocation() -> None:
    """Two invocations whose runs come in different orders: every ratio pairs the runs of
    one invocation, never one invocation's managed with another's unmanaged."""
    u1, m1 = pair(10.0, 1.0)
    u2, m2 = pair(20.0, 1.0)
    by_pair = cv.over_invocations([[u1, m1], [m2, u2]], [("unmanaged", "managed")])
    s = by_pair[("unmanaged", "managed")]["camera p99 contended x unmanaged"]
    assert s.values == (0.1, 0.05)
    other = RunResult("bg-own-host")
    other.camera = dict(m1.camera)
    rows = cv.summary_rows(cv.over_invocations([[u1, m1, other]],
                                               [("unmanaged", "managed"),
                                                ("unmanaged", "bg-own-host")]))
    assert rows[0] == ("median (min-max)", "managed", "bg-own-host")
    cells = dict((r[0], r[1:]) for r in rows)
    # bg-own-host has no throughput of its own here (NaN / 100): no median, "-".
    assert cells["LLM tokens/s % of unmanaged"] == ("90 % (90 %-90 %)", "-")
