"""Initial schema: resources, tenancy, quotes, jobs, tasks, allocations, metrics, events, ledger.

Revision ID: 0001
Revises: (none)
Create Date: 2025-01-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "enrollment_tokens",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("token_hash", sa.String(length=128), nullable=False),
        sa.Column("note", sa.String(length=255), nullable=False),
        sa.Column("max_uses", sa.Integer(), nullable=True),
        sa.Column("uses", sa.Integer(), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_enrollment_tokens")),
        sa.UniqueConstraint("token_hash", name=op.f("uq_enrollment_tokens_token_hash")),
    )
    op.create_table(
        "providers",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_providers")),
        sa.UniqueConstraint("name", name=op.f("uq_providers_name")),
    )
    op.create_table(
        "regions",
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("jurisdiction", sa.String(length=16), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_regions")),
    )
    op.create_table(
        "tenants",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("is_admin", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tenants")),
        sa.UniqueConstraint("name", name=op.f("uq_tenants_name")),
    )
    op.create_table(
        "api_keys",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("tenant_id", sa.String(length=32), nullable=False),
        sa.Column("prefix", sa.String(length=16), nullable=False),
        sa.Column("key_hash", sa.String(length=128), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], name=op.f("fk_api_keys_tenant_id_tenants")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_keys")),
        sa.UniqueConstraint("key_hash", name=op.f("uq_api_keys_key_hash")),
    )
    with op.batch_alter_table("api_keys", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_api_keys_prefix"), ["prefix"], unique=False)
        batch_op.create_index(batch_op.f("ix_api_keys_tenant_id"), ["tenant_id"], unique=False)

    op.create_table(
        "clusters",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("region", sa.String(length=64), nullable=False),
        sa.Column("provider_id", sa.String(length=32), nullable=False),
        sa.Column("intra_bandwidth_gbps", sa.Double(), nullable=False),
        sa.Column("intra_latency_ms", sa.Double(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["provider_id"], ["providers.id"], name=op.f("fk_clusters_provider_id_providers")
        ),
        sa.ForeignKeyConstraint(["region"], ["regions.name"], name=op.f("fk_clusters_region_regions")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_clusters")),
        sa.UniqueConstraint("region", "name", name=op.f("uq_clusters_region")),
    )
    with op.batch_alter_table("clusters", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_clusters_region"), ["region"], unique=False)

    op.create_table(
        "links",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("src", sa.String(length=64), nullable=False),
        sa.Column("dst", sa.String(length=64), nullable=False),
        sa.Column("bandwidth_gbps", sa.Double(), nullable=False),
        sa.Column("latency_ms", sa.Double(), nullable=False),
        sa.Column("egress_price_per_gb", sa.Double(), nullable=False),
        sa.Column("measured_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["dst"], ["regions.name"], name=op.f("fk_links_dst_regions")),
        sa.ForeignKeyConstraint(["src"], ["regions.name"], name=op.f("fk_links_src_regions")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_links")),
        sa.UniqueConstraint("src", "dst", name=op.f("uq_links_src")),
    )
    op.create_table(
        "quotes",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("tenant_id", sa.String(length=32), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("options", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], name=op.f("fk_quotes_tenant_id_tenants")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_quotes")),
    )
    with op.batch_alter_table("quotes", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_quotes_tenant_id"), ["tenant_id"], unique=False)

    op.create_table(
        "jobs",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("tenant_id", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("option", sa.JSON(), nullable=True),
        sa.Column("choice", sa.String(length=16), nullable=False),
        sa.Column("quote_id", sa.String(length=32), nullable=True),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("reason", sa.String(length=2000), nullable=False),
        sa.Column("estimated_duration_s", sa.Double(), nullable=True),
        sa.Column("estimated_cost", sa.Double(), nullable=True),
        sa.Column("actual_cost", sa.Double(), nullable=True),
        sa.Column("result", sa.JSON(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["quote_id"], ["quotes.id"], name=op.f("fk_jobs_quote_id_quotes")),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], name=op.f("fk_jobs_tenant_id_tenants")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_jobs")),
    )
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_jobs_status"), ["status"], unique=False)
        batch_op.create_index(batch_op.f("ix_jobs_tenant_id"), ["tenant_id"], unique=False)

    op.create_table(
        "nodes",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("cluster_id", sa.String(length=32), nullable=False),
        sa.Column("hostname", sa.String(length=255), nullable=False),
        sa.Column("token_hash", sa.String(length=128), nullable=False),
        sa.Column("advertise_host", sa.String(length=255), nullable=False),
        sa.Column("sync_port_min", sa.Integer(), nullable=False),
        sa.Column("sync_port_max", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("agent_version", sa.String(length=32), nullable=False),
        sa.Column("last_heartbeat_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("registered_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["cluster_id"], ["clusters.id"], name=op.f("fk_nodes_cluster_id_clusters")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_nodes")),
    )
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_nodes_cluster_id"), ["cluster_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_nodes_status"), ["status"], unique=False)

    op.create_table(
        "prices",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("cluster_id", sa.String(length=32), nullable=False),
        sa.Column("price_per_device_hour", sa.Double(), nullable=False),
        sa.Column("spot_price_per_device_hour", sa.Double(), nullable=True),
        sa.Column("effective_from", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["cluster_id"], ["clusters.id"], name=op.f("fk_prices_cluster_id_clusters")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_prices")),
    )
    with op.batch_alter_table("prices", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_prices_cluster_id"), ["cluster_id"], unique=False)

    op.create_table(
        "accelerators",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("node_id", sa.String(length=32), nullable=False),
        sa.Column("index", sa.Integer(), nullable=False),
        sa.Column("model", sa.String(length=128), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("memory_gb", sa.Double(), nullable=False),
        sa.Column("measured_tflops", sa.Double(), nullable=False),
        sa.ForeignKeyConstraint(["node_id"], ["nodes.id"], name=op.f("fk_accelerators_node_id_nodes")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_accelerators")),
        sa.UniqueConstraint("node_id", "index", name=op.f("uq_accelerators_node_id")),
    )
    with op.batch_alter_table("accelerators", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_accelerators_node_id"), ["node_id"], unique=False)

    op.create_table(
        "events",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(length=32), nullable=True),
        sa.Column("kind", sa.String(length=64), nullable=False),
        sa.Column("payload", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f("fk_events_job_id_jobs")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_events")),
    )
    with op.batch_alter_table("events", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_events_job_id"), ["job_id"], unique=False)

    op.create_table(
        "tasks",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("job_id", sa.String(length=32), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("cluster_id", sa.String(length=32), nullable=False),
        sa.Column("node_id", sa.String(length=32), nullable=False),
        sa.Column("region", sa.String(length=64), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("device_indices", sa.JSON(), nullable=False),
        sa.Column("placement", sa.JSON(), nullable=False),
        sa.Column("worker_config", sa.JSON(), nullable=False),
        sa.Column("sync_port", sa.Integer(), nullable=True),
        sa.Column("price_per_device_hour", sa.Double(), nullable=False),
        sa.Column("egress_price_per_gb", sa.Double(), nullable=False),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("message", sa.String(length=2000), nullable=False),
        sa.Column("last_metrics", sa.JSON(), nullable=True),
        sa.Column("result", sa.JSON(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["cluster_id"], ["clusters.id"], name=op.f("fk_tasks_cluster_id_clusters")),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f("fk_tasks_job_id_jobs")),
        sa.ForeignKeyConstraint(["node_id"], ["nodes.id"], name=op.f("fk_tasks_node_id_nodes")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tasks")),
    )
    with op.batch_alter_table("tasks", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_tasks_job_id"), ["job_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_tasks_node_id"), ["node_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_tasks_status"), ["status"], unique=False)

    op.create_table(
        "allocations",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("job_id", sa.String(length=32), nullable=False),
        sa.Column("task_id", sa.String(length=32), nullable=False),
        sa.Column("accelerator_id", sa.String(length=32), nullable=False),
        sa.Column("active", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("released_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["accelerator_id"], ["accelerators.id"], name=op.f("fk_allocations_accelerator_id_accelerators")
        ),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f("fk_allocations_job_id_jobs")),
        sa.ForeignKeyConstraint(["task_id"], ["tasks.id"], name=op.f("fk_allocations_task_id_tasks")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_allocations")),
    )
    with op.batch_alter_table("allocations", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_allocations_job_id"), ["job_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_allocations_task_id"), ["task_id"], unique=False)
        batch_op.create_index(
            "uq_allocations_active_accelerator",
            ["accelerator_id"],
            unique=True,
            sqlite_where=sa.text("active"),
            postgresql_where=sa.text("active"),
        )

    op.create_table(
        "ledger_entries",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(length=32), nullable=False),
        sa.Column("tenant_id", sa.String(length=32), nullable=False),
        sa.Column("task_id", sa.String(length=32), nullable=True),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("region", sa.String(length=64), nullable=False),
        sa.Column("cluster_id", sa.String(length=32), nullable=True),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("quantity", sa.Double(), nullable=False),
        sa.Column("unit_price", sa.Double(), nullable=False),
        sa.Column("amount", sa.Double(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["cluster_id"], ["clusters.id"], name=op.f("fk_ledger_entries_cluster_id_clusters")
        ),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f("fk_ledger_entries_job_id_jobs")),
        sa.ForeignKeyConstraint(["task_id"], ["tasks.id"], name=op.f("fk_ledger_entries_task_id_tasks")),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=op.f("fk_ledger_entries_tenant_id_tenants")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_ledger_entries")),
    )
    with op.batch_alter_table("ledger_entries", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_ledger_entries_job_id"), ["job_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_ledger_entries_tenant_id"), ["tenant_id"], unique=False)

    op.create_table(
        "task_metrics",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(length=32), nullable=False),
        sa.Column("task_id", sa.String(length=32), nullable=False),
        sa.Column("region", sa.String(length=64), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("loss", sa.Double(), nullable=True),
        sa.Column("tokens_per_s", sa.Double(), nullable=False),
        sa.Column("compute_utilization", sa.Double(), nullable=False),
        sa.Column("wan_bytes_sent", sa.BigInteger(), nullable=False),
        sa.Column("wan_bytes_recv", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f("fk_task_metrics_job_id_jobs")),
        sa.ForeignKeyConstraint(["task_id"], ["tasks.id"], name=op.f("fk_task_metrics_task_id_tasks")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_task_metrics")),
    )
    with op.batch_alter_table("task_metrics", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_task_metrics_job_id"), ["job_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("task_metrics", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_task_metrics_job_id"))

    op.drop_table("task_metrics")
    with op.batch_alter_table("ledger_entries", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_ledger_entries_tenant_id"))
        batch_op.drop_index(batch_op.f("ix_ledger_entries_job_id"))

    op.drop_table("ledger_entries")
    with op.batch_alter_table("allocations", schema=None) as batch_op:
        batch_op.drop_index(
            "uq_allocations_active_accelerator",
            sqlite_where=sa.text("active"),
            postgresql_where=sa.text("active"),
        )
        batch_op.drop_index(batch_op.f("ix_allocations_task_id"))
        batch_op.drop_index(batch_op.f("ix_allocations_job_id"))

    op.drop_table("allocations")
    with op.batch_alter_table("tasks", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_tasks_status"))
        batch_op.drop_index(batch_op.f("ix_tasks_node_id"))
        batch_op.drop_index(batch_op.f("ix_tasks_job_id"))

    op.drop_table("tasks")
    with op.batch_alter_table("events", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_events_job_id"))

    op.drop_table("events")
    with op.batch_alter_table("accelerators", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_accelerators_node_id"))

    op.drop_table("accelerators")
    with op.batch_alter_table("prices", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_prices_cluster_id"))

    op.drop_table("prices")
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_nodes_status"))
        batch_op.drop_index(batch_op.f("ix_nodes_cluster_id"))

    op.drop_table("nodes")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_jobs_tenant_id"))
        batch_op.drop_index(batch_op.f("ix_jobs_status"))

    op.drop_table("jobs")
    with op.batch_alter_table("quotes", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_quotes_tenant_id"))

    op.drop_table("quotes")
    op.drop_table("links")
    with op.batch_alter_table("clusters", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_clusters_region"))

    op.drop_table("clusters")
    with op.batch_alter_table("api_keys", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_api_keys_tenant_id"))
        batch_op.drop_index(batch_op.f("ix_api_keys_prefix"))

    op.drop_table("api_keys")
    op.drop_table("tenants")
    op.drop_table("regions")
    op.drop_table("providers")
    op.drop_table("enrollment_tokens")
