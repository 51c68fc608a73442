"""Wire conversions and the status mapping at the gRPC edge."""

from __future__ import annotations

import json

import grpc
import pytest

from contracts.errors import (
    Conflict,
    CpnError,
    FailedPrecondition,
    InvalidArgument,
    NoFeasiblePlan,
    NotFound,
    PermissionDenied,
    Unauthenticated,
)
from proto.cpn.agent.v1 import agent_pb2
from resource_layer.convert import result_from_json, server_message_from_dict, task_state_name
from resource_layer.grpc_errors import status_code_for


def test_assignment_dict_with_a_config_dict_becomes_json() -> None:
    msg = server_message_from_dict(
        {"assignment": {"assignment_id": "a", "nproc": 2, "device_indices": [0, 1], "worker_config": {"b": 1},
                        "something_new": True}}
    )  # fmt: skip
    assert msg.assignment.nproc == 2 and list(msg.assignment.device_indices) == [0, 1]
    assert json.loads(msg.assignment.worker_config_json) == {"b": 1}


@pytest.mark.parametrize("bad", [{}, {"cancel": {}, "drain": {}}, {"assignment": {"nproc": "many"}}])
def test_malformed_node_messages_are_invalid(bad: dict[str, object]) -> None:
    with pytest.raises(InvalidArgument):
        server_message_from_dict(bad)


def test_task_states() -> None:
    assert task_state_name(agent_pb2.TASK_STATE_SUCCEEDED) == "succeeded"
    with pytest.raises(InvalidArgument, match="task_status.state"):
        task_state_name(agent_pb2.TASK_STATE_UNSPECIFIED)


def test_results() -> None:
    assert result_from_json("") is None
    assert result_from_json('{"loss": 1}') == {"loss": 1}
    assert result_from_json("[1, 2]") == {"value": [1, 2]}
    assert result_from_json("oops") == {"raw": "oops"}


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (NotFound("x"), grpc.StatusCode.NOT_FOUND),
        (InvalidArgument("x"), grpc.StatusCode.INVALID_ARGUMENT),
        (FailedPrecondition("x"), grpc.StatusCode.FAILED_PRECONDITION),
        (NoFeasiblePlan("x"), grpc.StatusCode.FAILED_PRECONDITION),
        (Unauthenticated("x"), grpc.StatusCode.UNAUTHENTICATED),
        (PermissionDenied("x"), grpc.StatusCode.PERMISSION_DENIED),
        (Conflict("x"), grpc.StatusCode.ALREADY_EXISTS),
        (CpnError("x"), grpc.StatusCode.INTERNAL),
    ],
)
def test_domain_errors_map_to_their_status(exc: CpnError, code: grpc.StatusCode) -> None:
    assert status_code_for(exc) == code
