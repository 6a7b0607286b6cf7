"""The HTTP side every JSON stand-in shares (Kubernetes API, IMDS, Alertmanager and its webhook receiver): read a
bounded body, let the stand-in answer, write the JSON reply and close; no request logging on stderr (each stand-in
keeps its own request log)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler
from typing import Any

#: (method, path, headers with lower-case names, body) -> (status, document; None: an empty body)
Answer = Callable[[str, str, Mapping[str, str], bytes], tuple[int, Any]]


def json_handler(answer: Answer, *, max_body: int = 1 << 20,
                 content_type: str = "application/json") -> type[BaseHTTPRequestHandler]:
    """A request handler class that serves every method through ``answer``."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _reply(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(min(length, max_body)) if length > 0 else b""
            status, doc = answer(self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, body)
            data = b"" if doc is None else json.dumps(doc).encode()
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(data)
            self.close_connection = True

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _reply

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler
