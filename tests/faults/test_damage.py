"""A damaged or hand-edited run folder degrades to "resume from the newest checkpoint that
verifies", with a warning naming what was skipped; it never crashes the run."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest

from tests.faults.workloads import check_run, integrity_train, read_events
from trainer_runtime import DataParallelTrainer, Result, RunConfig, ScalingConfig
from trainer_runtime.checkpoint import COMMIT_MARKER
from trainer_runtime.checkpoint_manager import MANIFEST_FILE


def _fit(storage: Path, steps: int, log: Path) -> Result:
    return DataParallelTrainer(
        integrity_train,
        train_loop_config={"steps": steps, "files": 2, "size": 4096, "log": str(log)},
        scaling_config=ScalingConfig(num_workers=0),
        run_config=RunConfig(name="run", storage_path=str(storage)),
    ).fit()


def _resumed_from(log: Path) -> int:
    return [e for e in read_events(log) if e["event"] == "start"][-1]["start"]


def _damage(run: Path, how: str) -> None:
    latest = run / "checkpoint_000002"
    if how == "latest folder removed":
        shutil.rmtree(latest)
    elif how == "latest marker removed":
        (latest / COMMIT_MARKER).unlink()
    elif how == "latest marker truncated":
        (latest / COMMIT_MARKER).write_text('{"name": "checkpoint_0')
    elif how == "a file of the latest removed":
        (latest / "rank0_1.bin").unlink()
    elif how == "a file of the latest truncated":
        (latest / "rank0_0.bin").write_bytes(b"short")
    elif how == "marker copied from another checkpoint":
        shutil.copy(run / "checkpoint_000001" / COMMIT_MARKER, latest / COMMIT_MARKER)
    else:
        raise AssertionError(how)


@pytest.mark.parametrize(
    "how",
    [
        "latest folder removed",
        "latest marker removed",
        "latest marker truncated",
        "a file of the latest removed",
        "a file of the latest truncated",
        "marker copied from another checkpoint",
    ],
)
def test_a_damaged_latest_checkpoint_is_skipped_and_the_run_resumes_from_the_one_before(
    tmp_path: Path, how: str, caplog: pytest.LogCaptureFixture
) -> None:
    log = tmp_path / "log"
    _fit(tmp_path, 3, log)
    run = tmp_path / "run"
    _damage(run, how)
    before = Result.from_path(run)  # reading never crashes either
    assert [r.name for r in before.checkpoints] == ["checkpoint_000000", "checkpoint_000001"]

    with caplog.at_level(logging.WARNING, logger="trainer_runtime"):
        result = _fit(tmp_path, 5, log)
    assert _resumed_from(log) == 2  # from checkpoint_000001 (step 1)
    assert "checkpoint_000002" in caplog.text  # the warning names what was skipped
    assert result.checkpoint is not None and result.checkpoint.path.endswith("checkpoint_000005")
    check_run(str(run), 1)


@pytest.mark.parametrize(
    "content", [b'{"version": 2, "checkpoints": [{"na', b"", b"[1, 2]", b"\xff\xfe binary"]
)
def test_an_unreadable_manifest_is_rebuilt_from_the_markers(
    tmp_path: Path, content: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    log = tmp_path / "log"
    _fit(tmp_path, 3, log)
    run = tmp_path / "run"
    (run / MANIFEST_FILE).write_bytes(content)
    assert [r.name for r in Result.from_path(run).checkpoints][-1] == "checkpoint_000002"
    with caplog.at_level(logging.WARNING, logger="trainer_runtime"):
        _fit(tmp_path, 4, log)
    assert _resumed_from(log) == 3
    assert "manifest" in caplog.text
    manifest = json.loads((run / MANIFEST_FILE).read_text())  # repaired
    assert manifest["latest"] == "checkpoint_000003"
    check_run(str(run), 1)


def test_a_folder_in_the_manifests_place_does_not_brick_the_run(tmp_path: Path) -> None:
    log = tmp_path / "log"
    _fit(tmp_path, 2, log)
    run = tmp_path / "run"
    (run / MANIFEST_FILE).unlink()
    (run / MANIFEST_FILE).mkdir()
    assert Result.from_path(run).checkpoint is not None
    # The driver cannot write its manifest there: the run fails with the path named, and
    # nothing committed is lost.
    with pytest.raises(Exception, match=MANIFEST_FILE):
        _fit(tmp_path, 3, log)
    shutil.rmtree(run / MANIFEST_FILE)
    _fit(tmp_path, 4, log)
    check_run(str(run), 1)


def test_result_from_path_takes_a_path_and_says_when_there_is_no_run(tmp_path: Path) -> None:
    # A missing folder: Ray Train's sentence first, then ours.
    with pytest.raises(RuntimeError, match=r"^Experiment folder .*nothing-here doesn't exist\."):
        Result.from_path(tmp_path / "nothing-here")
    (tmp_path / "empty").mkdir()
    with pytest.raises(RuntimeError, match="no run found"):
        Result.from_path(tmp_path / "empty")
    _fit(tmp_path, 1, tmp_path / "log")
    assert Result.from_path(tmp_path / "run").checkpoint is not None
