"""Every option plan() returns is executable: its worker configs pass the executor, the worker's
config validation and the runtime's startup checks, on random fleets and jobs."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contracts.errors import NoFeasiblePlan
from contracts.job_spec import JobSpec
from contracts.worker_config import WorkerConfig
from control_layer.planner import plan
from control_layer.planner.plan_types import PlanOption
from control_layer.planner.snapshot import ResourceSnapshot
from control_layer.worker_config import (
    TaskSlot,
    build_worker_configs,
    group_by_node,
    stage_port_counts,
    validate_worker_config,
)
from training.parallel.dims import ParallelDims

from .fleetgen import jobs, snapshots


@st.composite
def specs(draw: st.DrawFn) -> JobSpec:
    """fleetgen's jobs with recomputation, micro-batches and pinned data drawn too; some of them
    bring-your-own with what their entrypoint supports."""
    raw = draw(jobs()).model_dump(mode="json", exclude_none=True)
    training = raw["training"]
    training["activation_checkpointing"] = draw(st.booleans())
    sequences = training["global_batch_tokens"] // raw["model"]["seq_len"]
    training["micro_batch_size"] = draw(st.sampled_from([m for m in (1, 2, 4) if sequences % m == 0]))
    if draw(st.integers(0, 4)) == 0:
        raw["data"] = {"kind": "synthetic-markov", "region": draw(st.sampled_from(["r0", "r1"]))}
    if draw(st.booleans()):
        raw["entrypoint"] = "mypkg.train:build"
        raw["entrypoint_parallelism"] = draw(st.sampled_from([["dp"], ["dp", "zero"]]))
        training["activation_checkpointing"] = False  # the runtime recomputes the built-in GPT only
        raw["parallelism"] = "auto"
    return JobSpec.model_validate(raw)


def _slots(option: PlanOption, snap: ResourceSnapshot) -> list[TaskSlot]:
    """As allocation makes them: one per node, a sync port each when the job has several nodes."""
    groups = group_by_node(option)
    clusters = {c.id: c for c in snap.clusters}
    staged = stage_port_counts(option, option.sync.mode)  # per-stage rings: a port per stage led
    return [
        TaskSlot(
            node_id=node,
            cluster_id=entries[0].cluster,
            cluster_name=clusters[entries[0].cluster].name or entries[0].cluster,
            region=clusters[entries[0].cluster].region,
            host="10.0.0.1",
            sync_port=9000 + i if len(groups) > 1 else None,
            entries=tuple(entries),
            stage_ports=tuple(9000 + i + 1000 * j for j in range(staged.get(node, 0))),
        )
        for i, (node, entries) in enumerate(sorted(groups.items()))
    ]


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(snap=snapshots(), spec=specs())
def test_every_option_is_executable(snap: ResourceSnapshot, spec: JobSpec) -> None:
    try:
        options = plan(spec, snap)
    except NoFeasiblePlan:
        return
    for o in options:
        slots = _slots(o, snap)
        configs = build_worker_configs("job", spec, o, slots)
        replicas = 0
        for slot in slots:
            cfg = WorkerConfig.model_validate(validate_worker_config(configs[slot.node_id]))
            p = cfg.parallel
            dims = ParallelDims(
                dp=p.dp_local,
                tp=p.tp,
                pp=p.pp,
                world_size=len(slot.device_indices),
                zero=p.zero,
                pp_schedule=p.pp_schedule,
                microbatches=cfg.microbatches,
            )
            if cfg.entrypoint is None:
                assert cfg.model is not None
                dims.check_model(cfg.model)
            else:
                assert p.tp == p.pp == 1  # what training.runtime gives a bring-your-own model
                assert p.zero == 0 or "zero" in spec.byo_parallelism
            assert cfg.training.precision == o.precision
            assert cfg.training.activation_checkpointing == spec.training.activation_checkpointing
            assert cfg.global_replicas == o.dp
            replicas += p.dp_local
        assert replicas == o.dp
