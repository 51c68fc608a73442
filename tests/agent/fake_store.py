"""A real HTTP server on loopback standing in for the control plane's artifact endpoints:
``GET /v1/artifacts/content/{name}`` (with ``Range``) and ``PUT /v1/jobs/{job}/outputs/{name}``
(streamed body, its SHA-256 checked against ``X-Content-SHA256``)."""

from __future__ import annotations

import hashlib
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

_RANGE = re.compile(r"^bytes=(\d+)-$")


@dataclass
class Request:
    method: str
    path: str
    range: str | None


@dataclass
class FakeStore:
    blobs: dict[str, bytes] = field(default_factory=dict)
    uploads: dict[str, bytes] = field(default_factory=dict)
    requests: list[Request] = field(default_factory=list)
    # name -> bytes after which the next GET of it drops its connection (once)
    drop_after: dict[str, int] = field(default_factory=dict)
    refuse_puts: int = 0  # HTTP status for every PUT (0: accept)
    server: ThreadingHTTPServer | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def base(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def blob_url(self, name: str) -> str:
        return f"{self.base}/v1/artifacts/content/{name}?ticket=t"

    def output_url(self, name: str, job: str = "j1") -> str:
        return f"{self.base}/v1/jobs/{job}/outputs/{name}?ticket=t"

    def gets(self, name: str) -> list[Request]:
        return [r for r in self.requests if r.method == "GET" and r.path.split("?")[0].endswith("/" + name)]

    def start(self) -> FakeStore:
        store = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802
                rng = self.headers.get("Range")
                with store.lock:
                    store.requests.append(Request("GET", self.path, rng))
                name = self.path.split("?")[0].rsplit("/", 1)[-1]
                data = store.blobs.get(name)
                if data is None:
                    self.send_response(404)
                    self.send_header("Content-Length", "9")
                    self.end_headers()
                    self.wfile.write(b"not found")
                    return
                start = 0
                if rng and (m := _RANGE.match(rng)):
                    start = int(m.group(1))
                    if start >= len(data):
                        self.send_response(416)
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                body = data[start:]
                self.send_response(206 if start else 200)
                if start:
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                with store.lock:
                    cut = store.drop_after.pop(name, None)
                if cut is not None:
                    self.wfile.write(body[:cut])
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(2)  # the connection drops mid-body
                    return
                self.wfile.write(body)

            def do_PUT(self) -> None:  # noqa: N802
                with store.lock:
                    store.requests.append(Request("PUT", self.path, None))
                name = self.path.split("?")[0].rsplit("/", 1)[-1]
                length = int(self.headers.get("Content-Length", "0"))
                h, chunks, left = hashlib.sha256(), [], length
                while left:
                    chunk = self.rfile.read(min(left, 1 << 16))
                    if not chunk:
                        break
                    h.update(chunk)
                    chunks.append(chunk)
                    left -= len(chunk)
                claimed = self.headers.get("X-Content-SHA256")
                status = store.refuse_puts or (201 if claimed == "sha256:" + h.hexdigest() else 400)
                if status == 201:
                    with store.lock:
                        store.uploads[name] = b"".join(chunks)
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


def digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()
