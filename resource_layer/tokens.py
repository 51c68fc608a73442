"""Enrollment tokens (admin-issued, exchanged by an agent for node credentials) and node tokens.

Only SHA-256 digests are stored. The plaintexts are 256-bit random strings, so a fast digest is
enough: there is nothing to brute-force that a slow password hash would protect.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from datetime import UTC, datetime, timedelta

from sqlalchemy import or_, select, update
from sqlalchemy.orm import Session

from contracts.errors import InvalidArgument, NotFound, Unauthenticated
from contracts.registration import PROVIDER_RE
from orchestration.db.base import utcnow
from orchestration.db.models import EnrollmentToken

ENROLLMENT_PREFIX = "cpn_enroll_"
NODE_PREFIX = "cpn_node_"


def hash_token(plaintext: str) -> str:
    return hashlib.sha256(plaintext.encode()).hexdigest()


def token_matches(plaintext: str, digest: str) -> bool:
    return hmac.compare_digest(hash_token(plaintext), digest)


def new_node_token() -> tuple[str, str]:
    """A fresh node credential: (plaintext for the agent, digest for the database)."""
    plaintext = NODE_PREFIX + secrets.token_urlsafe(32)
    return plaintext, hash_token(plaintext)


def as_utc(dt: datetime) -> datetime:
    """SQLite hands timestamps back naive; every timestamp this project writes is UTC."""
    return dt if dt.tzinfo is not None else dt.replace(tzinfo=UTC)


# Ten years and a million registrations: beyond either, "never" and "unlimited" say it better.
MAX_TOKEN_TTL_S = 10 * 365 * 86_400.0
MAX_TOKEN_USES = 1_000_000


def create_enrollment_token(
    session: Session,
    provider: str,
    note: str = "",
    ttl_s: float | None = 86_400.0,
    max_uses: int | None = 1,
) -> tuple[EnrollmentToken, str]:
    """Add a token row (the caller commits) and return it with the plaintext, shown only once.

    The token enrolls nodes of ``provider`` only, into that provider's clusters. ``ttl_s=None``
    never expires; ``max_uses=None`` is unlimited.
    """
    if not PROVIDER_RE.fullmatch(provider or ""):
        raise InvalidArgument(
            f"provider: must be 1-128 letters, digits, spaces or ._- , got {provider!r}", field="provider"
        )
    if ttl_s is not None and not 0 < ttl_s <= MAX_TOKEN_TTL_S:
        raise InvalidArgument(
            f"ttl_s: must be > 0 and <= {MAX_TOKEN_TTL_S:g} seconds (or null for no expiry), got {ttl_s}",
            field="ttl_s",
        )
    if max_uses is not None and not 1 <= max_uses <= MAX_TOKEN_USES:
        raise InvalidArgument(
            f"max_uses: must be 1 to {MAX_TOKEN_USES} (or null for unlimited), got {max_uses}",
            field="max_uses",
        )
    if len(note) > 255:
        raise InvalidArgument("note: must be at most 255 characters", field="note")
    plaintext = ENROLLMENT_PREFIX + secrets.token_urlsafe(32)
    row = EnrollmentToken(
        token_hash=hash_token(plaintext),
        provider=provider,
        note=note,
        max_uses=max_uses,
        uses=0,
        expires_at=None if ttl_s is None else utcnow() + timedelta(seconds=ttl_s),
    )
    session.add(row)
    session.flush()
    return row, plaintext


def consume_enrollment_token(
    session: Session, plaintext: str, now: datetime | None = None
) -> EnrollmentToken:
    """Count one use of a valid token, atomically, in the caller's transaction.

    Unknown, revoked, expired and used-up tokens all raise ``Unauthenticated`` with the same message, so a
    caller learns nothing about which tokens exist.
    """
    refused = Unauthenticated("enrollment token is invalid, revoked, expired or used up")
    if not plaintext:
        raise Unauthenticated("enrollment token is required")
    now = now or utcnow()
    row = session.scalar(select(EnrollmentToken).where(EnrollmentToken.token_hash == hash_token(plaintext)))
    if (
        row is None
        or row.revoked_at is not None
        or (row.expires_at is not None and as_utc(row.expires_at) <= now)
    ):
        raise refused
    # The guards in WHERE make concurrent registrations unable to overshoot max_uses, or to
    # enroll with a token revoked since it was read.
    counted = session.execute(
        update(EnrollmentToken)
        .where(EnrollmentToken.id == row.id, EnrollmentToken.revoked_at.is_(None))
        .where(or_(EnrollmentToken.max_uses.is_(None), EnrollmentToken.uses < EnrollmentToken.max_uses))
        .values(uses=EnrollmentToken.uses + 1)
        .execution_options(synchronize_session=False)
    )
    if counted.rowcount != 1:
        raise refused
    session.refresh(row)
    return row


def still_enrolls(row: EnrollmentToken, now: datetime | None = None) -> bool:
    """Whether the token would enroll another node now."""
    now = now or utcnow()
    return (
        row.revoked_at is None
        and (row.expires_at is None or as_utc(row.expires_at) > now)
        and (row.max_uses is None or row.uses < row.max_uses)
    )


def list_enrollment_tokens(session: Session, *, limit: int = 1000) -> list[EnrollmentToken]:
    """Every token (plaintexts are never stored), newest first."""
    stmt = select(EnrollmentToken).order_by(EnrollmentToken.created_at.desc(), EnrollmentToken.id)
    return list(session.scalars(stmt.limit(limit)))


def revoke_enrollment_token(session: Session, token_id: str) -> EnrollmentToken:
    """From the commit on, the token enrolls nothing; nodes it already enrolled keep their own
    credentials (revoke those nodes to shut them out). Idempotent."""
    row = session.get(EnrollmentToken, token_id)
    if row is None:
        raise NotFound(f"enrollment token {token_id} not found", field="token_id")
    row.revoked_at = row.revoked_at or utcnow()
    return row
