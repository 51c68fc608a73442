"""The role table and the grant rules, as pure functions."""

from __future__ import annotations

import pytest

from contracts.errors import PermissionDenied
from contracts.roles import GRANTS, Permission, Principal, Role, check_grant, default_role, roles_with


def who(role: Role, tenant: str = "t1", platform: bool = False) -> Principal:
    return Principal(id=tenant, name=tenant, key_id="k", role=role, platform=platform)


def test_the_table_says_what_the_issue_asks() -> None:
    assert GRANTS[Role.ADMIN] == frozenset(Permission)
    assert roles_with(Permission.MANAGE_FLEET) == [Role.ADMIN, Role.OPERATOR]
    assert roles_with(Permission.MANAGE_KEYS) == [Role.ADMIN, Role.TENANT_ADMIN]
    assert roles_with(Permission.RUN_JOBS) == [Role.ADMIN, Role.TENANT_ADMIN, Role.MEMBER]
    assert roles_with(Permission.ADMINISTER) == [Role.ADMIN]
    assert not who(Role.OPERATOR).can(Permission.RUN_JOBS)  # no tenant's jobs for the fleet's staff
    assert default_role(True) is Role.ADMIN and default_role(False) is Role.TENANT_ADMIN


def test_a_refusal_names_the_roles_that_may() -> None:
    with pytest.raises(PermissionDenied) as denied:
        who(Role.MEMBER).require(Permission.MANAGE_FLEET)
    assert "admin or operator" in denied.value.message and "member" in denied.value.message
    assert denied.value.details["roles"] == ["admin", "operator"]
    assert who(Role.OPERATOR).require(Permission.MANAGE_FLEET).role is Role.OPERATOR
    assert who(Role.ADMIN).is_admin and not who(Role.TENANT_ADMIN).is_admin


def test_grants() -> None:
    check_grant(who(Role.TENANT_ADMIN), Role.MEMBER, "t1", False)
    check_grant(who(Role.TENANT_ADMIN), Role.TENANT_ADMIN, "t1", False)
    check_grant(who(Role.ADMIN, "root", True), Role.OPERATOR, "root", True)
    check_grant(who(Role.ADMIN, "root", True), Role.MEMBER, "t1", False)
    refused = [
        (who(Role.TENANT_ADMIN), Role.MEMBER, "t2", False),  # another tenant
        (who(Role.TENANT_ADMIN), Role.ADMIN, "t1", False),  # above its own role
        (who(Role.TENANT_ADMIN, "root", True), Role.OPERATOR, "root", True),  # only admins grant it
        (who(Role.ADMIN, "root", True), Role.OPERATOR, "t1", False),  # fleet roles: platform only
    ]
    for granter, role, tenant, platform in refused:
        with pytest.raises(PermissionDenied):
            check_grant(granter, role, tenant, platform)
