"""Regions' jurisdictions as an admin sets them: the only ones data residency trusts.

Agents only claim a jurisdiction (``registry._upsert_region``); an admin approves the claim or
sets another, before or after the region's first agent. From then on an agent claiming anything
else is refused at registration.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.orm import Session

from contracts.errors import InvalidArgument
from contracts.registration import JURISDICTION_RE, NAME_RE
from orchestration.db.models import Region


@dataclass(frozen=True)
class JurisdictionChange:
    region: Region
    before: str  # the jurisdiction recorded before ("" if none)
    was_approved: bool
    created: bool  # the region had no agent yet: set ahead of its first registration


def set_jurisdiction(session: Session, name: str, jurisdiction: str) -> JurisdictionChange:
    """Set and approve ``name``'s jurisdiction, creating the region if no agent registered it yet
    (the caller audits and commits)."""
    if not NAME_RE.fullmatch(name):
        raise InvalidArgument(f"name: must match {NAME_RE.pattern}, got {name[:80]!r}", field="name")
    if not JURISDICTION_RE.fullmatch(jurisdiction):
        raise InvalidArgument(
            f"jurisdiction: must be 1-16 upper-case letters, digits or '-', got {jurisdiction[:80]!r}",
            field="jurisdiction",
        )
    region = session.get(Region, name, with_for_update=True)
    created = region is None
    if region is None:
        region = Region(name=name, jurisdiction="")
        session.add(region)
    before, was_approved = region.jurisdiction or "", bool(region.jurisdiction_approved)
    change = JurisdictionChange(region, before, was_approved, created)
    region.jurisdiction, region.jurisdiction_approved = jurisdiction, True
    session.flush()
    return change
