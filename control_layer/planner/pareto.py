"""The cost-vs-time Pareto front, its labels, and which options to return."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")

# Two points closer than this (relative) in both time and cost are the same point.
SAME = 1e-9


def pareto_front(
    items: Sequence[T], point: Callable[[T], tuple[float, float]], tiebreak: Callable[[T], tuple]
) -> list[T]:
    """Items no other item beats on both (time, cost); near-equal points keep the first by tiebreak.

    Returned in ascending time (so descending cost).
    """
    ordered = sorted(items, key=lambda it: (*point(it), tiebreak(it)))
    front: list[T] = []
    best_cost = float("inf")
    for it in ordered:
        t, c = point(it)
        if front:
            ft, fc = point(front[-1])
            if abs(t - ft) <= SAME * max(abs(ft), 1e-300) and abs(c - fc) <= SAME * max(abs(fc), 1e-300):
                continue
        if c < best_cost * (1 - SAME):
            front.append(it)
            best_cost = c
    return front


def labels(front: Sequence[T], point: Callable[[T], tuple[float, float]]) -> dict[int, str]:
    """Index in front -> label: fastest (first), cheapest (last), balanced (least normalised sum)."""
    if not front:
        return {}
    out = {len(front) - 1: "cheapest", 0: "fastest"}
    if len(front) >= 3:
        t0 = min(point(x)[0] for x in front)
        c0 = min(point(x)[1] for x in front)
        inner = range(1, len(front) - 1)
        best = min(inner, key=lambda i: (point(front[i])[0] / t0 + point(front[i])[1] / c0, i))
        out[best] = "balanced"
    return out


def select(front_len: int, labelled: dict[int, str], k: int, first: int) -> list[int]:
    """Indices to return: `first` (the objective's best), the other labelled ones, then points
    spread evenly along the front."""
    chosen = [first] + [i for i in sorted(labelled) if i != first]
    chosen = chosen[:k]
    rest = [i for i in range(front_len) if i not in chosen]
    want = k - len(chosen)
    if want <= 0 or not rest:
        return sorted(chosen)
    if want >= len(rest):
        return sorted(chosen + rest)
    step = len(rest) / want
    picked = {rest[int(j * step + step / 2)] for j in range(want)}
    return sorted(set(chosen) | picked)
