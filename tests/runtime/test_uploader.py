"""The background uploader: FIFO order, backpressure, errors surfaced later."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from trainer_runtime._uploader import AsyncUploader, UploadJob
from trainer_runtime.errors import CheckpointUploadError
from trainer_runtime.storage import TransferStats
from trainer_runtime.storage.local import LocalStorage


class SlowStorage(LocalStorage):
    """Real local storage whose uploads wait for a gate (to observe queueing)."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.fail_on: set[str] = set()

    def upload_dir(self, local_dir: Path, dest_uri: str, **kwargs: Any) -> TransferStats:
        self.gate.wait(10)
        if Path(dest_uri).name in self.fail_on:
            raise OSError(f"disk full writing {dest_uri}")
        return super().upload_dir(local_dir, dest_uri, **kwargs)


def _job(tmp: Path, i: int, delete: bool = True) -> UploadJob:
    src = tmp / f"src{i}"
    src.mkdir()
    (src / "w").write_text(str(i))
    return UploadJob(i, src, str(tmp / "dest" / f"c{i}"), delete)


def test_fifo_order_backpressure_and_local_deletion(tmp_path: Path) -> None:
    storage = SlowStorage()
    done: list[int] = []
    up = AsyncUploader(storage, lambda j, s: done.append(j.round), lambda j, e: None, max_pending=2)
    up.submit(_job(tmp_path, 0))  # picked up by the thread, waiting on the gate
    time.sleep(0.1)
    up.submit(_job(tmp_path, 1))
    up.submit(_job(tmp_path, 2))  # queue holds 1 and 2: full
    blocked = threading.Event()

    def submit_third() -> None:
        up.submit(_job(tmp_path, 3))
        blocked.set()

    t = threading.Thread(target=submit_third)
    t.start()
    assert not blocked.wait(0.3), "a full queue must block submit (backpressure)"
    storage.gate.set()
    t.join(10)
    up.drain()
    assert done == [0, 1, 2, 3]
    assert up.blocked_seconds > 0.2
    for i in range(4):
        assert (tmp_path / "dest" / f"c{i}" / "w").read_text() == str(i)
        assert not (tmp_path / f"src{i}").exists()  # deleted after upload
    up.close()


def test_failure_is_raised_later_and_later_jobs_are_dropped(tmp_path: Path) -> None:
    storage = SlowStorage()
    storage.gate.set()
    storage.fail_on = {"c1"}
    done: list[int] = []
    failed: list[tuple[int, Any]] = []
    up = AsyncUploader(
        storage, lambda j, s: done.append(j.round), lambda j, e: failed.append((j.round, e))
    )
    up.submit(_job(tmp_path, 0))
    up.submit(_job(tmp_path, 1))
    with pytest.raises(CheckpointUploadError, match="disk full"):
        up.drain()
    with pytest.raises(CheckpointUploadError):
        up.submit(_job(tmp_path, 2))
    assert done == [0]
    assert [r for r, _ in failed] == [1]
    assert (tmp_path / "src1").exists()  # the local copy of a failed upload is kept
    up.close()


class PriorityRecordingStorage(LocalStorage):
    """Real local storage that records the nice value of the uploading thread and of a
    thread it starts (as the GCS and pyarrow backends start their file pools)."""

    def __init__(self) -> None:
        self.nice: list[int] = []

    def upload_dir(self, local_dir: Path, dest_uri: str, **kwargs: Any) -> TransferStats:
        self.nice.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
        pool_thread = threading.Thread(
            target=lambda: self.nice.append(
                os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
            )
        )
        pool_thread.start()
        pool_thread.join()
        return super().upload_dir(local_dir, dest_uri, **kwargs)


@pytest.mark.skipif(not hasattr(os, "setpriority"), reason="no per-thread priority")
@pytest.mark.parametrize(("env", "added"), [(None, 10), ("3", 3), ("0", 0)])
def test_uploads_run_at_a_lower_cpu_priority_than_the_training_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, env: str | None, added: int
) -> None:
    """The uploader thread (and the threads it starts) yield the core to the training step:
    TRAINJOB_UPLOAD_NICE levels lower (default 10, capped at 19); the caller is untouched."""
    if env is None:
        monkeypatch.delenv("TRAINJOB_UPLOAD_NICE", raising=False)
    else:
        monkeypatch.setenv("TRAINJOB_UPLOAD_NICE", env)
    mine = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    storage = PriorityRecordingStorage()
    up = AsyncUploader(storage, lambda j, s: None, lambda j, e: None)
    up.submit(_job(tmp_path, 0))
    up.drain()
    up.close()
    expected = min(19, mine + added)
    assert storage.nice == [expected, expected]
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == mine
    assert (tmp_path / "dest" / "c0" / "w").read_text() == "0"
