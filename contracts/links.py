"""Inter-region links as a worker's sync config names them: ``{"a|b": {bandwidth_mbps, latency_ms}}``."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from contracts.errors import InvalidArgument


class LinkSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    bandwidth_mbps: float | None = Field(default=None, gt=0)  # None: unlimited
    latency_ms: float = Field(default=0.0, ge=0)

    @property
    def bytes_per_s(self) -> float | None:
        return None if self.bandwidth_mbps is None else self.bandwidth_mbps * 1e6 / 8


def link_key(a: str, b: str) -> str:
    return "|".join(sorted((a, b)))


def parse_links(links: dict[str, LinkSpec], regions: set[str] | None = None) -> dict[str, LinkSpec]:
    """Validate ``"a|b"`` keys (two distinct regions, known ones when ``regions`` is given) and
    normalise them to sorted order."""
    out: dict[str, LinkSpec] = {}
    for key, spec in links.items():
        parts = key.split("|")
        if len(parts) != 2 or not all(parts) or parts[0] == parts[1]:
            raise InvalidArgument(f"link key {key!r} must name two different regions as 'a|b'", field="links")
        if regions is not None and not set(parts) <= regions:
            raise InvalidArgument(f"link {key!r} names a region outside {sorted(regions)}", field="links")
        norm = link_key(*parts)
        if norm in out:
            raise InvalidArgument(f"link {norm!r} given twice", field="links")
        out[norm] = spec
    return out
