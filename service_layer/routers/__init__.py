"""REST routers under /v1: each converts the request, delegates to the domain, converts the answer."""
