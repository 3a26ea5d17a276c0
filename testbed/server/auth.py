"""The API key check: `Authorization: Bearer <key>` when the server has a key, nothing otherwise."""

from __future__ import annotations

import secrets

from fastapi import Request

from testbed.server import protocol as P


def api_key_check(api_key: str | None):
    """A FastAPI dependency that refuses requests without the key (401)."""

    async def check_api_key(request: Request) -> None:
        if api_key is None:
            return
        auth = request.headers.get("authorization", "")
        scheme, _, token = auth.partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(token.strip().encode(), api_key.encode()):
            raise P.APIError(
                "Incorrect or missing API key (send `Authorization: Bearer <key>`).",
                401,
                "invalid_request_error",
                code="invalid_api_key",
            )

    return check_api_key
