"""npumanager.words: the one rule by which a count meets its noun in what a person reads."""

from __future__ import annotations

import pytest

from npumanager.words import nouns, plural


@pytest.mark.parametrize(("n", "noun", "said"), [
    (1, "entry", "1 entry"), (0, "entry", "0 entries"), (3, "entry", "3 entries"),
    (1, "day", "1 day"), (2, "day", "2 days"), (2, "process", "2 processes"),
    (2, "execution step", "2 execution steps"), (1, "execution step", "1 execution step"),
    (2, "box", "2 boxes"), (2, "batch", "2 batches"), (2, "client", "2 clients"),
])
def test_plural(n: int, noun: str, said: str) -> None:
    assert plural(n, noun) == said


def test_an_irregular_plural_is_given() -> None:
    assert plural(2, "child", "children") == "2 children"
    assert plural(1, "child", "children") == "1 child"
    assert nouns(1, "benchmark") == "benchmark" and nouns(2, "benchmark") == "benchmarks"
