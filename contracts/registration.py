"""What an agent declares when it registers, and the pure checks that declaration must pass.

Every problem is collected (not just the first), each naming its field, so an operator fixing a
node's flags sees everything wrong at once. Nothing here touches the database.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, fields

from contracts.errors import InvalidArgument

NAME_RE = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")
PROVIDER_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9 ._-]{0,127}")
JURISDICTION_RE = re.compile(r"[A-Z0-9][A-Z0-9-]{0,15}")
HOST_RE = re.compile(r"[A-Za-z0-9.:\[\]_-]{1,255}")
DEVICE_KINDS = ("cuda", "cpu")
DEVICE_UUID_RE = re.compile(
    r"(GPU|MIG)-[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
)
MAX_DEVICES_PER_NODE = 1024  # as --devices cpu:N allows


@dataclass(frozen=True)
class DeviceReport:
    """One accelerator (or declared CPU slot) as the node measured it."""

    index: int
    model: str
    memory_gb: float
    measured_tflops: float
    kind: str
    uuid: str = ""  # a CUDA device's GPU-/MIG- UUID, what its workers' CUDA_VISIBLE_DEVICES names
    # Its NVLink island on the node (agent.gpu_topology): devices of one island reach each other
    # over NVLink, and a tensor-parallel group is kept inside one. -1: not known (CPU slots, Slurm).
    link_group: int = -1
    # The node's own: its GPU's index in PCI bus order (NVML's), for the sandbox's /dev nodes.
    bus_index: int = -1


STEP_RATE_FIELDS = (
    "tflops",
    "micro_batch_s",
    "step_s",
    "optimizer_s_per_mparam",
    "data_s_per_mtoken",
    "checkpoint_s_per_mparam",
)
PRECISIONS = ("fp32", "bf16")
COLLECTIVE_FIELDS = ("collective_call_s", "collective_gbps", "collective_wait_s")
# No all-reduce between two ranks of one host takes this long per call or hop and is a
# measurement (the probe's calls time out at 20 s).
MAX_COLLECTIVE_S = 10.0
MAX_FABRIC_GBPS = 10_000.0  # a node's port figure above this is a typo, not a network
MAX_FABRIC_LATENCY_MS = 1_000.0
MAX_SECONDS = 86_400.0  # no measured fixed cost of a worker is anywhere near a day
MAX_CONTENTION = 1e4  # beyond this a contention figure is not a measurement
# Runnable threads per core, a new one included: below 1 where cores are left (1/cores on an
# idle host); under this no host of a plausible size reads.
MIN_CONTENTION = 1e-3
# A contention figure comes with the ages of the probes its interquartile mean kept, so the server
# can take out the CPU slots it knew busy on the host at those instants (agent/contention.py).
MAX_CONTENTION_PROBES = 64  # the agent sends an even subset beyond this
MAX_QUEUE_WAIT_S = 30 * 24 * 3600.0  # Capacity.queue_wait_s at most: the agent caps, the server refuses more
MAX_PROBE_AGE_S = 7 * 86_400.0  # a figure kept through a week-long job of the node's own


@dataclass(frozen=True)
class StepRate:
    """One precision's reference training step on one device, split as the planner prices it."""

    precision: str
    tflops: float  # achieved model FLOP/s of forward+backward
    micro_batch_s: float = 0.0  # fixed seconds per micro-batch beyond its FLOPs
    step_s: float = 0.0  # fixed seconds per step
    optimizer_s_per_mparam: float = 0.0
    data_s_per_mtoken: float = 0.0
    checkpoint_s_per_mparam: float = 0.0


@dataclass(frozen=True)
class NodeProfile:
    """What a node measured by running the real worker: its fixed costs and reference step."""

    startup_s: float
    teardown_s: float
    physical_cores: int
    rates: tuple[StepRate, ...] = ()
    host_load_factor: float = 0.0  # wall / CPU time of the reference on a CPU slot; 0: not measured
    # The launcher's part of startup_s (one process per node, before the workers); 0: not measured.
    launcher_s: float = 0.0
    # A gloo all-reduce between two CPU ranks of the host (training/collective_probe.py), 0: not
    # measured: a small call's seconds, a large one's payload rate beyond it, and per hop of the
    # ring the wait for a peer's turn where ranks outnumber cores.
    collective_call_s: float = 0.0
    collective_gbps: float = 0.0
    collective_wait_s: float = 0.0

    def as_dict(self) -> dict[str, object]:
        return {
            **{k: getattr(self, k) for k in PROFILE_FIELDS},
            "rates": {r.precision: {k: getattr(r, k) for k in STEP_RATE_FIELDS} for r in self.rates},
        }


# A profile's figures by name, beside its rates: the wire's MeasuredProfile carries these fields
# under the same names (``proto.cpn.agent.v1.profile`` converts both ways from this list).
PROFILE_FIELDS = tuple(f.name for f in fields(NodeProfile) if f.name != "rates")
# A step rate's fields by name, as the wire's MeasuredStepRate carries them.
STEP_RATE_WIRE_FIELDS = ("precision", *STEP_RATE_FIELDS)


# Whether and how a node runs users' code (an entrypoint): confined by bubblewrap, unconfined
# because its provider allowed it, or not at all. The planner places users' code only on the first
# two (``runs_user_code``).
SANDBOX_BUBBLEWRAP, SANDBOX_UNSANDBOXED_ALLOWED, SANDBOX_NONE = "bubblewrap", "unsandboxed-allowed", "none"
SANDBOX_KINDS = (SANDBOX_BUBBLEWRAP, SANDBOX_UNSANDBOXED_ALLOWED, SANDBOX_NONE)


def runs_user_code(sandbox: str | None) -> bool:
    return sandbox in (SANDBOX_BUBBLEWRAP, SANDBOX_UNSANDBOXED_ALLOWED)


@dataclass(frozen=True)
class NodeRegistration:
    region: str
    cluster: str
    devices: tuple[DeviceReport, ...]
    price_per_device_hour: float
    advertise_host: str
    sync_port_min: int
    sync_port_max: int
    enrollment_token: str = ""
    provider: str = ""
    hostname: str = ""
    spot_price_per_device_hour: float = 0.0  # 0 = no spot offer
    agent_version: str = ""
    intra_bandwidth_gbps: float = 0.0  # 0 = not measured; the cluster keeps its value
    jurisdiction: str = ""
    # Set together when a node that already holds credentials re-registers.
    node_id: str = ""
    node_token: str = ""
    probe_port: int = 0  # its LinkProbeService on advertise_host; 0: none
    checkpoint_port: int = 0  # its CheckpointService (mutual TLS) on advertise_host; 0: none
    profile: NodeProfile | None = None  # None: not measured; the planner uses its defaults
    # The node's own port into the cluster fabric (Gb/s per device, one-way ms); 0: not declared.
    node_fabric_gbps: float = 0.0
    node_fabric_latency_ms: float = 0.0
    cross_cluster_host: str = ""  # where other clusters (any region) reach its torchrun endpoint; "": none
    # The host's CPU contention after the node's own reference step (agent/contention.py); 0: not measured.
    cpu_contention: float = 0.0
    # Seconds before the request each probe the figure kept was taken (see MAX_CONTENTION_PROBES).
    cpu_contention_probe_ages_s: tuple[float, ...] = ()
    sandbox: str = SANDBOX_NONE  # whether and how it runs users' code (SANDBOX_KINDS)
    # Its profile is being measured and follows on the stream: until then it is not placed.
    profile_follows: bool = False


@dataclass(frozen=True)
class ProfileReport:
    """The profile a node registered without (``NodeRegistration.profile_follows``), as its agent
    sends it once measured, with the host's contention settled after it."""

    profile: NodeProfile | None  # None: the measurement failed (``error``); declared figures stand
    error: str = ""
    cpu_contention: float = 0.0  # 0: not measured
    cpu_contention_probe_ages_s: tuple[float, ...] = ()

    def problems(self) -> list[str]:
        p = contention_problems(self.cpu_contention, self.cpu_contention_probe_ages_s, "profile.")
        if self.profile is not None:
            p.extend(profile_problems(self.profile, where="profile.measured_profile"))
        return p


def probe_ages_problem(ages: Sequence[float]) -> str | None:
    """Why these probe ages are not a contention figure's window; None when they are."""
    if len(ages) > MAX_CONTENTION_PROBES:
        return f"at most {MAX_CONTENTION_PROBES} probe ages, got {len(ages)}"
    bad = [a for a in ages if not (_finite(a) and 0.0 <= a <= MAX_PROBE_AGE_S)]
    if bad:
        return f"probe ages must be finite seconds in [0, {MAX_PROBE_AGE_S:g}], got {bad[0]}"
    return None


def contention_problems(c: float, ages: Sequence[float], where: str = "") -> list[str]:
    """What is wrong with a settled contention figure and its probes' ages (``where``: the
    fields' prefix), as a registration or a profile report sends them."""
    p: list[str] = []
    if not (_finite(c) and (c == 0 or MIN_CONTENTION <= c <= MAX_CONTENTION)):
        p.append(
            f"{where}cpu_contention: must be 0 (not measured) or a finite number in"
            f" [{MIN_CONTENTION:g}, {MAX_CONTENTION:g}], got {c}"
        )
    if (why := probe_ages_problem(ages)) is not None:
        p.append(f"{where}cpu_contention_probe_ages_s: {why}")
    return p


def _finite(x: float) -> bool:
    return isinstance(x, int | float) and math.isfinite(x)


def device_problems(
    devices: tuple[DeviceReport, ...] | list[DeviceReport], where: str = "devices"
) -> list[str]:
    problems: list[str] = []
    if not devices:
        problems.append(f"{where}: at least one device is required")
    seen: set[int] = set()
    for i, d in enumerate(devices):
        at = f"{where}[{i}]"
        if d.index < 0:
            problems.append(f"{at}.index: must be >= 0, got {d.index}")
        elif d.index in seen:
            problems.append(f"{at}.index: duplicate device index {d.index}")
        seen.add(d.index)
        if not d.model.strip() or len(d.model) > 128:
            problems.append(f"{at}.model: must be 1-128 characters, got {d.model!r}")
        if not (_finite(d.memory_gb) and d.memory_gb > 0):
            problems.append(f"{at}.memory_gb: must be a finite number > 0, got {d.memory_gb}")
        if not (_finite(d.measured_tflops) and d.measured_tflops > 0):
            problems.append(f"{at}.measured_tflops: must be a finite number > 0, got {d.measured_tflops}")
        if d.kind not in DEVICE_KINDS:
            problems.append(f"{at}.kind: must be one of {', '.join(DEVICE_KINDS)}, got {d.kind!r}")
        if d.uuid and not DEVICE_UUID_RE.fullmatch(d.uuid):
            problems.append(f"{at}.uuid: expected a GPU-/MIG- UUID or empty, got {d.uuid[:80]!r}")
        if not -1 <= d.link_group < MAX_DEVICES_PER_NODE:
            problems.append(f"{at}.link_group: must be -1..{MAX_DEVICES_PER_NODE - 1}, got {d.link_group}")
    return problems


def profile_problems(profile: NodeProfile, where: str = "measured_profile") -> list[str]:
    p: list[str] = []
    for name in ("startup_s", "teardown_s"):
        value = getattr(profile, name)
        if not (_finite(value) and 0 <= value <= MAX_SECONDS):
            p.append(f"{where}.{name}: must be a number of seconds in [0, {MAX_SECONDS:g}], got {value}")
    if _finite(profile.startup_s) and not (
        _finite(profile.launcher_s) and 0 <= profile.launcher_s <= profile.startup_s
    ):
        got = profile.launcher_s
        p.append(f"{where}.launcher_s: must be a number of seconds in [0, startup_s], got {got}")
    if not (_finite(profile.host_load_factor) and 0 <= profile.host_load_factor <= 1000):
        got = profile.host_load_factor
        p.append(f"{where}.host_load_factor: must be a finite number in [0, 1000], got {got}")
    for name in ("collective_call_s", "collective_wait_s"):
        value = getattr(profile, name)
        if not (_finite(value) and 0 <= value <= MAX_COLLECTIVE_S):
            p.append(f"{where}.{name}: must be a number of seconds in [0, {MAX_COLLECTIVE_S:g}], got {value}")
    gbps = profile.collective_gbps
    if not (_finite(gbps) and 0 <= gbps <= MAX_FABRIC_GBPS):
        p.append(f"{where}.collective_gbps: must be a finite number in [0, {MAX_FABRIC_GBPS:g}], got {gbps}")
    elif (gbps > 0) != (profile.collective_call_s > 0):
        p.append(
            f"{where}.collective_gbps: measured together with collective_call_s (both > 0 or both 0),"
            f" got {gbps} and {profile.collective_call_s}"
        )
    if not 0 <= profile.physical_cores <= 1_000_000:
        p.append(f"{where}.physical_cores: must be in [0, 1000000], got {profile.physical_cores}")
    seen: set[str] = set()
    for i, r in enumerate(profile.rates):
        at = f"{where}.rates[{i}]"
        if r.precision not in PRECISIONS or r.precision in seen:
            p.append(
                f"{at}.precision: must be one of {', '.join(PRECISIONS)}, once each, got {r.precision!r}"
            )
        seen.add(r.precision)
        if not (_finite(r.tflops) and 0 < r.tflops <= 1e6):
            p.append(f"{at}.tflops: must be a finite number in (0, 1e6], got {r.tflops}")
        for name in STEP_RATE_FIELDS[1:]:
            value = getattr(r, name)
            if not (_finite(value) and 0 <= value <= MAX_SECONDS):
                p.append(f"{at}.{name}: must be a finite number in [0, {MAX_SECONDS:g}], got {value}")
    return p


def registration_problems(reg: NodeRegistration) -> list[str]:
    """Every way ``reg`` is malformed, as ``field: reason`` strings (empty when it is fine)."""
    p: list[str] = []
    for name in ("region", "cluster"):
        value = getattr(reg, name)
        if not NAME_RE.fullmatch(value):
            p.append(f"{name}: must match [a-z0-9][a-z0-9-]{{0,62}}, got {value!r}")
    if reg.provider and not PROVIDER_RE.fullmatch(reg.provider):
        p.append(f"provider: must be 1-128 letters, digits, spaces or ._- , got {reg.provider!r}")
    if reg.jurisdiction and not JURISDICTION_RE.fullmatch(reg.jurisdiction):
        p.append(f"jurisdiction: must be 1-16 upper-case letters, digits or '-', got {reg.jurisdiction!r}")
    if len(reg.hostname) > 255:
        p.append("hostname: must be at most 255 characters")
    if len(reg.agent_version) > 32:
        p.append("agent_version: must be at most 32 characters")
    if not HOST_RE.fullmatch(reg.advertise_host):
        p.append(f"advertise_host: must be a host name or IP address, got {reg.advertise_host!r}")
    p.extend(device_problems(reg.devices))
    if not (_finite(reg.price_per_device_hour) and reg.price_per_device_hour >= 0):
        p.append(f"price_per_device_hour: must be a finite number >= 0, got {reg.price_per_device_hour}")
    if not (_finite(reg.spot_price_per_device_hour) and reg.spot_price_per_device_hour >= 0):
        p.append(
            f"spot_price_per_device_hour: must be a finite number >= 0, got {reg.spot_price_per_device_hour}"
        )
    if not (_finite(reg.intra_bandwidth_gbps) and reg.intra_bandwidth_gbps >= 0):
        p.append(f"intra_bandwidth_gbps: must be a finite number >= 0, got {reg.intra_bandwidth_gbps}")
    if not (_finite(reg.node_fabric_gbps) and 0 <= reg.node_fabric_gbps <= MAX_FABRIC_GBPS):
        p.append(
            f"node_fabric_gbps: must be a finite number in 0..{MAX_FABRIC_GBPS:g}, got {reg.node_fabric_gbps}"
        )
    if not (_finite(reg.node_fabric_latency_ms) and 0 <= reg.node_fabric_latency_ms <= MAX_FABRIC_LATENCY_MS):
        p.append(
            f"node_fabric_latency_ms: must be a finite number in 0..{MAX_FABRIC_LATENCY_MS:g},"
            f" got {reg.node_fabric_latency_ms}"
        )
    if reg.cross_cluster_host and not HOST_RE.fullmatch(reg.cross_cluster_host):
        p.append(f"cross_cluster_host: must be a host name or IP address, got {reg.cross_cluster_host!r}")
    lo, hi = reg.sync_port_min, reg.sync_port_max
    if not (1024 <= lo <= hi <= 65535):
        p.append(f"sync_port_min/sync_port_max: need 1024 <= min <= max <= 65535, got {lo}-{hi}")
    if reg.probe_port != 0 and not 1024 <= reg.probe_port <= 65535:
        p.append(f"probe_port: need 0 (none) or 1024..65535, got {reg.probe_port}")
    if reg.checkpoint_port != 0 and not 1024 <= reg.checkpoint_port <= 65535:
        p.append(f"checkpoint_port: need 0 (none) or 1024..65535, got {reg.checkpoint_port}")
    p.extend(contention_problems(reg.cpu_contention, reg.cpu_contention_probe_ages_s))
    if reg.sandbox not in SANDBOX_KINDS:
        p.append(f"sandbox: must be one of {', '.join(SANDBOX_KINDS)}, got {reg.sandbox[:64]!r}")
    if reg.profile is not None:
        p.extend(profile_problems(reg.profile))
    if bool(reg.node_id) != bool(reg.node_token):
        p.append("node_id/node_token: re-registration needs both or neither")
    return p


def validate_registration(reg: NodeRegistration) -> None:
    """Raise ``InvalidArgument`` listing every malformed field of ``reg``."""
    problems = registration_problems(reg)
    if problems:
        raise InvalidArgument("invalid registration: " + "; ".join(problems), problems=problems)
