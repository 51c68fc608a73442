"""A node's devices and their heartbeat samples cross the wire whole: both conversions come from one
field list each, and the lists name every field of the contract and of the message (but the ones
that stay on the node or travel renamed)."""

from __future__ import annotations

from dataclasses import fields

from contracts.device_samples import DeviceSample
from contracts.registration import DeviceReport
from proto.cpn.agent.v1 import agent_pb2
from proto.cpn.agent.v1.devices import (
    DEVICE_WIRE_FIELDS,
    SAMPLE_FIELDS,
    device_from_proto,
    device_to_proto,
    sample_from_proto,
    sample_to_proto,
)


def test_the_field_lists_name_every_field_of_both_sides() -> None:
    assert {*DEVICE_WIRE_FIELDS, "link_group", "bus_index"} == {f.name for f in fields(DeviceReport)}
    assert {*DEVICE_WIRE_FIELDS, "nvlink_island"} == set(agent_pb2.Device.DESCRIPTOR.fields_by_name)
    assert set(SAMPLE_FIELDS) == set(agent_pb2.DeviceSample.DESCRIPTOR.fields_by_name)


def test_a_device_survives_the_round_trip_but_its_bus_index() -> None:
    device = DeviceReport(3, "H100 80GB HBM3", 79.6, 612.5, "gpu", "GPU-4f1a", link_group=1, bus_index=5)
    wire = agent_pb2.Device.FromString(device_to_proto(device).SerializeToString())
    assert wire.nvlink_island == 2
    assert device_from_proto(wire) == DeviceReport(3, "H100 80GB HBM3", 79.6, 612.5, "gpu", "GPU-4f1a", 1)
    unknown = DeviceReport(0, "cpu", 0.0, 0.1, "cpu")
    assert device_to_proto(unknown).nvlink_island == 0
    assert device_from_proto(device_to_proto(unknown)).link_group == -1


def test_a_sample_survives_the_round_trip() -> None:
    sample = DeviceSample(2, 0.75, 41.5, 612.0, 71.0, "XID 79: fell off the bus")
    wire = agent_pb2.DeviceSample.FromString(sample_to_proto(sample).SerializeToString())
    assert sample_from_proto(wire) == sample
