"""Model definitions: pure modules, no parallelism (that lives in training.parallel)."""

from training.models.gpt import GPT, GPTConfig

__all__ = ["GPT", "GPTConfig"]
