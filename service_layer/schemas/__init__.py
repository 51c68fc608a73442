"""Pydantic request/response schemas of the REST API, kept apart from the ORM models."""
