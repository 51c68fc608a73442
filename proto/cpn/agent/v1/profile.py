"""A node's measured profile on the wire: ``NodeProfile`` <-> ``MeasuredProfile``, both directions
from the profile's one field list (``contracts.registration.PROFILE_FIELDS``, and
``STEP_RATE_WIRE_FIELDS`` for each rate). The agent sends it, the resource layer reads it."""

from __future__ import annotations

from contracts.registration import PROFILE_FIELDS, STEP_RATE_WIRE_FIELDS, NodeProfile, StepRate
from proto.cpn.agent.v1 import agent_pb2


def profile_to_proto(p: NodeProfile) -> agent_pb2.MeasuredProfile:
    return agent_pb2.MeasuredProfile(
        **{k: getattr(p, k) for k in PROFILE_FIELDS},
        rates=[
            agent_pb2.MeasuredStepRate(**{k: getattr(r, k) for k in STEP_RATE_WIRE_FIELDS}) for r in p.rates
        ],
    )


def profile_from_proto(m: agent_pb2.MeasuredProfile) -> NodeProfile:
    return NodeProfile(
        **{k: getattr(m, k) for k in PROFILE_FIELDS},
        rates=tuple(StepRate(**{k: getattr(r, k) for k in STEP_RATE_WIRE_FIELDS}) for r in m.rates),
    )
