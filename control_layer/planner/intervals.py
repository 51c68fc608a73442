"""What each option's estimate rests on, and the interval the actual is expected to land in. Pure.

The interval is the estimate scaled by the p10/p90 of recent quotes' relative errors; with fewer
than MIN_RESIDUALS finished jobs to go on, it is the wide DEFAULT_BAND: an honest "we do not know yet".
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from control_layer.planner import cost_model as cm
from control_layer.planner.plan_types import (
    Calibration,
    CalibrationBasis,
    ErrorBand,
    EstimateInterval,
    PlannedTask,
)
from control_layer.planner.snapshot import ResourceSnapshot

MIN_RESIDUALS = 3
# Relative error bounds with no history: the actual between half and twice the estimate.
DEFAULT_BAND = (-0.5, 1.0)


def band(error: ErrorBand | None) -> tuple[float, float, int]:
    """(low, high, n) relative bounds; the default band when there is too little history."""
    if error is None or error.n < MIN_RESIDUALS:
        return DEFAULT_BAND[0], DEFAULT_BAND[1], 0 if error is None else error.n
    return min(error.p10, 0.0), max(error.p90, 0.0), error.n


def interval(duration_s: float, cost: float, calibration: Calibration | None) -> EstimateInterval:
    t_lo, t_hi, n = band(calibration.time_error if calibration else None)
    c_lo, c_hi, _ = band(calibration.cost_error if calibration else None)
    return EstimateInterval(
        duration_s_low=max(0.0, duration_s * (1.0 + t_lo)),
        duration_s_high=duration_s * (1.0 + t_hi),
        cost_low=max(0.0, cost * (1.0 + c_lo)),
        cost_high=cost * (1.0 + c_hi),
        residuals=n,
    )


def basis(
    tasks: Sequence[PlannedTask],
    snapshot: ResourceSnapshot,
    precision: str,
    calibration: Calibration | None,
    host_share: dict[str, float] | None = None,
    launch_share: dict[str, float] | None = None,
) -> CalibrationBasis:
    """The calibrated factors in force for these tasks' devices, nodes and region pairs, and the
    share of its host's cores each node was priced at (its workers, and its launcher)."""
    clusters = snapshot.clusters_by_id()
    regions = sorted({clusters[t.cluster].region for t in tasks if t.cluster in clusters})
    return CalibrationBasis(
        **_node_factors(tasks, snapshot, precision, calibration),
        **_pair_factors(regions, snapshot, calibration),
        host_share=dict(host_share or {}),
        launch_share=dict(launch_share or {}),
    )


def _node_factors(
    tasks: Sequence[PlannedTask], snapshot: ResourceSnapshot, precision: str, calibration: Calibration | None
) -> dict[str, dict[str, float]]:
    """Per device model the efficiency, per node the start-up (calibrated only), teardown
    (likewise), the launcher's part and a checkpoint write's fixed seconds."""
    nodes = snapshot.nodes_by_id()
    used: dict[str, set[int]] = defaultdict(set)
    for t in tasks:
        used[t.node].add(t.device)
    out: dict[str, dict[str, float]] = {
        k: {} for k in ("efficiency", "startup_s", "teardown_s", "launcher_s", "checkpoint_fixed_s")
    }
    for node_id, indices in used.items():
        node = nodes.get(node_id)
        if node is None:
            continue
        # Relative to the node's reference step where it measured one, else to its matmul rate.
        profiled = node.profile is not None and precision in node.profile.rates
        default = 1.0 if profiled else cm.DEFAULT_DEVICE_EFFICIENCY
        for model in {d.model for d in node.devices if d.index in indices}:
            out["efficiency"][f"{model}|{precision}"] = cm.device_efficiency(
                model, calibration, precision, default
            )
        if calibration and node_id in calibration.startup_s:
            out["startup_s"][node_id] = calibration.startup_s[node_id]
        if calibration and node_id in calibration.teardown_s:
            out["teardown_s"][node_id] = calibration.teardown_s[node_id]
        out["checkpoint_fixed_s"][node_id] = cm.checkpoint_fixed_seconds(node_id, calibration)
        prof = node.profile
        measured = prof.startup_s if prof else None
        out["launcher_s"][node_id] = cm.startup_parts(
            node_id, measured, prof.launcher_s if prof else 0.0, calibration
        )[0]
    return out


def _pair_factors(
    regions: list[str], snapshot: ResourceSnapshot, calibration: Calibration | None
) -> dict[str, dict[str, float]]:
    """Per pair of the regions: the link's goodput (keyed as the calibration keeps it: a measured
    link's factor apart from a declared one's), an exchange call's seconds, its per-parameter and
    fixed seconds, and the drift, with overlapped rounds' drift apart where runs have shown it."""
    pairs = [(a, b) for i, a in enumerate(regions) for b in regions[i + 1 :]]
    goodput = {
        cm.goodput_key(a, b, _measured(snapshot, a, b)): cm.link_goodput(
            a, b, calibration, measured=_measured(snapshot, a, b)
        )
        for a, b in pairs
    }
    calls = calibration.exchange_s if calibration else {}
    exchange_s = {
        cm.pair_key(a, b): calls.get(cm.pair_key(a, b), cm.DEFAULT_EXCHANGE_CALL_S) for a, b in pairs
    }
    per_param = calibration.exchange_param_s if calibration else {}
    fixed = calibration.exchange_fixed_s if calibration else {}
    drifts = calibration.exchange_drift if calibration else {}
    lags = calibration.exchange_drift_fixed_s if calibration else {}
    exchange_drift = {key: drifts.get(key, 0.0) for key in exchange_s}
    exchange_drift_fixed_s = {key: lags.get(key, 0.0) for key in exchange_s}
    for key in exchange_s:
        if (apart := key + cm.OVERLAPPED_SUFFIX) in drifts or apart in lags:
            exchange_drift[apart] = drifts.get(apart, 0.0)
            exchange_drift_fixed_s[apart] = lags.get(apart, 0.0)
    return {
        "goodput": goodput,
        "exchange_s": exchange_s,
        "exchange_param_s": {key: per_param.get(key, cm.DEFAULT_EXCHANGE_PARAM_S) for key in exchange_s},
        "exchange_fixed_s": {key: fixed.get(key, cm.DEFAULT_EXCHANGE_FIXED_S) for key in exchange_s},
        "exchange_drift": exchange_drift,
        "exchange_drift_fixed_s": exchange_drift_fixed_s,
    }


def _measured(snapshot: ResourceSnapshot, a: str, b: str) -> bool:
    ln = snapshot.link(a, b)
    return ln is not None and ln.source == "measured"
