"""Choosing one option of a quote: by the planner's label, else by cost, time or their product."""

from __future__ import annotations

from contracts.errors import InvalidArgument, NoFeasiblePlan
from control_layer.planner.plan_types import PlanOption

CHOICES = ("cheapest", "fastest", "balanced")


def choose_option(options: list[PlanOption], choice: str) -> PlanOption:
    """The option the planner labelled ``choice``; without labels, by cost, time or their product."""
    if choice not in CHOICES:
        raise InvalidArgument(f"choice must be one of {list(CHOICES)}, got {choice!r}", field="choice")
    if not options:
        raise NoFeasiblePlan("the planner returned no options", explanation=[])
    for option in options:
        if option.label == choice:
            return option
    cost = {o.id: o.estimates.cost.total for o in options}
    time = {o.id: o.estimates.duration_s for o in options}
    if choice == "cheapest":
        return min(options, key=lambda o: (cost[o.id], time[o.id]))
    if choice == "fastest":
        return min(options, key=lambda o: (time[o.id], cost[o.id]))
    return min(options, key=lambda o: (cost[o.id] * time[o.id], cost[o.id]))
