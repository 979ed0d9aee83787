"""Serve a :data:`PageHandler` on loopback for tests, streaming iterable bodies (chunked)."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from reconciler.web.response import PageHandler


def serve_pages(handler: PageHandler, host: str = "127.0.0.1") -> ThreadingHTTPServer:
    """Start a server on a free port in a daemon thread; ``server.server_address`` says where."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            return

        def _handle(self, method: str) -> None:
            parts = urlsplit(self.path)
            resp = handler(method, parts.path, parse_qs(parts.query))
            if resp is None:
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(resp.status)
            self.send_header("Content-Type", resp.content_type)
            for k, v in resp.headers.items():
                self.send_header(k, v)
            if isinstance(resp.body, bytes):
                self.send_header("Content-Length", str(len(resp.body)))
                self.end_headers()
                if method != "HEAD":
                    self.wfile.write(resp.body)
                return
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            try:
                for chunk in resp.body:
                    if chunk:
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                        self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")
            except OSError:
                close = getattr(resp.body, "close", None)
                if close is not None:
                    close()

        def do_GET(self) -> None:
            self._handle("GET")

        def do_HEAD(self) -> None:
            self._handle("HEAD")

        def do_POST(self) -> None:
            self._handle("POST")

    server = ThreadingHTTPServer((host, 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="pages", daemon=True).start()
    return server
