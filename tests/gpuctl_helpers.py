"""A stand-in HTTP server for gpuctl tests: canned answers on 127.0.0.1, every request recorded."""

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest


class StandIn:
    """A tiny HTTP server: answers from ``routes`` (METHOD path -> status, body, headers) and records requests."""

    def __init__(self):
        self.routes: dict[str, tuple] = {}
        self.requests: list[dict] = []
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _answer(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                path, _, query = self.path.partition("?")
                stand_in.requests.append({"method": self.command, "path": path, "query": query,
                                          "headers": dict(self.headers), "body": json.loads(body) if body else None})
                status, answer, headers = stand_in.routes.get(f"{self.command} {path}",
                                                              (404, {"error": f"no route {path}"}, {}))
                if callable(answer):
                    answer(self)
                    return
                data = answer if isinstance(answer, bytes) else json.dumps(answer).encode()
                self.send_response(status)
                for key, value in {"Content-Type": "application/json", **headers}.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = _answer

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


@pytest.fixture
def stand_in():
    server = StandIn()
    yield server
    server.close()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
