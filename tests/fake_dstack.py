"""A hostile dstack server for the tests: Python's http.server on 127.0.0.1 in a thread.

It answers as a small, valid dstack 0.22.5 would (one project, no runs, no events) except where
a test gives an endpoint its own answer. Every request is recorded (path, headers, body), so a
test can say what was sent, and to whom. It bounds itself in time: it stops serving after
LIFETIME_S, a streamed answer stops there too, and a client that stops reading is dropped after
the same time, so a test whose client misbehaves ends instead of hanging. Real sockets and a
real HTTP client on the other side: only the server's answers are made up, which is the point
(the peer is the attacker).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Handler = Callable[["Request"], None]
LIFETIME_S = 120.0  # longer than any test's collection; far shorter than a hang


class Request:
    """One request as received, with the means to answer it."""

    def __init__(self, handler: BaseHTTPRequestHandler, body: Any, until: float) -> None:
        self.handler = handler
        self.until = until  # the server's end: a stream stops here
        self.path = handler.path
        self.headers = dict(handler.headers.items())
        self.body = body

    def json(self, doc: Any, status: int = 200) -> None:
        self.raw(json.dumps(doc).encode(), status)

    def raw(self, content: bytes, status: int = 200, headers: dict[str, str] | None = None) -> None:
        self.handler.send_response(status)
        self.handler.send_header("Content-Type", "application/json")
        for name, value in (headers or {}).items():
            self.handler.send_header(name, value)
        if "Content-Length" not in (headers or {}):
            self.handler.send_header("Content-Length", str(len(content)))
        self.handler.end_headers()
        self.handler.wfile.write(content)

    def stream(
        self, pieces: Iterable[bytes], headers: dict[str, str] | None = None, *, pause: float = 0
    ) -> None:
        """A body sent piece by piece (chunked unless `headers` name a length), `pause` s
        apart; stops quietly when the client hangs up."""
        self.handler.send_response(200)
        self.handler.send_header("Content-Type", "application/json")
        chunked = "Content-Length" not in (headers or {})
        if chunked:
            self.handler.send_header("Transfer-Encoding", "chunked")
        for name, value in (headers or {}).items():
            self.handler.send_header(name, value)
        self.handler.end_headers()
        try:
            for piece in pieces:
                if time.monotonic() > self.until:  # its lifetime is over: cut, as a dying
                    self.handler.close_connection = True  # server would
                    return
                if chunked:
                    piece = f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
                self.handler.wfile.write(piece)
                self.handler.wfile.flush()
                if pause:
                    time.sleep(pause)
            if chunked:
                self.handler.wfile.write(b"0\r\n\r\n")
        except OSError:
            pass


def _default(request: Request) -> None:
    path = request.path
    if path == "/api/server/get_info":
        request.json({"server_version": "0.22.5"})
    elif path == "/api/projects/list":
        request.json(
            [{"project_name": "main", "project_id": "11111111-1111-4111-8111-111111111111"}]
        )
    elif path in ("/api/runs/list", "/api/events/list", "/api/fleets/list", "/api/instances/list"):
        request.json([])
    else:
        request.json({"detail": [{"msg": "not found"}]}, status=404)


class _Quiet(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hangs up mid-answer is what the tests do on purpose."""


class FakeDstack:
    """The server: `answers[path]` replaces the default answer of that path."""

    def __init__(
        self, answers: dict[str, Handler] | None = None, *, lifetime: float = LIFETIME_S
    ) -> None:
        self.answers = dict(answers or {})
        self.lifetime = lifetime
        self.until = time.monotonic() + lifetime
        self.requests: list[Request] = []
        self._lock = threading.Lock()
        fake = self

        class _Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            timeout = lifetime  # a client that neither sends nor reads is dropped

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                request = Request(self, json.loads(raw) if raw else None, fake.until)
                with fake._lock:
                    fake.requests.append(request)
                try:
                    fake.answers.get(request.path, _default)(request)
                except OSError:
                    self.close_connection = True

            do_GET = do_POST

            def log_message(self, *args: Any) -> None:
                pass

        self._server = _Quiet(("127.0.0.1", 0), _Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._end = threading.Timer(lifetime, self._close)
        self._end.daemon = True

    def __enter__(self) -> FakeDstack:
        self.until = time.monotonic() + self.lifetime
        self._thread.start()
        self._end.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._end.cancel()
        self._close()

    def _close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def paths(self) -> list[str]:
        with self._lock:
            return [r.path for r in self.requests]


def run(number: int) -> dict[str, Any]:
    """A runs-list item with the fields the collector pages by."""
    return {
        "id": f"{number:08d}-0000-4000-8000-000000000000",
        "submitted_at": f"2026-01-01T00:00:{number % 60:02d}+00:00",
        "run_spec": {"run_name": f"run-{number}"},
    }
