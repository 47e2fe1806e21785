"""moto's DynamoDB in server mode, one request at a time (the tests' and the stress
run's DynamoDB stand-in)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any

from moto.core.model_instances import reset_model_data
from moto.moto_server.werkzeug_app import (
    DomainDispatcherApplication,
    MotoRequestHandler,
    create_backend_app,
)
from werkzeug.serving import BaseWSGIServer, make_server

StartResponse = Callable[..., Any]


class _QuietHandler(MotoRequestHandler):
    protocol_version = "HTTP/1.1"  # keep connections open between requests

    def log_request(self, *args: Any, **kwargs: Any) -> None:
        pass


class SerializedMotoServer:
    """moto's DynamoDB on ``host`` (port chosen by the OS), one request at a time.

    moto's in-memory backend is not safe under concurrent requests (a conditional write
    can interleave with another request, and a cancelled transaction restores a copy of
    the table taken before it started), so its application runs behind one lock: one
    request at a time, linearizable like the service.
    """

    def __init__(self, host: str = "127.0.0.1") -> None:
        self._host = host
        self._server: BaseWSGIServer | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._inner: Any = DomainDispatcherApplication(create_backend_app)

    def _app(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        with self._lock:
            body = b"".join(self._inner(environ, start_response))
        return [body]

    def start(self) -> str:
        """Start serving; return the endpoint URL."""
        logging.getLogger("werkzeug").setLevel(logging.ERROR)
        server = make_server(self._host, 0, self._app, threaded=True, request_handler=_QuietHandler)
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, name="moto", daemon=True)
        self._thread.start()
        return f"http://{self._host}:{server.server_port}"

    def forget_tracked_instances(self) -> None:
        """Drop moto's record of every model object it made (a transaction deep-copies
        its table; without this, garbage collection stalls for seconds)."""
        with self._lock:
            reset_model_data()

    def stop(self) -> None:
        """Stop serving and wait for the server thread."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)
