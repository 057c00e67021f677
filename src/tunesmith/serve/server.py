"""Run the app under uvicorn on a socket we bind ourselves (so port 0 works and the real
address is known before the first request)."""

from __future__ import annotations

import ipaddress
import logging
import socket
from typing import Any

log = logging.getLogger(__name__)


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on (host, port); port 0 picks a free port."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.setblocking(False)
    return sock


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def build_server(app: Any, *, access_log: bool = False) -> Any:
    """A uvicorn Server for `app` (start it with `server.run(sockets=[sock])`)."""
    import uvicorn

    config = uvicorn.Config(app, access_log=access_log, log_level="warning",
                            timeout_graceful_shutdown=5)
    return uvicorn.Server(config)
