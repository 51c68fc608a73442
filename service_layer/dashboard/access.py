"""Who may see the dashboard.

An admin signs in once on the login form, which POSTs the key (never in a URL, so it stays out of
browser history and access logs); the server checks the key (its role must be admin) and sets an
HttpOnly cookie holding the key's id, an expiry and an HMAC over both with ``settings.secret_key``
— the key itself never sits in the browser. In development, requests from loopback are let in
without a key, so a local ``cpn server`` or ``cpn demo`` is one click away; any other environment
or address needs the key. Revoking the key ends the sessions signed in with it.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import time

from fastapi import Request
from sqlalchemy.orm import Session

from contracts.errors import PermissionDenied, Unauthenticated
from contracts.roles import Permission, Principal, Role
from orchestration.db.models import ApiKey
from orchestration.settings import Settings
from service_layer.auth import authenticate

COOKIE = "cpn_dashboard"
COOKIE_TTL_S = 12 * 3600


def _sign(secret: str, payload: str) -> str:
    return hmac.new(secret.encode(), payload.encode(), hashlib.sha256).hexdigest()


def make_cookie(settings: Settings, key_id: str, now: float | None = None) -> str:
    expires = int((now or time.time()) + COOKIE_TTL_S)
    payload = f"{key_id}.{expires}"
    return f"{payload}.{_sign(settings.secret_key, payload)}"


def key_from_cookie(settings: Settings, value: str | None, now: float | None = None) -> str | None:
    """The API key id a valid, unexpired cookie names; None otherwise."""
    if not value or value.count(".") != 2:
        return None
    key_id, expires, sig = value.split(".")
    if not hmac.compare_digest(sig, _sign(settings.secret_key, f"{key_id}.{expires}")):
        return None
    if not expires.isdigit() or int(expires) < (now or time.time()):
        return None
    return key_id


def is_loopback(request: Request) -> bool:
    host = request.client.host if request.client else ""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def open_without_key(settings: Settings, request: Request) -> bool:
    return settings.environment == "development" and is_loopback(request)


def admin_from_key(session: Session, key: str) -> Principal:
    return authenticate(session, key).require(Permission.ADMINISTER)


def check_access(session: Session, settings: Settings, request: Request) -> None:
    """Raise Unauthenticated/PermissionDenied unless the request may see the dashboard."""
    if open_without_key(settings, request):
        return
    key_id = key_from_cookie(settings, request.cookies.get(COOKIE))
    if key_id is None:
        raise Unauthenticated("sign in with an admin API key")
    key = session.get(ApiKey, key_id)
    if key is None or key.revoked_at is not None:
        raise Unauthenticated("the key this session signed in with was revoked; sign in again")
    if key.role != Role.ADMIN:
        raise PermissionDenied("the dashboard needs an admin API key")
