"""Conversions between cpn.agent.v1 messages and the plain data the domain functions take."""

from __future__ import annotations

import json
from typing import Any

from google.protobuf import json_format

from contracts.device_samples import GpuReport, checked_report
from contracts.errors import InvalidArgument
from contracts.node_staging import StagingProbe
from contracts.registration import (
    SANDBOX_NONE,
    NodeRegistration,
    ProfileReport,
)
from contracts.states import TaskState
from proto.cpn.agent.v1 import agent_pb2
from proto.cpn.agent.v1.devices import device_from_proto, sample_from_proto
from proto.cpn.agent.v1.profile import profile_from_proto

# TaskState -> Task.status as the control layer spells it.
TASK_STATES: dict[int, str] = {
    agent_pb2.TASK_STATE_STARTING: TaskState.STARTING,
    agent_pb2.TASK_STATE_RUNNING: TaskState.RUNNING,
    agent_pb2.TASK_STATE_SUCCEEDED: TaskState.SUCCEEDED,
    agent_pb2.TASK_STATE_FAILED: TaskState.FAILED,
    agent_pb2.TASK_STATE_CANCELLED: TaskState.CANCELLED,
}
SERVER_MESSAGE_KINDS = (
    "assignment",
    "cancel",
    "drain",
    "ack",
    "probe",
    "checkpoint_copy",
    "peer_lost",
    "preempt",
)
METRIC_PARTS = ("data_s", "compute_s", "optimizer_s", "sync_s", "checkpoint_s", "step_wall_s")
# Optional TaskMetrics fields set on some steps only (gossip's spread: at its checks) or by some
# workers only (wire bytes: where the kernel's TCP counters can be read; the job step: where
# balanced rounds give the region a step count of its own).
METRIC_SOMETIMES = ("gossip_spread", "wan_wire_bytes_sent", "job_step")


def gpu_report_from_heartbeat(hb: agent_pb2.Heartbeat) -> tuple[GpuReport | None, list[str]]:
    """A GPU node's device samples and health (None from a node that sends none), and the
    samples left out as out of bounds."""
    if not hb.devices and not hb.node_health:
        return None, []
    return checked_report([sample_from_proto(d) for d in hb.devices], hb.node_health)


def registration_from_proto(r: agent_pb2.RegisterRequest) -> NodeRegistration:
    return NodeRegistration(
        enrollment_token=r.enrollment_token,
        region=r.region,
        cluster=r.cluster,
        provider=r.provider,
        hostname=r.hostname,
        devices=tuple(device_from_proto(d) for d in r.devices),
        price_per_device_hour=r.price_per_device_hour,
        spot_price_per_device_hour=r.spot_price_per_device_hour,
        agent_version=r.agent_version,
        advertise_host=r.advertise_host,
        sync_port_min=r.sync_port_min,
        sync_port_max=r.sync_port_max,
        intra_bandwidth_gbps=r.intra_bandwidth_gbps,
        jurisdiction=r.jurisdiction,
        node_id=r.node_id,
        node_token=r.node_token,
        probe_port=r.probe_port,
        checkpoint_port=r.checkpoint_port,
        node_fabric_gbps=r.node_fabric_gbps,
        node_fabric_latency_ms=r.node_fabric_latency_ms,
        cross_cluster_host=r.cross_cluster_host,
        cpu_contention=r.cpu_contention,
        cpu_contention_probe_ages_s=tuple(r.cpu_contention_probe_ages_s),
        sandbox=r.sandbox or SANDBOX_NONE,  # an agent that does not say runs no users' code
        profile=profile_from_proto(r.measured_profile) if r.HasField("measured_profile") else None,
        profile_follows=r.profile_follows,
    )


def profile_report_from_proto(r: agent_pb2.ProfileReport) -> ProfileReport:
    return ProfileReport(
        profile=profile_from_proto(r.measured_profile) if r.HasField("measured_profile") else None,
        error=r.error[:500],  # only logged
        cpu_contention=r.cpu_contention,
        cpu_contention_probe_ages_s=tuple(r.cpu_contention_probe_ages_s),
    )


def staging_probe_from_proto(p: agent_pb2.StagingProbeResult) -> StagingProbe:
    return StagingProbe(
        fetch_fixed_s=p.fetch_fixed_s,
        bytes_per_s=p.bytes_per_s,
        probe_bytes=p.probe_bytes,
        venv_s=p.venv_s,
        error=p.error,
    )


def task_state_name(state: int) -> str:
    try:
        return TASK_STATES[state]
    except KeyError:
        raise InvalidArgument(f"task_status.state: unknown or unspecified task state {state}") from None


def result_from_json(text: str) -> dict[str, Any] | None:
    """The worker's result; a result that is not a JSON object is kept under ``raw``."""
    if not text:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return {"raw": text[:2000]}
    return value if isinstance(value, dict) else {"value": value}


def metrics_to_dict(m: agent_pb2.TaskMetrics) -> dict[str, Any]:
    return {
        "step": m.step,
        "total_steps": m.total_steps,
        "loss": m.loss,
        "tokens_per_s": m.tokens_per_s,
        "compute_utilization": m.compute_utilization,
        "wan_bytes_sent": m.wan_bytes_sent,
        "wan_bytes_recv": m.wan_bytes_recv,
        "sync_latency_s": m.sync_latency_s,
        "wall_time_s": m.wall_time_s,
        # The step's parts, only those the worker measured (optional fields).
        **{key: getattr(m, key) for key in (*METRIC_PARTS, *METRIC_SOMETIMES) if m.HasField(key)},
        "checkpoint_step": m.checkpoint_step,
    }


def server_message_from_dict(message: dict[str, Any]) -> agent_pb2.ServerMessage:
    """A bus message for a node (``{"assignment": {...}}``, ``{"cancel": {...}}``, ``{"drain": {...}}``)
    as the ServerMessage it stands for. An assignment may carry its worker config as a dict under
    ``worker_config`` instead of the JSON string ``worker_config_json``."""
    kinds = [k for k in SERVER_MESSAGE_KINDS if k in message]
    if len(kinds) != 1:
        raise InvalidArgument(
            f"node message must have exactly one of {SERVER_MESSAGE_KINDS}, got keys {sorted(message)}"
        )
    kind = kinds[0]
    body = dict(message[kind] or {})
    if kind == "assignment" and "worker_config" in body:
        body["worker_config_json"] = json.dumps(body.pop("worker_config"), sort_keys=True)
    out = agent_pb2.ServerMessage()
    try:
        json_format.ParseDict(body, getattr(out, kind), ignore_unknown_fields=True)
    except json_format.ParseError as exc:
        raise InvalidArgument(f"node message {kind}: {exc}") from exc
    return out
