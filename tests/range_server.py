"""An HTTP server of local files that honours `Range` (the standard library's http.server ignores it),
for the tests of remote token shards (fsspec + aiohttp). It counts the body bytes it sends, so tests
can show that reading instances transfers byte ranges, never whole files, and it fails or ignores
ranges on request."""

from __future__ import annotations

import contextlib
import re
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path


class RangeServer(HTTPServer):
    """Serves files under `root`; knobs for failures. One request at a time (no handler threads)."""

    request_queue_size = 64  # TokenSource opens files from 8 threads; a short backlog stalls on SYN retries

    def __init__(self, root: Path):
        super().__init__(("127.0.0.1", 0), RangeHandler)
        self.root = root
        self.fail: set[str] = set()  # paths (relative to root) answered with 500
        self.ignore_range = False  # answer 200 + whole file, as a server without Range support
        self.bytes_sent = 0
        self.requests: list[tuple[str, str, str | None]] = []  # (method, path, Range header)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class RangeHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"  # one request per connection: nothing stays open at shutdown
    server: RangeServer

    def do_HEAD(self):
        self._serve(send_body=False)

    def do_GET(self):
        self._serve(send_body=True)

    def log_message(self, *args):  # keep pytest output clean
        pass

    def _serve(self, send_body: bool):
        srv = self.server
        name = self.path.split("?", 1)[0].lstrip("/")
        srv.requests.append((self.command, name, self.headers.get("Range")))
        path = (srv.root / name).resolve()
        if name in srv.fail:
            return self.send_error(HTTPStatus.INTERNAL_SERVER_ERROR)
        if srv.root.resolve() not in path.parents or not path.is_file():
            return self.send_error(HTTPStatus.NOT_FOUND)
        data = path.read_bytes()
        status, body = HTTPStatus.OK, data
        match = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range") or "")
        if match and not srv.ignore_range:
            start = int(match[1])
            end = min(int(match[2]) if match[2] else len(data) - 1, len(data) - 1)  # inclusive
            if start >= len(data):
                return self.send_error(HTTPStatus.REQUESTED_RANGE_NOT_SATISFIABLE)
            status, body = HTTPStatus.PARTIAL_CONTENT, data[start : end + 1]
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Length", str(len(body)))
        if status == HTTPStatus.PARTIAL_CONTENT:
            self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
        self.end_headers()
        if send_body:
            srv.bytes_sent += len(body)  # before the write: the client may go on as soon as it has the data
            self.wfile.write(body)


@contextlib.contextmanager
def serving(root: Path):
    """A RangeServer of the files under `root` on a thread, stopped on exit."""
    root.mkdir(exist_ok=True)
    srv = RangeServer(root)
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()
        thread.join(timeout=5)
        assert not thread.is_alive(), "the test HTTP server did not stop"
