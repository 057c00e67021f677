"""A request body limit, as a plain ASGI middleware in front of everything else.

A body over `max_bytes` is answered 413 before any route runs, so nothing of it is
parsed or tokenised: a declared Content-Length is refused without reading the body, and a
chunked body is read only up to the limit.
"""

from __future__ import annotations

import json
from typing import Any

from tunesmith.serve.errors import error_body

DEFAULT_MAX_REQUEST_BYTES = 10 * 2**20


def _too_large(limit: int, size: str) -> bytes:
    message = (f"the request body is {size}, over this server's limit of {limit} bytes "
               "(--max_request_bytes); send a shorter prompt")
    return json.dumps(error_body(413, message, code="request_too_large")).encode()


class BodyLimit:
    def __init__(self, app: Any, max_bytes: int = DEFAULT_MAX_REQUEST_BYTES):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers", [])).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await _answer_413(send, _too_large(self.max_bytes, f"{int(declared)} bytes"))
            return
        body, more = b"", True
        while more:  # buffered up to the limit, then replayed to the app
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.max_bytes:
                await _answer_413(send, _too_large(self.max_bytes, "larger"))
                return
        await self.app(scope, _replay(body, receive), send)


def _replay(body: bytes, receive: Any) -> Any:
    sent = [False]

    async def replay() -> dict[str, Any]:
        if not sent[0]:
            sent[0] = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()  # after the body: disconnect notices
    return replay


async def _answer_413(send: Any, body: bytes) -> None:
    await send({"type": "http.response.start", "status": 413,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})
