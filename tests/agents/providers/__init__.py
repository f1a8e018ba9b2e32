"""Scripted model servers, one module a provider's API, each with a ``Handler``.

A script is a JSON list of turns that the provider module reads in order: each request
for a model response takes the next turn (the module says what a turn holds: text, a
tool call, ...). Every request is appended to the log as one JSON line
(``{"method", "path", "headers", "body"}``) for the test to read afterwards.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class ScriptedHandler(BaseHTTPRequestHandler):
    """Base: ``self.next_turn()`` gives the script's next turn (None past its end);
    ``self.body_json`` is the request's body; ``send_json`` and ``send_sse`` answer."""

    protocol_version = "HTTP/1.1"
    server: "_Server"

    def log_message(self, fmt, *args):  # quiet: the request log is the record
        pass

    def _read(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _record(self, body: bytes) -> None:
        try:
            parsed = json.loads(body) if body else None
        except ValueError:
            parsed = body.decode("utf-8", "replace")
        self.body_json = parsed
        entry = {"method": self.command, "path": self.path,
                 "headers": {k.lower(): v for k, v in self.headers.items()}, "body": parsed}
        with self.server.lock, open(self.server.log, "a") as f:
            f.write(json.dumps(entry) + "\n")

    def next_turn(self):
        with self.server.lock:
            if self.server.turn >= len(self.server.script):
                return None
            turn = self.server.script[self.server.turn]
            self.server.turn += 1
            return turn

    def do_GET(self):
        self._record(b"")
        self.handle_request()

    def do_POST(self):
        self._record(self._read())
        self.handle_request()

    def do_HEAD(self):
        self._record(b"")
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def handle_request(self) -> None:  # the provider's routing
        self.send_json({"error": "not scripted"}, status=404)

    def send_json(self, obj, status: int = 200) -> None:
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def send_sse(self, events: list[tuple[str | None, object]]) -> None:
        """Server-sent events: (event name or None, data object or raw string) each."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        for name, data in events:
            chunk = ""
            if name:
                chunk += f"event: {name}\n"
            payload = data if isinstance(data, str) else json.dumps(data)
            chunk += f"data: {payload}\n\n"
            self.wfile.write(chunk.encode())
            self.wfile.flush()
        self.close_connection = True


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    script: list
    turn: int
    log: str
    lock: threading.Lock


def serve(handler: type[ScriptedHandler], script_file: str, log_file: str,
          port: int) -> _Server:
    server = _Server(("127.0.0.1", port), handler)
    with open(script_file) as f:
        server.script = json.load(f)
    server.turn = 0
    server.log = log_file
    server.lock = threading.Lock()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server
