"""The ``slurm`` fixture: a real one-node Slurm per test module (``tests.slurm.cluster``),
skipped with the reason when Slurm or munge is not installed here."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.slurm.cluster import SlurmCluster, missing_reason, running_slurm


@pytest.fixture(scope="module")
def slurm() -> Iterator[SlurmCluster]:
    if (reason := missing_reason()) is not None:
        pytest.skip(reason)
    with running_slurm() as cluster:
        yield cluster
