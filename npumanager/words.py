"""Counts in words, for every message a person reads: ``plural(1, "entry")`` is
"1 entry", ``plural(3, "entry")`` "3 entries", ``plural(0, "entry")`` "0 entries".

One rule in one place: the CLI said "1 entries", "1 client(s)" and "1 problem" each its
own way (or not at all)."""

from __future__ import annotations

_VOWELS = frozenset("aeiou")


def plural_of(noun: str) -> str:
    """``noun``'s plural by English's regular rules (entry -> entries, process ->
    processes, model -> models); of a phrase, its last word's (execution step -> execution
    steps). Irregular ones are passed to :func:`plural` as ``many``."""
    if noun.endswith("y") and len(noun) > 1 and noun[-2] not in _VOWELS:
        return noun[:-1] + "ies"
    if noun.endswith(("s", "x", "z", "ch", "sh")):
        return noun + "es"
    return noun + "s"


def plural(n: int, noun: str, many: str | None = None) -> str:
    """``n`` and ``noun``, singular for exactly one, else plural (``many`` if given)."""
    return f"{n} {noun if n == 1 else (many or plural_of(noun))}"


def nouns(n: int, noun: str, many: str | None = None) -> str:
    """``noun`` alone, in the number ``n`` asks for: "unknown benchmark x", "unknown
    benchmarks x, y"."""
    return noun if n == 1 else (many or plural_of(noun))
