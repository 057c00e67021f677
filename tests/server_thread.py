"""Run a tunesmith API app under uvicorn in a background thread on a free loopback port."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

from tunesmith.serve.server import bind_socket, build_server


@contextlib.contextmanager
def running_server(app: Any) -> Iterator[str]:
    """Yield the base URL (http://127.0.0.1:PORT/v1) while the server runs."""
    sock = bind_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    server = build_server(app)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the test server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.should_exit = True
        thread.join(timeout=15)
        sock.close()
