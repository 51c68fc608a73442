"""Roles of API keys, what each may do, and who a request acts as. Pure: no database, no web.

A key has one role. Permissions are few and coarse on purpose: each route declares exactly one,
and this table is the only place that says which roles hold it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from contracts.errors import PermissionDenied


class Role(StrEnum):
    ADMIN = "admin"  # everything
    OPERATOR = "operator"  # the fleet: nodes, links, enrollment tokens
    TENANT_ADMIN = "tenant-admin"  # own tenant's keys and members, and its jobs
    MEMBER = "member"  # own tenant's jobs


class Permission(StrEnum):
    VIEW_FLEET = "view-fleet"  # regions, clusters with their nodes, links
    RUN_JOBS = "run-jobs"  # quote, submit, read and cancel the own tenant's jobs
    MANAGE_KEYS = "manage-keys"  # create, list and revoke the own tenant's keys
    MANAGE_FLEET = "manage-fleet"  # cordon, drain, revoke nodes; links; enrollment tokens; snapshot
    ADMINISTER = "administer"  # tenants, any tenant's keys and jobs, audit, calibration, metrics


GRANTS: dict[Role, frozenset[Permission]] = {
    Role.ADMIN: frozenset(Permission),
    Role.OPERATOR: frozenset({Permission.VIEW_FLEET, Permission.MANAGE_FLEET}),
    Role.TENANT_ADMIN: frozenset({Permission.VIEW_FLEET, Permission.RUN_JOBS, Permission.MANAGE_KEYS}),
    Role.MEMBER: frozenset({Permission.VIEW_FLEET, Permission.RUN_JOBS}),
}

# Roles only the platform's own tenant (``Tenant.is_admin``) may hold: they reach past one tenant.
PLATFORM_ROLES = frozenset({Role.ADMIN, Role.OPERATOR})
# Roles a tenant-admin may hand out within its tenant.
TENANT_GRANTABLE = frozenset({Role.TENANT_ADMIN, Role.MEMBER})


def roles_with(permission: Permission) -> list[Role]:
    return [role for role in Role if permission in GRANTS[role]]


def default_role(platform_tenant: bool) -> Role:
    """The role of a key created without one (and of every key that predates roles)."""
    return Role.ADMIN if platform_tenant else Role.TENANT_ADMIN


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a request acts as: one key of one tenant, with the key's role.

    ``id`` and ``name`` are the tenant's, so code that scopes by tenant reads the same as before
    keys had roles; ``member`` is the key holder's name, if the key was given one.
    """

    id: str  # the tenant's id
    name: str  # the tenant's name
    key_id: str
    role: Role
    member: str = ""
    platform: bool = False  # the key belongs to the platform's own tenant

    @property
    def is_admin(self) -> bool:
        """Sees and may act on every tenant's jobs and keys."""
        return self.role is Role.ADMIN

    def can(self, permission: Permission) -> bool:
        return permission in GRANTS[self.role]

    def require(self, permission: Permission) -> Principal:
        if not self.can(permission):
            needed = " or ".join(roles_with(permission))
            raise PermissionDenied(
                f"this needs a key with role {needed} ({permission}); this key's role is {self.role}",
                permission=str(permission),
                role=str(self.role),
                roles=[str(r) for r in roles_with(permission)],
            )
        return self


def check_grant(granter: Principal, role: Role, tenant_id: str, platform_tenant: bool) -> None:
    """Raise PermissionDenied, naming the rule, unless ``granter`` may create a key with ``role`` for
    tenant ``tenant_id`` (``platform_tenant``: that tenant is the platform's own)."""
    if role in PLATFORM_ROLES and not platform_tenant:
        raise PermissionDenied(
            f"role: {role} keys belong to the platform tenant only", field="role", role=str(role)
        )
    if granter.is_admin:
        return
    if tenant_id != granter.id:
        raise PermissionDenied(
            "tenant_id: a tenant-admin manages its own tenant's keys only", field="tenant_id"
        )
    if role not in TENANT_GRANTABLE:
        raise PermissionDenied(
            f"role: a tenant-admin grants {' or '.join(sorted(TENANT_GRANTABLE))}, not {role}",
            field="role",
            role=str(role),
        )
