"""Who may see the dashboard.

An admin signs in once on the login form, which POSTs the key (never in a URL, so it stays out of
browser history and access logs); the server checks the key and sets an HttpOnly cookie holding
the admin tenant's id, an expiry and an HMAC over both with ``settings.secret_key`` — the key
itself never sits in the browser. In
development, requests from loopback are let in without a key, so a local ``cpn server`` or
``cpn demo`` is one click away; any other environment or address needs the key.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import time

from fastapi import Request
from sqlalchemy.orm import Session

from contracts.errors import PermissionDenied, Unauthenticated
from orchestration.db.models import Tenant
from orchestration.settings import Settings
from service_layer.auth import authenticate

COOKIE = "cpn_dashboard"
COOKIE_TTL_S = 12 * 3600


def _sign(secret: str, payload: str) -> str:
    return hmac.new(secret.encode(), payload.encode(), hashlib.sha256).hexdigest()


def make_cookie(settings: Settings, tenant_id: str, now: float | None = None) -> str:
    expires = int((now or time.time()) + COOKIE_TTL_S)
    payload = f"{tenant_id}.{expires}"
    return f"{payload}.{_sign(settings.secret_key, payload)}"


def tenant_from_cookie(settings: Settings, value: str | None, now: float | None = None) -> str | None:
    """The tenant id a valid, unexpired cookie names; None otherwise."""
    if not value or value.count(".") != 2:
        return None
    tenant_id, expires, sig = value.split(".")
    if not hmac.compare_digest(sig, _sign(settings.secret_key, f"{tenant_id}.{expires}")):
        return None
    if not expires.isdigit() or int(expires) < (now or time.time()):
        return None
    return tenant_id


def is_loopback(request: Request) -> bool:
    host = request.client.host if request.client else ""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def open_without_key(settings: Settings, request: Request) -> bool:
    return settings.environment == "development" and is_loopback(request)


def admin_from_key(session: Session, key: str) -> Tenant:
    tenant = authenticate(session, key)
    if not tenant.is_admin:
        raise PermissionDenied("the dashboard needs an admin API key")
    return tenant


def check_access(session: Session, settings: Settings, request: Request) -> None:
    """Raise Unauthenticated/PermissionDenied unless the request may see the dashboard."""
    if open_without_key(settings, request):
        return
    tenant_id = tenant_from_cookie(settings, request.cookies.get(COOKIE))
    if tenant_id is None:
        raise Unauthenticated("sign in with an admin API key")
    tenant = session.get(Tenant, tenant_id)
    if tenant is None or not tenant.is_admin:
        raise PermissionDenied("the dashboard needs an admin API key")
