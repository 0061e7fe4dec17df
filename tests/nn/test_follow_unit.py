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
    follow._retry_at = 0.0  # (the back-off over)
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
