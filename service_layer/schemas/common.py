"""Shapes shared by every endpoint: the error body."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

# An id cursor over rows with an Integer primary key: the largest value the column holds
# (PostgreSQL's integer is 32 bits); a larger cursor would fail in the database, not here.
ROW_ID_MAX = 2**31 - 1


class ApiModel(BaseModel):
    """Base of response schemas: built from ORM rows or dicts."""

    model_config = ConfigDict(from_attributes=True)


class ErrorBody(BaseModel):
    code: str = Field(description="Machine-readable error kind, e.g. not_found, invalid_argument")
    message: str
    details: dict[str, Any] = Field(default_factory=dict)

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "code": "invalid_argument",
                    "message": "invalid request: training.steps: Input should be greater than 0",
                    "details": {
                        "errors": [{"field": "training.steps", "message": "Input should be greater than 0"}]
                    },
                }
            ]
        }
    )


def error_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` entries for the error codes an endpoint can return."""
    text = {
        401: "Missing or invalid API key",
        403: "Admin key required",
        404: "Not found (or owned by another tenant)",
        402: "A spending cap would be exceeded (the tenant's max_monthly_spend); details name the numbers",
        409: "Conflicts with the current state (e.g. no feasible plan, job already finished)",
        400: "Malformed request (e.g. a Content-Length that is not a number)",
        413: "Request body over the server's limit (CPN_MAX_BODY_BYTES)",
        422: "Invalid request; details.errors names each field",
        429: "A per-tenant limit is reached (e.g. open event streams); retry once one closes",
        503: "Database or bus unavailable",
    }
    return {c: {"model": ErrorBody, "description": text.get(c, "Error")} for c in codes}
