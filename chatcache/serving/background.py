"""`chatcache serve` inside a running program: on a free loopback port, in a thread.

For tests, benchmarks and notebooks that talk to a real server over real sockets without a
second process. uvicorn installs no signal handlers off the main thread, so stopping is
`stop()` (or leaving the `with` block), which shuts down as SIGTERM would: running turns end,
then the app's lifespan spills KV and closes the database.
"""

from __future__ import annotations

import threading
import time

import uvicorn
from fastapi import FastAPI


class BackgroundServer:
    """Serve `app` on `host` (a free port) until `stop`; starting waits for the app's startup.

    Raises:
        RuntimeError: the app did not start within `start_timeout_s` (its error is in the log).
    """

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", start_timeout_s: float = 600) -> None:
        self.app = app
        self._server = uvicorn.Server(uvicorn.Config(app, host=host, port=0, log_level="warning"))
        self._thread = threading.Thread(target=self._server.run, name="chatcache-serve", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + start_timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server did not start")
            time.sleep(0.05)
        port = self._server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://{host}:{port}"

    def stop(self, timeout_s: float = 300) -> None:
        self._server.should_exit = True
        self._thread.join(timeout_s)

    def __enter__(self) -> BackgroundServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
