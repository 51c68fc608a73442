"""WAN emulation: per-link bandwidth and latency, in the transport or in the kernel (netns + tbf)."""

from training.wan.shaper import LinkShaper, LinkSpec, link_key

__all__ = ["LinkShaper", "LinkSpec", "link_key"]
