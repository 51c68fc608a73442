"""WAN emulation: per-link bandwidth and latency, in the transport or in the kernel (netns + tbf)."""

from contracts.links import LinkSpec, link_key
from training.wan.shaper import LinkShaper

__all__ = ["LinkShaper", "LinkSpec", "link_key"]
