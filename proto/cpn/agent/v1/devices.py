"""A node's devices on the wire, both directions from one field list each: ``DeviceReport`` <->
``Device`` at registration and in inventories, ``DeviceSample`` <-> ``DeviceSample`` in heartbeats.
The agent sends them, the resource layer reads them."""

from __future__ import annotations

from dataclasses import fields

from contracts.device_samples import DeviceSample
from contracts.registration import DeviceReport
from proto.cpn.agent.v1 import agent_pb2

# ``link_group`` travels as ``nvlink_island`` = link_group + 1 (0 on the wire: not known), and
# ``bus_index`` stays on the node.
DEVICE_WIRE_FIELDS = ("index", "model", "memory_gb", "measured_tflops", "kind", "uuid")
SAMPLE_FIELDS = tuple(f.name for f in fields(DeviceSample))


def device_to_proto(d: DeviceReport) -> agent_pb2.Device:
    return agent_pb2.Device(**{k: getattr(d, k) for k in DEVICE_WIRE_FIELDS}, nvlink_island=d.link_group + 1)


def device_from_proto(d: agent_pb2.Device) -> DeviceReport:
    return DeviceReport(**{k: getattr(d, k) for k in DEVICE_WIRE_FIELDS}, link_group=d.nvlink_island - 1)


def sample_to_proto(s: DeviceSample) -> agent_pb2.DeviceSample:
    return agent_pb2.DeviceSample(**{k: getattr(s, k) for k in SAMPLE_FIELDS})


def sample_from_proto(s: agent_pb2.DeviceSample) -> DeviceSample:
    return DeviceSample(**{k: getattr(s, k) for k in SAMPLE_FIELDS})
