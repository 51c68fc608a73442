"""The loss floor of a job's synthetic data and the loss of a uniform guess.

The floor is the Markov source's exact entropy rate. Workers build that source, so they report it
(``entropy_floor`` in every step's metrics and in the result); the server only reads what was
reported and never computes it (that would bring torch onto the request path).
"""

from __future__ import annotations

import math
from typing import Any


def entropy_floor(*reports: dict[str, Any] | None) -> float | None:
    """The first ``entropy_floor`` among the given reports (results, last metrics), if any."""
    for report in reports:
        value = (report or {}).get("entropy_floor")
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            return float(value)
    return None


def uniform_loss(spec: dict[str, Any]) -> float | None:
    vocab = (spec.get("model") or {}).get("vocab")
    return math.log(vocab) if isinstance(vocab, int) and vocab > 1 else None
