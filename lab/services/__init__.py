"""Local stand-ins of the cloud services the product talks to, as real servers on loopback.

Each module serves one service the way the real one behaves for the operations the product uses (requests checked
against the service's published specs, real status codes, headers and error bodies), so the product's real client
code runs against it. The tests start and stop them; the demo plays its scenes against them. Nothing here listens on
anything but a loopback address.
"""

from __future__ import annotations

import ipaddress
import threading
from http.server import ThreadingHTTPServer
from typing import Any, TypeVar

__all__ = ["LoopbackService", "require_loopback"]

S = TypeVar("S", bound="LoopbackService")


def require_loopback(host: str, service: str) -> None:
    """Refuse any address outside 127.0.0.0/8 and ::1 (``localhost`` is loopback), naming the service."""
    try:
        ok = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(f"the {service} serves loopback addresses only, not {host}")


class LoopbackService:
    """A real HTTP(S) server on loopback, served from a daemon thread: ``with Service(...) as svc: svc.url``.

    A subclass either sets ``self._server`` in its constructor (the address is known before :meth:`start`), or
    implements :meth:`_make_server`, which :meth:`start` calls (e.g. to wrap the socket in TLS).
    """

    scheme = "http"
    thread_name = "lab-service"
    _server: ThreadingHTTPServer | None = None
    _thread: threading.Thread | None = None

    def _make_server(self) -> ThreadingHTTPServer:
        raise NotImplementedError(f"{type(self).__name__} sets _server in its constructor or makes it here")

    @property
    def url(self) -> str:
        assert self._server is not None, "start() first"
        host, port = self._server.server_address[:2]
        return f"{self.scheme}://{host!s}:{port}"

    def start(self: S) -> S:
        if self._server is None:
            self._server = self._make_server()
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.1}, name=self.thread_name, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self: S) -> S:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
