"""ORM models, one module per domain; importing this package registers every table on Base.metadata."""

from orchestration.db.models.artifacts import Artifact
from orchestration.db.models.audit import AuditEvent
from orchestration.db.models.calibration import CalibrationChange, CalibrationFactor
from orchestration.db.models.events import Event
from orchestration.db.models.jobs import Allocation, CheckpointCopy, Job, Quote, Task, TaskMetric
from orchestration.db.models.leadership import LeaderLease
from orchestration.db.models.ledger import LedgerAccount, LedgerPosting, LedgerTransaction
from orchestration.db.models.logs import TaskLogLine
from orchestration.db.models.resources import (
    Accelerator,
    Cluster,
    EnrollmentToken,
    Link,
    LinkProbe,
    Node,
    NodeCacheEntry,
    Price,
    Provider,
    Region,
)
from orchestration.db.models.tenancy import ApiKey, Tenant

__all__ = [
    "Accelerator",
    "Allocation",
    "ApiKey",
    "Artifact",
    "AuditEvent",
    "CalibrationChange",
    "CheckpointCopy",
    "CalibrationFactor",
    "Cluster",
    "EnrollmentToken",
    "Event",
    "Job",
    "LeaderLease",
    "LedgerAccount",
    "LedgerPosting",
    "LedgerTransaction",
    "Link",
    "LinkProbe",
    "Node",
    "NodeCacheEntry",
    "Price",
    "Provider",
    "Quote",
    "Region",
    "Task",
    "TaskLogLine",
    "TaskMetric",
    "Tenant",
]
