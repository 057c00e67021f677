"""Bearer-token check for every route, as a plain ASGI middleware.

It runs before routing, so unknown paths, /v1/models and the completion routes are all
covered; the key is compared in constant time.
"""

from __future__ import annotations

import hmac
import json
from typing import Any

from tunesmith.serve.errors import error_body

Scope = dict[str, Any]


class BearerAuth:
    def __init__(self, app: Any, api_key: str):
        self.app = app
        self._expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = b""
        for name, value in scope.get("headers", []):
            if name.lower() == b"authorization":
                given = value
                break
        if hmac.compare_digest(given, self._expected):
            await self.app(scope, receive, send)
            return
        message = ("missing API key: send the header 'Authorization: Bearer <key>'" if not given
                   else "incorrect API key in the Authorization header")
        body = json.dumps(error_body(401, message, code="invalid_api_key")).encode()
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"),
                                (b"www-authenticate", b"Bearer"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
