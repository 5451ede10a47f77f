"""Storage backends against real storage: a local folder and fake-gcs-server."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from trainer_runtime.errors import StorageError
from trainer_runtime.storage import get_storage, join_uri, validate_storage_uri
from trainer_runtime.storage.base import retry_call
from trainer_runtime.storage.gcs import GCSStorage, split_gcs_uri


def _make_tree(root: Path) -> dict[str, bytes]:
    files = {
        "model.pt": os.urandom(100_000),
        "optim/state.bin": os.urandom(3_000),
        "optim/deep/more.txt": b"hello",
        "empty.txt": b"",
    }
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return files


def test_upload_download_list_delete_roundtrip(storage_path: str, tmp_path: Path) -> None:
    storage = get_storage(storage_path)
    src = tmp_path / "src"
    files = _make_tree(src)
    dest = join_uri(storage_path, "run", "checkpoint_000001")

    stats = storage.upload_dir(src, dest)
    assert stats.files == len(files)
    assert stats.bytes == sum(len(v) for v in files.values())
    assert storage.list_files(dest) == sorted(files)
    assert storage.list_dirs(join_uri(storage_path, "run")) == ["checkpoint_000001"]

    out = tmp_path / "out"
    storage.download_dir(dest, out)
    for rel, data in files.items():
        assert (out / rel).read_bytes() == data

    storage.delete_dir(dest)
    assert storage.list_files(dest) == []
    assert storage.list_dirs(join_uri(storage_path, "run")) == []
    storage.delete_dir(dest)  # deleting twice is fine


def test_small_object_read_write_exists(storage_path: str) -> None:
    storage = get_storage(storage_path)
    uri = join_uri(storage_path, "run", "manifest.json")
    assert not storage.exists(uri)
    with pytest.raises(FileNotFoundError):
        storage.read_bytes(uri)
    storage.write_bytes(uri, b"one")
    storage.write_bytes(uri, b"two")
    assert storage.exists(uri)
    assert storage.read_bytes(uri) == b"two"


def test_local_write_leaves_no_temp_files(tmp_path: Path) -> None:
    storage = get_storage(str(tmp_path))
    storage.write_bytes(str(tmp_path / "a" / "m.json"), b"x")
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["m.json"]


def test_gcs_large_file_uses_chunked_upload(gcs_bucket: str, tmp_path: Path) -> None:
    # A small threshold makes the resumable, chunked path run on a 3 MiB file.
    storage = GCSStorage(chunk_size=256 * 1024, chunked_threshold=1 * 2**20)
    data = os.urandom(3 * 2**20 + 123)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "big.bin").write_bytes(data)
    dest = f"gs://{gcs_bucket}/big"
    storage.upload_dir(tmp_path / "src", dest)
    blob = storage.client.bucket(gcs_bucket).get_blob("big/big.bin")
    assert blob.size == len(data)
    assert blob.crc32c  # the server stored a checksum the client verified
    storage.download_dir(dest, tmp_path / "out")
    assert (tmp_path / "out" / "big.bin").read_bytes() == data


def test_gcs_chunk_size_defaults_to_100_mib_and_follows_the_env(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("TRAINJOB_GCS_CHUNK_MIB", raising=False)
    assert GCSStorage().chunk_size == 100 * 2**20
    monkeypatch.setenv("TRAINJOB_GCS_CHUNK_MIB", "16")
    assert GCSStorage().chunk_size == 16 * 2**20
    monkeypatch.setenv("TRAINJOB_GCS_CHUNK_MIB", "0.3")  # rounded to a multiple of 256 KiB
    assert GCSStorage().chunk_size == 256 * 1024
    assert GCSStorage(chunk_size=1024 * 1024).chunk_size == 1024 * 1024
    monkeypatch.setenv("TRAINJOB_GCS_CHUNK_MIB", "lots")
    with pytest.raises(ValueError, match="TRAINJOB_GCS_CHUNK_MIB"):
        GCSStorage()


def test_gcs_missing_bucket_is_a_clear_error(gcs_emulator: object, tmp_path: Path) -> None:
    storage = GCSStorage(attempts=2)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "f").write_bytes(b"x")
    with pytest.raises((StorageError, FileNotFoundError), match="no-such-bucket"):
        storage.upload_dir(tmp_path / "src", "gs://no-such-bucket-xyz/p")


def test_retry_call_retries_transient_errors_then_succeeds() -> None:
    calls = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionError("reset")
        return "ok"

    assert (
        retry_call(
            flaky,
            attempts=5,
            is_retriable=lambda e: isinstance(e, ConnectionError),
            base_delay_s=0.001,
        )
        == "ok"
    )
    assert len(calls) == 3


def test_retry_call_gives_up_on_permanent_errors() -> None:
    calls = []

    def broken() -> None:
        calls.append(1)
        raise PermissionError("denied")

    with pytest.raises(PermissionError):
        retry_call(
            broken,
            attempts=5,
            is_retriable=lambda e: isinstance(e, ConnectionError),
            base_delay_s=0.001,
        )
    assert len(calls) == 1


def test_uri_helpers() -> None:
    assert split_gcs_uri("gs://b/a/b/") == ("b", "a/b")
    assert join_uri("gs://b/p/", "/run/", "ckpt") == "gs://b/p/run/ckpt"
    assert validate_storage_uri("file:///tmp/x/") == "/tmp/x"
    assert validate_storage_uri("gs://bucket/") == "gs://bucket"
    assert validate_storage_uri("s3://bucket/x/") == "s3://bucket/x"
    with pytest.raises(ValueError, match=r"https:// is not supported; use a local"):
        validate_storage_uri("https://bucket/x", field="RunConfig.storage_path")
    with pytest.raises(ValueError, match="no bucket"):
        validate_storage_uri("s3:///x")
    with pytest.raises(ValueError, match="no bucket"):
        validate_storage_uri("gs:///x")


class _FlakyGCSProxy:
    """An HTTP proxy in front of fake-gcs-server: answers the first ``fail`` object uploads with
    ``status``, forwards everything else, and counts uploads in flight (each held ``delay_s``),
    to exercise the retry and parallel-upload paths against the real emulator."""

    def __init__(self, upstream: str, fail: int, status: int, delay_s: float = 0.0) -> None:
        import http.client
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
        from urllib.parse import urlsplit

        self.failed = 0
        self.uploads = 0
        self.in_flight = 0
        self.max_in_flight = 0
        lock = threading.Lock()
        target = urlsplit(upstream)
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _reply(self, status_code: int, headers: list[tuple[str, str]], data: bytes) -> None:
                self.send_response(status_code)
                for key, value in headers:
                    if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _pass_through(self, body: bytes) -> None:
                conn = http.client.HTTPConnection(target.hostname, target.port, timeout=30)
                headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                self._reply(resp.status, resp.getheaders(), resp.read())
                conn.close()

            def _forward(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if not self.path.startswith("/upload/"):
                    self._pass_through(body)
                    return
                with lock:
                    proxy.uploads += 1
                    inject = proxy.failed < fail
                    proxy.failed += inject
                    proxy.in_flight += 1
                    proxy.max_in_flight = max(proxy.max_in_flight, proxy.in_flight)
                try:
                    time.sleep(delay_s)
                    if inject:
                        payload = b'{"error": {"code": %d, "message": "injected"}}' % status
                        self._reply(status, [("Content-Type", "application/json")], payload)
                    else:
                        self._pass_through(body)
                finally:
                    with lock:
                        proxy.in_flight -= 1

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _forward

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("status", [503, 429])
def test_gcs_transient_upload_errors_are_retried(
    gcs_emulator: object,
    gcs_bucket: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    status: int,
) -> None:
    proxy = _FlakyGCSProxy(gcs_emulator.url, fail=3, status=status)  # type: ignore[attr-defined]
    try:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.url)  # the production client path
        storage = GCSStorage(max_workers=2, attempts=6)
        src = tmp_path / "src"
        files = _make_tree(src)
        dest = f"gs://{gcs_bucket}/retry/checkpoint_000000"
        storage.upload_dir(src, dest)
        assert proxy.failed == 3  # the errors really happened...
        assert proxy.uploads > len(files)  # ...and the failed uploads were sent again
        storage.download_dir(dest, tmp_path / "out")
        for rel, data in files.items():
            assert (tmp_path / "out" / rel).read_bytes() == data
    finally:
        proxy.close()


def test_gcs_permanent_upload_error_is_not_retried(
    gcs_emulator: object, gcs_bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    proxy = _FlakyGCSProxy(gcs_emulator.url, fail=100, status=403)  # type: ignore[attr-defined]
    try:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.url)
        storage = GCSStorage(max_workers=1, attempts=6)
        src = tmp_path / "src"
        src.mkdir()
        (src / "model.pt").write_bytes(b"x" * 1000)
        with pytest.raises(StorageError, match=r"403|injected|Forbidden"):
            storage.upload_dir(src, f"gs://{gcs_bucket}/denied/checkpoint_000000")
        assert proxy.uploads == 1  # a 403 is final: no retries
    finally:
        proxy.close()


def test_gcs_files_of_a_folder_upload_in_parallel(
    gcs_emulator: object, gcs_bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    proxy = _FlakyGCSProxy(gcs_emulator.url, fail=0, status=503, delay_s=0.3)  # type: ignore[attr-defined]
    try:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.url)
        src = tmp_path / "src"
        src.mkdir()
        for i in range(8):
            (src / f"shard_{i}.bin").write_bytes(os.urandom(10_000))
        GCSStorage(max_workers=4).upload_dir(src, f"gs://{gcs_bucket}/par/checkpoint_000000")
        assert proxy.uploads == 8
        assert proxy.max_in_flight == 4  # max_workers uploads at once, never more
    finally:
        proxy.close()
