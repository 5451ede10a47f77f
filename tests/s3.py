"""A real S3-compatible server for the tests: moto's server mode (``ThreadedMotoServer``), as
fake-gcs-server is for GCS (``tests/gcs.py``).

It listens on a free port of 127.0.0.1; :attr:`S3Server.env` holds what pyarrow's S3 client
(``pyarrow.fs.FileSystem.from_uri("s3://...")``) needs to reach it, and
:meth:`S3Server.filesystem` a ``pyarrow.fs.S3FileSystem`` pointed at it (for
``RunConfig(storage_filesystem=...)``).
"""

from __future__ import annotations

import itertools
import logging
from typing import Any

from tests.support.ports import free_port

REGION = "us-east-1"


class S3Server:
    """A running moto S3 server."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._server: Any = None
        self._buckets = itertools.count()

    @property
    def env(self) -> dict[str, str]:
        """Environment for pyarrow's (and boto's) S3 clients."""
        return {
            "AWS_ENDPOINT_URL": self.url,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": REGION,
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def start(self) -> S3Server:
        """Start the server in a thread of this process."""
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self._server.start()
        return self

    def stop(self) -> None:
        """Stop the server (its buckets are gone with it)."""
        if self._server is not None:
            self._server.stop()
            self._server = None

    def filesystem(self, **kwargs: Any) -> Any:
        """A ``pyarrow.fs.S3FileSystem`` on this server."""
        import pyarrow.fs as pafs

        return pafs.S3FileSystem(
            access_key="testing",
            secret_key="testing",
            endpoint_override=self.url,
            scheme="http",
            region=REGION,
            allow_bucket_creation=True,
            allow_bucket_deletion=True,
            **kwargs,
        )

    def new_bucket(self) -> str:
        """A fresh, empty bucket."""
        name = f"bucket-{next(self._buckets)}"
        self.filesystem().create_dir(name)
        return name
