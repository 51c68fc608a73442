"""The loss floor of a job's synthetic data, read from its result or computed from the data spec."""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any

# Computing the floor solves a vocab x vocab linear system (about 2 s at 512 on a busy CPU, and
# cubic beyond); for larger vocabularies the floor comes with the worker's result.
MAX_COMPUTED_VOCAB = 512


def entropy_floor(
    spec: dict[str, Any], *results: dict[str, Any] | None, worker_config: dict[str, Any] | None = None
) -> float | None:
    """The floor reported by the job (or a task), else computed for a synthetic-markov spec."""
    for result in results:
        if result and isinstance(result.get("entropy_floor"), int | float):
            return float(result["entropy_floor"])
    data = spec.get("data") or {}
    vocab = (spec.get("model") or {}).get("vocab")
    if data.get("kind", "synthetic-markov") != "synthetic-markov" or not isinstance(vocab, int):
        return None
    if not 2 <= vocab <= MAX_COMPUTED_VOCAB:
        return None
    wc_data = (worker_config or {}).get("data") or {}
    branching = min(int(wc_data.get("branching", 4)), vocab)
    concentration = float(wc_data.get("concentration", 0.5))
    return _markov_floor(vocab, int(data.get("seed", 0)), branching, concentration)


def uniform_loss(spec: dict[str, Any]) -> float | None:
    vocab = (spec.get("model") or {}).get("vocab")
    return math.log(vocab) if isinstance(vocab, int) and vocab > 1 else None


@lru_cache(maxsize=64)
def _markov_floor(vocab: int, seed: int, branching: int, concentration: float) -> float | None:
    try:
        # Imports torch: the first floor a process computes takes a few seconds, later ones are cached.
        from training.data.markov import MarkovSource
    except ImportError:
        return None
    return MarkovSource(vocab, seed, branching, concentration).entropy_rate_nats
