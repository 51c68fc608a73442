"""Model definitions: pure modules, no parallelism (that lives in training.parallel)."""

from contracts.model import GPTConfig
from training.models.gpt import GPT

__all__ = ["GPT", "GPTConfig"]
