"""The GPU node's pure parts on recorded NVML readings (tests/agent/nvml_readings/, in
``agent.nvml``'s shape): which devices an agent offers and by which UUID, their NVLink islands,
the health rules, and the worker environment that names the devices."""

from __future__ import annotations

import copy
import json
import re
import threading
from pathlib import Path
from typing import Any

import pytest

from agent.gpu_health import node_reason, verdicts
from agent.gpu_offer import offer
from agent.gpu_reading import parse_reading
from agent.gpu_telemetry import gpu_state, with_past_events
from agent.gpu_topology import nvlink_gbytes_s, nvlink_islands, pcie_gbytes_s, peer_gbytes_s
from agent.gpu_visible import torch_ordinals, visible_units
from agent.gpu_watch import GpuWatch
from agent.profile import reference_env, slowest
from agent.workers import Assignment, bus_indices, worker_env
from contracts.errors import FailedPrecondition, InvalidArgument
from contracts.registration import DeviceReport, NodeProfile, StepRate, device_problems

READINGS = Path(__file__).parent / "nvml_readings"


def raw(name: str) -> dict[str, Any]:
    return json.loads((READINGS / f"{name}.json").read_text())


def test_hgx_h100_offers_eight_gpus_in_one_nvlink_island() -> None:
    reading = parse_reading(raw("h100_sxm_8"))
    units = visible_units(reading, None)
    assert [u.uuid for u in units] == [g.uuid for g in reading.gpus]
    assert {u.name for u in units} == {"NVIDIA H100 80GB HBM3"} and units[0].memory_gb == 79.65
    assert nvlink_islands(reading, units) == [0] * 8
    assert nvlink_gbytes_s(units[0].gpu) == 450.0  # NVLink 4, 18 links
    assert peer_gbytes_s(units, [0] * 8) == 450.0
    assert pcie_gbytes_s(units[0].gpu) == pytest.approx(63.0, abs=0.1)  # Gen5 x16


def test_pcie_node_with_bridged_pairs_has_two_islands_and_pcie_between_them() -> None:
    reading = parse_reading(raw("a100_pcie_4_bridged_pairs"))
    units = visible_units(reading, None)
    islands = nvlink_islands(reading, units)
    assert islands == [0, 0, 1, 1]
    assert peer_gbytes_s(units[:2], islands[:2]) == 300.0  # the bridge: NVLink 3, 12 links
    assert peer_gbytes_s(units, islands) == pytest.approx(31.5, abs=0.1)  # the ring crosses Gen4 x16
    # A share of one GPU from each pair: two islands of one, PCIe between them.
    share = visible_units(reading, "1,2")
    assert nvlink_islands(reading, share) == [0, 1]


def test_mig_instances_are_devices_of_their_own_with_no_peers() -> None:
    reading = parse_reading(raw("a100_sxm_2_mig"))
    units = visible_units(reading, None)
    assert [u.name for u in units] == [
        "NVIDIA A100-SXM4-40GB MIG 3g.20gb",
        "NVIDIA A100-SXM4-40GB MIG 2g.10gb",
        "NVIDIA A100-SXM4-40GB MIG 1g.5gb",
        "NVIDIA A100-SXM4-40GB",
    ]
    assert [u.is_mig for u in units] == [True, True, True, False]
    assert [u.memory_gb for u in units] == [19.5, 9.75, 4.88, 40.0]
    assert nvlink_islands(reading, units) == [0, 1, 2, 3]  # GPU 1's NVLink to GPU 0 serves no instance
    mig = reading.gpus[0].mig
    # By MIG UUID (or a unique prefix of it, as CUDA takes), and by the MIG GPU's own UUID: its instances.
    assert [u.uuid for u in visible_units(reading, f"{mig[2].uuid},{mig[0].uuid[:12]}")] == [
        mig[2].uuid,
        mig[0].uuid,
    ]
    assert [u.uuid for u in visible_units(reading, reading.gpus[0].uuid)] == [m.uuid for m in mig]
    with pytest.raises(FailedPrecondition, match="GPU 0 is in MIG mode"):
        visible_units(reading, "0")


def test_inherited_cuda_visible_devices_maps_to_the_named_physical_gpus() -> None:
    reading = parse_reading(raw("h100_sxm_8"))
    g = reading.gpus
    # Slurm's indices are NVML's (PCI bus order), in the order given.
    assert [u.uuid for u in visible_units(reading, "6,2")] == [g[6].uuid, g[2].uuid]
    assert [u.uuid for u in visible_units(reading, f" {g[3].uuid} ,{g[1].uuid[:10]}")] == [
        g[3].uuid,
        g[1].uuid,
    ]
    assert visible_units(reading, "") == []
    for bad, why in [("8", "beyond this node's 8"), ("GPU-", "no single GPU"),
                     ("GPU-ffffffff", "no single GPU"), ("2,2", "listed before"),
                     (f"2,{g[2].uuid}", "listed before"), ("nvidia0", "expected indices"),
                     ("MIG-GPU-x/1/0", "no single MIG")]:  # fmt: skip
        with pytest.raises(FailedPrecondition, match=why):
            visible_units(reading, bad)


def test_agent_ordinals_are_matched_by_uuid_not_position() -> None:
    reading = parse_reading(raw("h100_sxm_8"))
    units = visible_units(reading, "5,1")
    torch_sees = [
        reading.gpus[1].uuid.removeprefix("GPU-").upper(),
        reading.gpus[5].uuid.removeprefix("GPU-"),
    ]
    assert torch_ordinals(units, torch_sees) == [1, 0]
    with pytest.raises(FailedPrecondition, match="not visible to torch"):
        torch_ordinals(units, torch_sees[:1])


def test_xid_79_cordons_the_node_and_ecc_cordons_the_device() -> None:
    r = raw("h100_sxm_8_xid79_ecc")
    reading = parse_reading(r)
    found = verdicts(reading)
    g2, g5 = reading.gpus[2].uuid, reading.gpus[5].uuid
    assert [(v.scope, v.uuid) for v in found] == [
        ("device", g2),
        ("device", g2),
        ("device", g2),
        ("node", g5),
    ]
    assert "2 uncorrectable ECC error(s)" in found[0].reason and "row remapping pending" in found[1].reason
    assert "XID 94" in found[2].reason
    assert node_reason(found) == f"GPU 5 ({g5}): XID 79, GPU has fallen off the bus; the node needs a reboot"
    assert all("XID 13" not in v.reason for v in found)  # the user's illegal address cordons nothing
    whole = offer(reading, None)
    assert whole.units == () and "XID 79" in whole.node_reason
    # Without the XID 79: GPU 2 leaves the offer, the other seven stay one island.
    r["xid_events"] = [e for e in r["xid_events"] if e["xid"] != 79]
    part = offer(parse_reading(r), None)
    assert part.node_reason == "" and len(part.units) == 7 and g2 not in {u.uuid for u in part.units}
    assert part.islands == (0,) * 7


def test_retired_pages_and_failed_remapping_cordon_the_device() -> None:
    r = raw("h100_sxm_8")
    r["gpus"][4]["retired_pages"] = {"single_bit": 41, "double_bit": 19, "pending": False}
    r["gpus"][7]["remapped_rows"] = {"correctable": 3, "uncorrectable": 9, "pending": True, "failure": True}
    found = verdicts(parse_reading(r))
    assert [v.reason.split(": ", 1)[1] for v in found] == [
        "60 retired pages (limit 60)",
        "row remapping failed: the GPU needs replacing",
    ]
    assert not verdicts(parse_reading(raw("h100_sxm_8")))


def test_a_reading_with_nonsense_is_refused_naming_the_field() -> None:
    def broken(path: tuple[Any, ...], value: Any) -> dict[str, Any]:
        r = copy.deepcopy(raw("a100_pcie_4_bridged_pairs"))
        at = r
        for key in path[:-1]:
            at = at[key]
        at[path[-1]] = value
        return r

    for path, value, field in [
        (("gpus", 1, "power_mw"), float("nan"), "gpus[1].power_mw"),
        (("gpus", 1, "temperature_c"), 1e6, "gpus[1].temperature_c"),
        (("gpus", 2, "uuid"), "GPU-1234", "gpus[2].uuid"),
        (("gpus", 2, "index"), 3, "gpus[2].index"),
        (("gpus", 0, "ecc", "volatile_uncorrected"), -1, "gpus[0].ecc.volatile_uncorrected"),
        (("p2p_nvlink", 0, 2), True, "p2p_nvlink[0][2]"),  # not symmetric
        (("pcie_ancestor", 1, 2), 35, "pcie_ancestor[1][2]"),
        (("schema",), 2, "reading.schema"),
        (("xid_events",), [{"gpu_uuid": "x", "xid": 79, "at": 0}], "xid_events[0].gpu_uuid"),
    ]:
        with pytest.raises(InvalidArgument, match="^" + re.escape(field)):
            parse_reading(broken(path, value))


def test_workers_get_their_gpus_by_uuid_and_the_sandbox_their_bus_indices() -> None:
    reading = parse_reading(raw("h100_sxm_8"))
    units = visible_units(reading, "4,5,6,7")  # the agent's share of the node: its devices 0..3
    reports = [
        DeviceReport(i, u.name, u.memory_gb, 900.0, "cuda", uuid=u.uuid, link_group=0, bus_index=u.gpu.index)
        for i, u in enumerate(units)
    ]
    assert device_problems(reports) == []
    a = Assignment("a1", "j1", 0, (1, 3), 2, {})
    mine = [reports[1], reports[3]]
    env = worker_env({"PATH": "/bin"}, a, device_kind="cuda", config_path=Path("c.json"), devices=mine)
    assert env["CUDA_VISIBLE_DEVICES"] == f"{reading.gpus[5].uuid},{reading.gpus[7].uuid}"
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert bus_indices(a, mine) == (5, 7)
    # A node without NVML figures (no UUIDs, no bus indices): its own indices, as before.
    bare = [DeviceReport(i, "gpu", 80.0, 900.0, "cuda") for i in range(4)]
    env = worker_env({}, a, device_kind="cuda", config_path=Path("c.json"), devices=[bare[1], bare[3]])
    assert env["CUDA_VISIBLE_DEVICES"] == "1,3" and bus_indices(a, [bare[1], bare[3]]) == (1, 3)
    bad = DeviceReport(0, "gpu", 80.0, 900.0, "cuda", uuid="GPU-nope", link_group=2000)
    assert [p.split(":")[0] for p in device_problems([bad])] == ["devices[0].uuid", "devices[0].link_group"]


def test_the_node_registers_its_slowest_devices_reference_step() -> None:
    def measured(tflops: float) -> NodeProfile:
        return NodeProfile(startup_s=3.0, teardown_s=0.5, physical_cores=64,
                           rates=(StepRate("fp32", tflops / 8), StepRate("bf16", tflops)))  # fmt: skip

    devices = [measured(610.0), measured(455.0), measured(598.0)]  # device 1 throttles
    assert slowest(devices) is devices[1]
    env = reference_env({"PATH": "/bin"}, "cuda", "GPU-0f6e2b1c-8c3a-4d59-9a43-1b2c3d4e5f60")
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-0f6e2b1c-8c3a-4d59-9a43-1b2c3d4e5f60"
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"


def test_heartbeat_samples_and_health_from_a_reading() -> None:
    r = raw("a100_sxm_2_mig")
    reading = parse_reading(r)
    units = visible_units(reading, None)
    devices = [DeviceReport(i, u.name, u.memory_gb, 200.0, "cuda", uuid=u.uuid) for i, u in enumerate(units)]
    state = gpu_state(reading, devices)
    # A MIG instance reads as its GPU; GPU 1 runs a job at 88 %.
    assert [(x.index, x.utilization, x.power_w, x.temperature_c) for x in state.samples] == [
        (0, 0.0, 52.0, 30.0), (1, 0.0, 52.0, 30.0), (2, 0.0, 52.0, 30.0), (3, 0.88, 301.0, 61.0)
    ]  # fmt: skip
    assert state.samples[3].memory_used_gb == 0.004 and state.node_health == ""
    assert all(x.health == "" for x in state.samples)
    # An uncorrectable ECC error on the MIG GPU: the reason on each of its three instances.
    r["gpus"][0]["ecc"]["volatile_uncorrected"] = 1
    bad = gpu_state(parse_reading(r), devices)
    assert [bool(x.health) for x in bad.samples] == [True, True, True, False] and bad.node_health == ""
    assert "1 uncorrectable ECC error(s)" in bad.samples[0].health


def test_an_xid_stays_with_the_node_after_its_reading() -> None:
    r = raw("h100_sxm_8_xid79_ecc")
    first = parse_reading(r)
    r["xid_events"] = []
    later = with_past_events(parse_reading(r), first.xid_events)
    devices = [DeviceReport(i, g.name, 79.65, 900.0, "cuda", uuid=g.uuid) for i, g in enumerate(later.gpus)]
    assert "XID 79" in gpu_state(later, devices).node_health
    assert gpu_state(parse_reading(r), devices).node_health == ""  # without the past: it would be lost


class Replay:
    """NVML's readings as recorded, one per read (NVML itself runs only on a GPU node)."""

    def __init__(self, readings: list[dict[str, Any]], done: threading.Event) -> None:
        self._readings, self._done, self.closed = readings, done, False

    def read(self) -> dict[str, Any]:
        if len(self._readings) == 1:
            self._done.set()
        return self._readings.pop(0) if len(self._readings) > 1 else self._readings[0]

    def close(self) -> None:
        self.closed = True


def test_the_watch_keeps_an_xid_past_its_reading_and_skips_a_bad_one() -> None:
    faulty = raw("h100_sxm_8_xid79_ecc")
    broken = copy.deepcopy(faulty) | {"schema": 99}
    quiet = copy.deepcopy(faulty) | {"xid_events": []}
    devices = [
        DeviceReport(i, g["name"], 79.65, 900.0, "cuda", uuid=g["uuid"]) for i, g in enumerate(faulty["gpus"])
    ]
    done = threading.Event()
    session = Replay([faulty, broken, quiet], done)
    watch = GpuWatch(devices, interval_s=0.01, nvml=lambda: session).start()
    assert done.wait(30)
    watch.stop()
    state = watch.latest()
    assert state is not None and "XID 79" in state.node_health and session.closed
    assert [x.index for x in state.samples] == list(range(8)) and "ECC" in state.samples[2].health


def test_a_reading_recorded_on_a_real_h200_node() -> None:
    # `python -m agent.nvml` on a lent single-GPU H200 machine (driver 580.159.04), unedited.
    r = raw("h200_1_recorded")
    reading = parse_reading(r)
    units = visible_units(reading, None)
    assert [u.name for u in units] == ["NVIDIA H200"] and units[0].memory_gb == pytest.approx(140.4, abs=0.1)
    assert [u.uuid for u in visible_units(reading, r["gpus"][0]["uuid"])] == [units[0].uuid]
    assert nvlink_islands(reading, units) == [0] and units[0].gpu.nvlink_active_links == 0
    assert pcie_gbytes_s(units[0].gpu) == pytest.approx(63.0, abs=0.1)  # Gen5 x16
    devices = [DeviceReport(0, units[0].name, units[0].memory_gb, 989.0, "cuda", uuid=units[0].uuid)]
    state = gpu_state(reading, devices)
    assert [(x.utilization, x.power_w, x.temperature_c) for x in state.samples] == [(0.0, 82.544, 37.0)]
    assert state.node_health == "" and state.samples[0].health == ""
