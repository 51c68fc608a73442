"""The double-entry ledger: accounts, balanced transactions, metering of running tasks, and the
monthly invoices and payout statements read from them.

``postings`` is the pure core (amounts, fee split, month periods, what one meter charges);
``accounts`` writes a charge as a transaction; ``metering`` meters tasks and closes a job's
meters at its end; ``reads`` and ``statements`` read the ledger back.
"""

from orchestration.ledger.metering import close_job, job_charges, meter_job, meter_tasks, wan_bytes_sent
from orchestration.ledger.reads import (
    account_balance,
    cost_summary,
    list_transactions,
    postings_total,
    tenant_spend,
    unbalanced_transactions,
    wan_bytes_by_region,
)

__all__ = [
    "account_balance",
    "close_job",
    "cost_summary",
    "job_charges",
    "list_transactions",
    "meter_job",
    "meter_tasks",
    "postings_total",
    "tenant_spend",
    "unbalanced_transactions",
    "wan_bytes_by_region",
    "wan_bytes_sent",
]
