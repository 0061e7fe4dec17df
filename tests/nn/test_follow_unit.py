"""nn/model_move.Follow without processes: what a model's runtime does with the notices its
answers carry (prepare on the new host once, a copy dropped when the grant moves back,
a failed prepare tried again only after a back-off)."""

from __future__ import annotations

import threading
import time
from typing import Any

from npumanager.nn.model_move import Follow


class FakeModel:
    def __init__(self, lane: str) -> None:
        self.device = type("Dev", (), {"lane_name": lane})()
        self.released = False

    def release(self) -> None:
        self.released = True


class FakeRecipe:
    """prepare_on: a FakeModel on that lane, or raises while ``fail``; counts calls."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.made: list[FakeModel] = []
        self.fail = False
        self.gate = threading.Event()
        self.gate.set()
        self.home: Any = type("Home", (), {"name": "ref"})()

    def prepare_on(self, lane: str) -> FakeModel:
        self.calls.append(lane)
        self.gate.wait(10)
        if self.fail:
            raise RuntimeError("no room there")
        self.made.append(FakeModel(lane))
        return self.made[-1]


def settle(follow: Follow) -> None:
    deadline = time.monotonic() + 10
    while follow._running:
        assert time.monotonic() < deadline
        time.sleep(0.005)


def test_one_prepare_per_move_and_a_copy_dropped_when_the_grant_moves_back() -> None:
    recipe = FakeRecipe()
    ready: list[int] = []
    follow = Follow(recipe, lambda: ready.append(1))  # type: ignore[arg-type]
    recipe.gate.clear()
    for _ in range(50):  # every answer says so: one prepare
        follow.noted("", "background")
    recipe.gate.set()
    settle(follow)
    assert recipe.calls == [""] and ready == [1]
    copy = follow.ready
    assert copy is not None and copy.device.lane_name == ""
    follow.noted("", "background")  # ready already: nothing new
    assert recipe.calls == [""]
    follow.noted(None, "background")  # it moved back before the swap: the copy goes
    assert follow.ready is None and copy.released and follow.target is None  # type: ignore[attr-defined]
    # A notice with start=False (a burst's open) records where, prepares nothing.
    follow.noted("", "background", start=False)
    assert follow.target == "" and recipe.calls == [""]
    follow.prepare_now("")
    assert follow.take() is not None and recipe.calls == ["", ""]
    follow.close()


def test_a_failed_prepare_is_tried_again_after_a_back_off_only() -> None:
    recipe = FakeRecipe()
    recipe.fail = True
    follow = Follow(recipe)  # type: ignore[arg-type]
    follow.noted("background", "")
    settle(follow)
    for _ in range(20):
        follow.noted("background", "")
    settle(follow)
    assert recipe.calls == ["background"] and follow.ready is None
    follow._prepares.at = 0.0  # (the back-off over)
    recipe.fail = False
    follow.noted("background", "")
    settle(follow)
    assert recipe.calls == ["background", "background"] and follow.ready is not None
    follow.close()
    assert follow.ready is None


def test_a_copy_finished_after_the_model_was_released_is_released() -> None:
    recipe = FakeRecipe()
    recipe.gate.clear()
    follow = Follow(recipe)  # type: ignore[arg-type]
    follow.noted("", "background")
    follow.close()  # the model released while its copy is being prepared
    recipe.gate.set()
    settle(follow)
    assert follow.ready is None and [m.released for m in recipe.made] == [True]


def test_a_failed_hand_over_is_tried_again_on_a_later_notice_after_a_back_off(
        caplog: Any) -> None:
    """The copy is ready but its hand-over fails (a standby refused: raises; the check
    failed: False): later notices start no thread before the back-off, a refusal is
    logged once, and one try after the back-off that moves starts over."""
    recipe = FakeRecipe()
    tries: list[int] = []
    outcome: list[Any] = [RuntimeError("a connection may hold 8 bursts")]

    def on_ready() -> bool:
        tries.append(1)
        if isinstance(outcome[0], Exception):
            raise outcome[0]
        if outcome[0]:
            follow.arrived()
        return bool(outcome[0])

    follow = Follow(recipe, on_ready)  # type: ignore[arg-type]
    with caplog.at_level("WARNING", logger="npumanager.nn"):
        follow.noted("", "background")
        settle(follow)
        assert (recipe.calls, len(tries)) == ([""], 1) and follow.ready is not None
        for _ in range(50):  # every answer says so: nothing before the back-off
            follow.noted("", "background")
        settle(follow)
        assert len(tries) == 1 and recipe.calls == [""]  # (and no second prepare)
        assert follow._handovers.wait == 2.0  # 1 s, doubling
        follow._handovers.at = 0.0  # (the back-off over) refused again: not logged again
        follow.noted("", "background")
        settle(follow)
        outcome[0] = False  # the check failed (a burst opened meanwhile): quietly later
        follow._handovers.at = 0.0
        follow.noted("", "background")
        settle(follow)
        assert len(tries) == 3 and follow._handovers.wait == 8.0
        refusals = [r for r in caplog.records if "could not move" in r.getMessage()]
        assert len(refusals) == 1 and "8 bursts" in refusals[0].getMessage()
        outcome[0] = True
        follow._handovers.at = 0.0
        follow.noted("", "background")
        settle(follow)
    assert len(tries) == 4 and follow.moves == 1 and follow._handovers.wait == 1.0
    # A notice with start=False (a burst's open) starts no hand-over either.
    follow._handovers.at = 0.0
    follow.noted("", "background", start=False)
    assert len(tries) == 4
    follow.close()
