"""A node's measured profile crosses the wire whole: both conversions come from one field list,
and that list names every field of the contract and of the message."""

from __future__ import annotations

from dataclasses import fields

from contracts.registration import PROFILE_FIELDS, STEP_RATE_WIRE_FIELDS, NodeProfile, StepRate
from proto.cpn.agent.v1 import agent_pb2
from proto.cpn.agent.v1.profile import profile_from_proto, profile_to_proto


def test_the_field_list_names_every_field_of_both_sides() -> None:
    assert {*PROFILE_FIELDS, "rates"} == {f.name for f in fields(NodeProfile)}
    assert {*PROFILE_FIELDS, "rates"} == set(agent_pb2.MeasuredProfile.DESCRIPTOR.fields_by_name)
    assert set(STEP_RATE_WIRE_FIELDS) == {f.name for f in fields(StepRate)}
    assert set(STEP_RATE_WIRE_FIELDS) == set(agent_pb2.MeasuredStepRate.DESCRIPTOR.fields_by_name)


def test_a_profile_survives_the_round_trip() -> None:
    # Every figure distinct and none at its default, so a field dropped or swapped shows.
    rates = tuple(
        StepRate(p, *(float(i + 10 * k + 1) for i in range(len(STEP_RATE_WIRE_FIELDS) - 1)))
        for k, p in enumerate(("fp32", "bf16"))
    )
    figures = {name: float(i + 1) * 0.5 for i, name in enumerate(PROFILE_FIELDS)}
    figures["physical_cores"] = 12
    profile = NodeProfile(**figures, rates=rates)
    wire = profile_to_proto(profile)
    assert profile_from_proto(agent_pb2.MeasuredProfile.FromString(wire.SerializeToString())) == profile
    assert wire.physical_cores == 12 and [r.precision for r in wire.rates] == ["fp32", "bf16"]
