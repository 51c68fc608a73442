"""When sync events happen: pure functions of the step number (every rank must agree)."""

from __future__ import annotations


def is_start(step: int, round_steps: int) -> bool:
    return step > 0 and step % round_steps == 0


def is_apply(step: int, round_steps: int, delay: int) -> bool:
    """The step at which a round started ``delay`` steps earlier is applied."""
    return step - delay > 0 and (step - delay) % round_steps == 0


def anchored_event(step: int, round_steps: int, delay: int, total_steps: int) -> bool:
    return (
        step == 1 or step == total_steps or is_start(step, round_steps) or is_apply(step, round_steps, delay)
    )


def fragment_of(round_index: int, fragments: int) -> int:
    return round_index % fragments


def fragment_slices(numel: int, fragments: int) -> list[slice]:
    """Contiguous, near-equal element ranges covering ``numel``."""
    bounds = [numel * i // fragments for i in range(fragments + 1)]
    return [slice(bounds[i], bounds[i + 1]) for i in range(fragments)]
