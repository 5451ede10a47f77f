"""Storage backends against real storage: a local folder and fake-gcs-server."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from trainer_runtime.storage import StorageError, get_storage, join_uri, validate_storage_uri
from trainer_runtime.storage.base import retry_call
from trainer_runtime.storage.factory import client_modules
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


def test_local_upload_and_marker_writes_are_fsynced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every stored file, every folder naming one, and a small write's folder reach fsync(2).

    Power loss cannot be simulated here, so the test records which paths the storage layer
    fsyncs (the only stand-in in this file): a commit marker must never outlive its files.
    """
    src = tmp_path / "src"
    expected = _make_tree(src)
    synced: list[Path] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        synced.append(Path(os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    storage = get_storage(str(tmp_path / "store"))
    dest = tmp_path / "store" / "checkpoint_000001"
    storage.upload_dir(src, str(dest))
    for rel in expected:
        # Files are flushed under their temporary name, before the rename that stores them.
        target = dest / rel
        assert any(
            p == target
            or (
                p.parent == target.parent
                and p.name.startswith(f".{target.name}.")
                and p.name.endswith(".storing")
            )
            for p in synced
        ), f"{rel} was stored without fsync"
        parent = (dest / rel).parent
        while parent != dest.parent:
            assert parent in synced, f"folder {parent} (names {rel}) was not fsynced"
            parent = parent.parent
    assert dest.parent in synced
    synced.clear()
    storage.write_bytes(str(dest / ".marker.json"), b"{}")
    assert dest in synced, "the folder of a renamed small write was not fsynced"
    synced.clear()
    storage.download_dir(str(dest), tmp_path / "restored")
    assert synced == [], "a restored copy is scratch space: no fsync expected"


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


# ------------------------------------------------------------------- S3 (moto) and pyarrow


def test_s3_fingerprints_are_etags_and_change_with_the_content(
    s3_server: object, tmp_path: Path
) -> None:
    """What the commit checks: each stored file's size and ETag, as listed later."""
    bucket = s3_server.new_bucket()  # type: ignore[attr-defined]
    storage = get_storage(f"s3://{bucket}")
    src = tmp_path / "src"
    _make_tree(src)
    dest = f"s3://{bucket}/run/checkpoint_000000"
    stats = storage.upload_dir(src, dest)
    listed = storage.list_stored(dest)
    assert listed == stats.stored  # the commit's check passes for an untouched folder
    assert all(f.fingerprint for f in listed.values())
    # Another writer replaces a file with different bytes of the same size: the fingerprint
    # (the ETag) changes although the size does not, so the commit would refuse it.
    storage.write_bytes(f"{dest}/optim/deep/more.txt", b"HELLO")
    after = storage.list_stored(dest)
    assert after["optim/deep/more.txt"].size == stats.stored["optim/deep/more.txt"].size
    assert after["optim/deep/more.txt"] != stats.stored["optim/deep/more.txt"]
    sizes = storage.list_stored(dest, fingerprints=False)  # restore: sizes only, no HEADs
    assert {k: v.size for k, v in sizes.items()} == {k: v.size for k, v in after.items()}


def test_s3_missing_bucket_is_a_permanent_error(s3_server: object, tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    storage = get_storage("s3://no-such-bucket-here/runs")
    with pytest.raises(StorageError) as info:
        storage.upload_dir(tmp_path, "s3://no-such-bucket-here/runs/c")
    assert info.value.permanent
    from trainer_runtime.storage.base import is_permanent_error

    assert is_permanent_error(info.value)


def test_transient_s3_errors_are_the_ones_ray_retries() -> None:
    from trainer_runtime.storage.pyarrow_fs import is_transient_pyarrow_error

    assert is_transient_pyarrow_error(OSError("AWS Error SLOW_DOWN during PutObject"))
    assert is_transient_pyarrow_error(OSError("AWS Error NETWORK_CONNECTION: curl"))
    assert not is_transient_pyarrow_error(OSError("AWS Error ACCESS_DENIED during PutObject"))
    assert not is_transient_pyarrow_error(FileNotFoundError("gone"))


def _fs_train(config: dict[str, object]) -> None:
    import json as _json
    import tempfile as _tempfile

    import trainer_runtime as tr

    start = 0
    if (ckpt := tr.get_checkpoint()) is not None:
        with ckpt.as_directory() as folder:
            start = _json.loads((Path(folder) / "s.json").read_text())["step"] + 1
    for step in range(start, int(config["steps"])):  # type: ignore[call-overload]
        folder = _tempfile.mkdtemp()
        (Path(folder) / "s.json").write_text(_json.dumps({"step": step}))
        tr.report(
            {"step": step},
            checkpoint=tr.Checkpoint.from_directory(folder),
            checkpoint_upload_mode=tr.CheckpointUploadMode.ASYNC,
        )


def test_a_run_on_a_custom_pyarrow_filesystem(s3_server: object, tmp_path: Path) -> None:
    """RunConfig(storage_filesystem=S3FileSystem, storage_path='bucket/runs'), as in Ray Train:
    paths are the filesystem's own; Result.filesystem and from_path(storage_filesystem=)."""
    import trainer_runtime as tr

    fs = s3_server.filesystem()  # type: ignore[attr-defined]
    bucket = s3_server.new_bucket()  # type: ignore[attr-defined]

    def fit(steps: int) -> tr.Result:
        return tr.DataParallelTrainer(
            _fs_train,
            train_loop_config={"steps": steps},
            scaling_config=tr.ScalingConfig(num_workers=0),
            run_config=tr.RunConfig(
                name="run",
                storage_path=f"{bucket}/runs",
                storage_filesystem=fs,
                checkpoint_config=tr.CheckpointConfig(num_to_keep=2),
            ),
        ).fit()

    result = fit(2)
    assert result.path == f"{bucket}/runs/run"
    assert result.filesystem is fs
    assert result.checkpoint is not None and result.checkpoint.filesystem is fs
    assert (
        repr(result.checkpoint)
        == f"Checkpoint(filesystem=s3, path={bucket}/runs/run/checkpoint_000001)"
    )
    assert fs.get_file_info(f"{bucket}/runs/run/checkpoint_000001/s.json").size > 0
    result = fit(4)  # a new driver resumes from step 1 on the same filesystem
    assert result.metrics == {"step": 3}
    again = tr.Result.from_path(f"{bucket}/runs/run", storage_filesystem=fs)
    assert [c.path for c, _ in again.best_checkpoints] == [
        f"{bucket}/runs/run/checkpoint_000002",
        f"{bucket}/runs/run/checkpoint_000003",
    ]
    with again.checkpoint.as_directory() as folder:  # type: ignore[union-attr]
        assert (Path(folder) / "s.json").read_text() == '{"step": 3}'


# -- local storage: taking over a source its caller deletes (consume_source) --------------------
def _inode(path: Path) -> int:
    return os.stat(path).st_ino


def _copy_mode() -> int:
    """The mode shutil.copyfile gives a new file in this process (0o666 less the umask)."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def test_local_consumed_source_is_linked_not_copied(tmp_path: Path) -> None:
    """A source the caller deletes afterwards is hard-linked: same data, no second copy, and
    the mode a copy would have. Without consume_source the same files are copied."""
    src = tmp_path / "src"
    files = _make_tree(src)
    os.chmod(src / "model.pt", 0o600)  # e.g. tempfile.mkstemp's mode
    storage = get_storage(str(tmp_path / "store"))
    linked = tmp_path / "store" / "linked"
    stats = storage.upload_dir(src, str(linked), consume_source=True)
    assert stats.files == len(files)
    for rel, data in files.items():
        assert (linked / rel).read_bytes() == data
        assert _inode(linked / rel) == _inode(src / rel), f"{rel} was copied, not linked"
    assert (linked / "model.pt").stat().st_mode & 0o7777 == _copy_mode()
    assert stats.stored == storage.list_stored(str(linked))

    copied = tmp_path / "store" / "copied"
    storage.upload_dir(src, str(copied))
    for rel in files:
        assert _inode(copied / rel) != _inode(src / rel), f"{rel} was linked without consent"


def test_local_consume_copies_what_outlives_the_source_folder(tmp_path: Path) -> None:
    """A file with another name (a hard link from elsewhere) or reached through a symlink
    lives on after the source folder is deleted: linking it would let a later write change
    the stored checkpoint, so it is copied."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "shared.bin").write_bytes(b"shared")
    (outside / "target.bin").write_bytes(b"target")
    src = tmp_path / "src"
    src.mkdir()
    os.link(outside / "shared.bin", src / "shared.bin")
    (src / "via_symlink.bin").symlink_to(outside / "target.bin")
    (src / "own.bin").write_bytes(b"own")
    dest = tmp_path / "store" / "c"
    get_storage(str(tmp_path / "store")).upload_dir(src, str(dest), consume_source=True)

    assert _inode(dest / "own.bin") == _inode(src / "own.bin")
    assert _inode(dest / "shared.bin") != _inode(outside / "shared.bin")
    assert not (dest / "via_symlink.bin").is_symlink()
    assert _inode(dest / "via_symlink.bin") != _inode(outside / "target.bin")
    (outside / "shared.bin").write_bytes(b"changed later")
    (outside / "target.bin").write_bytes(b"changed later")
    assert (dest / "shared.bin").read_bytes() == b"shared"
    assert (dest / "via_symlink.bin").read_bytes() == b"target"


def test_local_consume_replaces_a_file_left_by_a_failed_attempt(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "w.bin").write_bytes(b"new")
    dest = tmp_path / "store" / "c"
    dest.mkdir(parents=True)
    (dest / "w.bin").write_bytes(b"partial")
    get_storage(str(tmp_path / "store")).upload_dir(src, str(dest), consume_source=True)
    assert (dest / "w.bin").read_bytes() == b"new"
    assert _inode(dest / "w.bin") == _inode(src / "w.bin")


def test_local_consume_across_file_systems_copies(tmp_path: Path) -> None:
    """Hard links cannot cross file systems (EXDEV): the files are copied instead."""
    shm = Path("/dev/shm")
    if not shm.is_dir() or os.stat(shm).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("needs /dev/shm on a file system other than the test's temporary folder")
    src = Path(tempfile.mkdtemp(dir=shm))
    try:
        files = _make_tree(src)
        dest = tmp_path / "store" / "c"
        get_storage(str(tmp_path / "store")).upload_dir(src, str(dest), consume_source=True)
        for rel, data in files.items():
            assert (dest / rel).read_bytes() == data
            assert os.stat(dest / rel).st_dev != os.stat(src / rel).st_dev
    finally:
        shutil.rmtree(src, ignore_errors=True)


def test_local_consume_copies_a_file_whose_mode_cannot_be_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A linked file gets a copy's mode; where that fails (a file of another user: chmod
    raises EPERM, stood in for by a patched os.chmod since the tests may run as root), the
    link is undone and the file copied, which gives the mode."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "w.bin").write_bytes(b"data")
    os.chmod(src / "w.bin", 0o600)

    def refuse(path: object, mode: int, **kwargs: object) -> None:
        raise PermissionError(1, "Operation not permitted", str(path))

    monkeypatch.setattr(os, "chmod", refuse)
    dest = tmp_path / "store" / "c"
    get_storage(str(tmp_path / "store")).upload_dir(src, str(dest), consume_source=True)
    assert (dest / "w.bin").read_bytes() == b"data"
    assert _inode(dest / "w.bin") != _inode(src / "w.bin")
    assert (dest / "w.bin").stat().st_mode & 0o7777 == _copy_mode()


@pytest.mark.parametrize("consume", [True, False])
def test_local_upload_again_over_its_own_link(tmp_path: Path, consume: bool) -> None:
    """An attempt that linked a file and then failed leaves the source's second name in the
    destination; the next attempt at the same upload replaces it (linking again when it may)
    instead of copying the file onto itself."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "w.bin").write_bytes(b"data")
    dest = tmp_path / "store" / "c"
    storage = get_storage(str(tmp_path / "store"))
    storage.upload_dir(src, str(dest), consume_source=True)
    storage.upload_dir(src, str(dest), consume_source=consume)
    assert (dest / "w.bin").read_bytes() == b"data"
    assert (_inode(dest / "w.bin") == _inode(src / "w.bin")) is consume


def test_an_s3_uri_with_pyarrow_query_parameters(
    s3_server: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``s3://bucket/prefix?endpoint_override=...&region=...`` (as ``FileSystem.from_uri``
    takes it: MinIO, R2...) as ``storage_path`` and for ``Result.from_path``: as in Ray Train,
    the query configures the filesystem and paths are the paths on it. The environment's
    endpoint points nowhere here, so only the query's endpoint reaches the server."""
    import pyarrow.fs as pafs

    import trainer_runtime as tr
    from trainer_runtime.storage.factory import reset_storage_cache

    bucket = s3_server.new_bucket()  # type: ignore[attr-defined]
    url = s3_server.url  # type: ignore[attr-defined]
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    reset_storage_cache()
    host = url.removeprefix("http://")
    query = f"region=us-east-1&endpoint_override={host}&scheme=http"
    config = tr.RunConfig(name="run", storage_path=f"s3://{bucket}/runs?{query}")
    assert config.storage_path == f"{bucket}/runs"
    assert isinstance(config.storage_filesystem, pafs.S3FileSystem)
    assert config.storage_filesystem.region == "us-east-1"
    result = tr.DataParallelTrainer(
        _fs_train,
        train_loop_config={"steps": 2},
        scaling_config=tr.ScalingConfig(num_workers=0),
        run_config=config,
    ).fit()
    assert result.path == f"{bucket}/runs/run"
    assert result.checkpoint is not None and result.metrics == {"step": 1}
    fs = s3_server.filesystem()  # type: ignore[attr-defined]
    assert fs.get_file_info(f"{bucket}/runs/run/checkpoint_000001/s.json").size > 0
    again = tr.Result.from_path(f"s3://{bucket}/runs/run?{query}")
    assert again.checkpoint is not None and again.checkpoint.path == result.checkpoint.path
    assert again.metrics == {"step": 1}
    with pytest.raises(ValueError, match="storage_filesystem"):  # one way to name storage
        tr.RunConfig(storage_path=f"s3://{bucket}/runs?{query}", storage_filesystem=fs)


def test_workers_preload_the_client_library_of_the_storage() -> None:
    """What the controller adds to a worker group's background imports (``Preloader``)."""
    assert client_modules("gs://bucket/runs") == ("google.cloud.storage",)
    assert client_modules("s3://bucket/runs") == ("pyarrow.fs",)
    assert client_modules("/mnt/ckpt") == client_modules("file:///mnt/ckpt") == ()
    assert client_modules("bucket/runs", filesystem=object()) == ()  # already imported


def test_gcs_downloads_stream_plain_objects_and_decode_gzip_ones(
    gcs_bucket: str, tmp_path: Path
) -> None:
    """Plain objects stream in 4 MiB pieces (crc32c checked: a file over several pieces); an
    object stored gzip-encoded goes through google-cloud-storage's own download, decoded."""
    import gzip

    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage as gcs

    big = os.urandom(9 * 2**20 + 7)
    client = gcs.Client(project="test", credentials=AnonymousCredentials())
    bucket = client.bucket(gcs_bucket)
    bucket.blob("ck/big.bin").upload_from_string(big)
    zipped = bucket.blob("ck/text.txt")
    zipped.content_encoding = "gzip"
    zipped.upload_from_string(gzip.compress(b"hello " * 1000), content_type="text/plain")
    get_storage(f"gs://{gcs_bucket}/ck").download_dir(f"gs://{gcs_bucket}/ck", tmp_path)
    assert (tmp_path / "big.bin").read_bytes() == big
    assert (tmp_path / "text.txt").read_bytes() == b"hello " * 1000
