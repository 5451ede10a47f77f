"""``Checkpoint``: metadata, copies without the commit marker, and re-reporting a checkpoint."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from trainer_runtime import Checkpoint
from trainer_runtime._events import Event, ReportEvent, UploadDoneEvent
from trainer_runtime._session import TrainSession
from trainer_runtime.checkpoint import COMMIT_MARKER, METADATA_FILE
from trainer_runtime.checkpoint_manager import CheckpointRecord
from trainer_runtime.context import TrainContext
from trainer_runtime.storage import get_storage, join_uri


def _committed(storage_path: str, name: str = "checkpoint_000000") -> Checkpoint:
    """A committed checkpoint in storage: files, a nested file, and its commit marker."""
    path = join_uri(storage_path, "run", name)
    storage = get_storage(path)
    storage.write_bytes(join_uri(path, "model.bin"), b"weights")
    storage.write_bytes(join_uri(path, "sub", "opt.bin"), b"optimizer")
    record = CheckpointRecord(name, path, 0, {"loss": 1.0})
    storage.write_bytes(join_uri(path, COMMIT_MARKER), json.dumps(record.to_json()).encode())
    return Checkpoint(path)


def _files(folder: str | Path) -> list[str]:
    root = Path(folder)
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def test_metadata_round_trip_and_merge(storage_path: str) -> None:
    ckpt = _committed(storage_path)
    assert ckpt.get_metadata() == {}
    ckpt.set_metadata({"epoch": 3, "tags": ["a"]})
    assert ckpt.get_metadata() == {"epoch": 3, "tags": ["a"]}
    ckpt.update_metadata({"epoch": 4, "lr": 0.1})
    assert ckpt.get_metadata() == {"epoch": 4, "tags": ["a"], "lr": 0.1}
    ckpt.set_metadata({"only": True})  # replaces
    assert ckpt.get_metadata() == {"only": True}
    with pytest.raises(TypeError, match="JSON-serialisable"):
        ckpt.set_metadata({"f": open})
    assert ckpt.get_metadata() == {"only": True}


def test_to_directory_copies_everything_but_the_commit_marker(
    storage_path: str, tmp_path: Path
) -> None:
    ckpt = _committed(storage_path)
    ckpt.set_metadata({"epoch": 1})
    target = ckpt.to_directory(tmp_path / "copy")
    assert target == str(tmp_path / "copy")
    assert _files(target) == [METADATA_FILE, "model.bin", "sub/opt.bin"]
    assert (Path(target) / "sub" / "opt.bin").read_bytes() == b"optimizer"
    # The default target is a new temporary folder.
    fresh = ckpt.to_directory()
    try:
        assert _files(fresh) == [METADATA_FILE, "model.bin", "sub/opt.bin"]
    finally:
        shutil.rmtree(fresh)
    # The checkpoint itself still has its marker.
    assert get_storage(ckpt.path).exists(join_uri(ckpt.path, COMMIT_MARKER))
    with pytest.raises(FileNotFoundError):
        Checkpoint(join_uri(storage_path, "run", "missing")).to_directory(tmp_path / "none")


def test_as_directory_gives_a_local_folder(storage_path: str) -> None:
    ckpt = _committed(storage_path)
    with ckpt.as_directory() as folder:
        assert (Path(folder) / "model.bin").read_bytes() == b"weights"
        if ckpt.is_local:
            assert folder == ckpt.path  # the checkpoint itself, no copy
        else:
            assert COMMIT_MARKER not in _files(folder)  # a temporary download
    if not ckpt.is_local:
        assert not Path(folder).exists()  # removed afterwards


def _session(storage_path: str, events: list[Event]) -> TrainSession:
    context = TrainContext(0, 1, 0, 1, 0, "run", storage_path)
    return TrainSession(context, events.append, None, round_offset=5)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_reported_folder_holding_a_marker_is_uploaded_without_it(
    storage_path: str, tmp_path: Path, mode: str
) -> None:
    """No controller here commits anything: what lands in storage is the upload alone."""
    source = tmp_path / "scratch"
    shutil.copytree(_committed(str(tmp_path / "elsewhere")).path, source)  # marker included
    events: list[Event] = []
    session = _session(storage_path, events)
    session.report({"step": 5}, checkpoint=Checkpoint(source), checkpoint_upload_mode=mode)
    session.finish(None)
    dest = join_uri(storage_path, "run", "checkpoint_000005")
    assert any(isinstance(e, UploadDoneEvent) and e.uri == dest for e in events)
    storage = get_storage(dest)
    assert storage.list_files(dest) == ["model.bin", "sub/opt.bin"]  # not committed yet
    assert (source / COMMIT_MARKER).exists()  # the reported folder is left as it was


def test_reporting_a_committed_checkpoint_again_never_deletes_it(tmp_path: Path) -> None:
    storage_path = str(tmp_path / "storage")
    committed = _committed(storage_path)
    events: list[Event] = []
    session = _session(storage_path, events)
    # ASYNC deletes the local folder after upload by default: never a committed checkpoint.
    session.report({"step": 5}, checkpoint=committed, checkpoint_upload_mode="async")
    session.finish(None)
    assert _files(committed.path) == [COMMIT_MARKER, "model.bin", "sub/opt.bin"]
    report = next(e for e in events if isinstance(e, ReportEvent))
    assert report.checkpoint_uri == join_uri(storage_path, "run", "checkpoint_000005")
    assert _files(report.checkpoint_uri) == ["model.bin", "sub/opt.bin"]


def test_repr_is_ray_trains(tmp_path: Path) -> None:
    assert repr(Checkpoint(tmp_path)) == f"Checkpoint(filesystem=local, path={tmp_path})"
    assert repr(Checkpoint("gs://b/run/c")) == "Checkpoint(filesystem=gcs, path=gs://b/run/c)"


def test_as_directory_is_downloaded_once_per_machine_and_shared(
    gcs_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As Ray Train's: whoever opens a checkpoint in storage while another process of the
    machine has it open reads the same download; the last to leave deletes it; a checkpoint
    written again is downloaded again, and privately while the old copy is still read."""
    ckpt = _committed(f"gs://{gcs_bucket}/runs")
    storage = get_storage(ckpt.path)
    downloads: list[Path] = []
    real_download = type(storage).download_dir

    def counting(self: object, src: str, local: Path) -> object:
        downloads.append(Path(local))
        return real_download(self, src, local)  # type: ignore[arg-type]

    monkeypatch.setattr(type(storage), "download_dir", counting)
    # Another handle on the same path (as each rank builds its own): one download between them.
    with ckpt.as_directory() as first, Checkpoint(ckpt.path).as_directory() as second:
        assert first == second and len(downloads) == 1
        assert _files(first) == ["model.bin", "sub/opt.bin"]
        # The checkpoint written again while the copy is read: a private, fresh download.
        storage.write_bytes(join_uri(ckpt.path, "model.bin"), b"new weights")
        with ckpt.as_directory() as third:
            assert third != first and len(downloads) == 2
            assert (Path(third) / "model.bin").read_bytes() == b"new weights"
        assert not Path(third).exists()
        assert (Path(first) / "model.bin").read_bytes() == b"weights"  # left to its readers
    assert not Path(first).exists()
    # Nobody reads it now: the next opening downloads the new content into the shared folder.
    with ckpt.as_directory() as again:
        assert again == first and len(downloads) == 3
        assert (Path(again) / "model.bin").read_bytes() == b"new weights"
    # A reader that died (its file left behind, its lock gone) does not keep the folder.
    readers = Path(first + ".readers")
    with ckpt.as_directory():
        (readers / "999999-dead").touch()
    assert not Path(first).exists() and not readers.exists()
