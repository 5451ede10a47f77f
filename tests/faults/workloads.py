"""Train functions and a run-folder checker for the fault suite.

Every checkpoint of :func:`integrity_train` holds, per rank, ``files`` files whose bytes are
a pure function of (step, rank, file index, size): :func:`check_run` can tell a file of one
round from a file of another, and so finds torn, partial and mixed checkpoints byte for byte.
Ray workers import this module by name (``tests.faults.workloads``).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import trainer_runtime as tr
from trainer_runtime import Checkpoint, Result
from trainer_runtime.checkpoint import COMMIT_MARKER
from trainer_runtime.checkpoint_manager import MANIFEST_FILE
from trainer_runtime.storage import get_storage, join_uri

_SHARD = re.compile(r"^rank(\d+)_(\d+)\.bin$")


def payload(step: int, rank: int, index: int, size: int) -> bytes:
    """The bytes of file ``index`` of ``rank`` in the checkpoint of ``step``."""
    block = hashlib.sha256(f"{step}/{rank}/{index}".encode()).digest()
    return (block * (size // len(block) + 1))[:size]


def write_checkpoint(folder: Path, step: int, rank: int, files: int, size: int) -> None:
    """Write one rank's files (and rank 0's ``state.json``) of the checkpoint of ``step``."""
    folder.mkdir(parents=True, exist_ok=True)
    for index in range(files):
        (folder / f"rank{rank}_{index}.bin").write_bytes(payload(step, rank, index, size))
    if rank == 0:
        (folder / "state.json").write_text(json.dumps({"step": step}))


def log_event(config: dict[str, Any], **fields: Any) -> None:
    """Append one JSON line to ``config["log"]`` (when set)."""
    if config.get("log"):
        with open(config["log"], "a") as fh:
            fh.write(json.dumps({"pid": os.getpid(), "time": time.time(), **fields}) + "\n")


def read_events(path: str | Path) -> list[dict[str, Any]]:
    """The lines :func:`log_event` wrote."""
    p = Path(path)
    return [json.loads(line) for line in p.read_text().splitlines() if line] if p.exists() else []


def integrity_train(config: dict[str, Any]) -> None:
    """A resumable loop: each step writes a checkpoint and reports it.

    config: ``steps``, ``files`` and ``size`` (per rank), ``mode`` (upload mode),
    ``sleep`` (seconds per step), ``losses`` (the ``loss`` metric per step), ``log``,
    ``fail`` (``{"step", "rank", "attempts"}``: raise there), ``misuse`` (``"delete"``:
    delete the folder right after an ASYNC report; ``"reuse"``: report one folder every
    step).
    """
    ctx = tr.get_context()
    rank = ctx.get_world_rank()
    start = 0
    resumed = tr.get_checkpoint()
    if resumed is not None:
        with resumed.as_directory() as folder:
            step = json.loads((Path(folder) / "state.json").read_text())["step"]
            for index in range(int(config.get("files", 1))):
                data = (Path(folder) / f"rank{rank}_{index}.bin").read_bytes()
                if data != payload(step, rank, index, len(data)):
                    raise AssertionError(f"resumed from a torn checkpoint {resumed.path}")
        start = step + 1
    log_event(config, event="start", rank=rank, attempt=ctx.attempt, start=start)
    files, size = int(config.get("files", 1)), int(config.get("size", 1024))
    reused = Path(tempfile.mkdtemp(prefix="reused_"))
    for step in range(start, int(config["steps"])):
        time.sleep(float(config.get("sleep", 0.0)))
        fail = config.get("fail")
        if (
            fail
            and (step, rank) == (fail["step"], fail["rank"])
            and ctx.attempt in fail.get("attempts", [0])
        ):
            raise RuntimeError(f"injected failure at step {step}")
        misuse = config.get("misuse")
        folder = reused if misuse == "reuse" else Path(tempfile.mkdtemp(prefix="ckpt_"))
        write_checkpoint(folder, step, rank, files, size)
        metrics: dict[str, Any] = {"step": step}
        if "losses" in config:
            metrics["loss"] = config["losses"][step]
        tr.report(
            metrics,
            checkpoint=Checkpoint.from_directory(folder),
            checkpoint_upload_mode=config.get("mode", "sync"),
            delete_local_checkpoint_after_upload=False if misuse == "reuse" else None,
        )
        log_event(config, event="reported", rank=rank, step=step)
        if misuse == "delete":
            shutil.rmtree(folder, ignore_errors=True)


def check_run(run_path: str, world_size: int | None = None) -> Result:
    """Check a run folder against the commit invariant; returns ``Result.from_path``.

    Every listed checkpoint has a commit marker naming it, holds exactly the files the
    marker lists with the sizes it lists, and every data file holds the bytes written for
    that checkpoint's step (no file of another round, none missing for any rank). The
    manifest, when present, is strict JSON.
    """
    storage = get_storage(run_path)
    result = Result.from_path(run_path)
    for record in result.checkpoints:
        marker = json.loads(storage.read_bytes(join_uri(record.path, COMMIT_MARKER)))
        assert marker.get("name") == record.name and not marker.get("tombstone"), marker
        stored = {
            rel: f for rel, f in storage.list_stored(record.path).items() if rel != COMMIT_MARKER
        }
        listed = marker["files"]
        assert set(stored) == set(listed), (record.path, sorted(stored), sorted(listed))
        assert all(stored[rel].size == listed[rel][0] for rel in stored), record.path
        step = record.metrics["step"]
        ranks = set()
        for rel in stored:
            data = storage.read_bytes(join_uri(record.path, rel))
            if rel == "state.json":
                assert json.loads(data) == {"step": step}, (record.path, data)
                continue
            match = _SHARD.match(rel)
            assert match, f"unexpected file {rel} in {record.path}"
            rank, index = int(match.group(1)), int(match.group(2))
            ranks.add(rank)
            assert data == payload(step, rank, index, len(data)), f"{record.path}/{rel} is torn"
        assert "state.json" in stored, record.path
        if world_size is not None:
            assert ranks == set(range(world_size)), (record.path, ranks)
    if storage.exists(join_uri(run_path, MANIFEST_FILE)):
        raw = storage.read_bytes(join_uri(run_path, MANIFEST_FILE))
        json.loads(raw, parse_constant=_refuse_non_json)
    return result


def _refuse_non_json(token: str) -> Any:
    raise AssertionError(f"the manifest holds {token}, which is not JSON")


def shared_names_train(config: dict[str, Any]) -> None:
    """Ray Train's own tests' checkpoint shapes, in three reports:

    0. every rank writes ``shard_<rank>.bin`` and an identical ``checkpoint.pkl`` into its
       own folder (several ranks storing one name);
    1. every rank writes its shard into one folder on this machine (``config["shared"]``) and
       reports that folder (another rank's shard appears after a rank's ``report()``);
    2. every rank reports an empty folder (a metrics-only checkpoint).
    """
    rank = tr.get_context().get_world_rank()
    mode = tr.CheckpointUploadMode[config.get("mode", "SYNC")]
    own = Path(tempfile.mkdtemp())
    (own / f"shard_{rank}.bin").write_bytes(payload(0, rank, 0, 4096))
    (own / "checkpoint.pkl").write_bytes(b"shared state, the same on every rank" * 100)
    tr.report({"step": 0}, checkpoint=Checkpoint.from_directory(own), checkpoint_upload_mode=mode)
    shared = Path(config["shared"])
    shared.mkdir(parents=True, exist_ok=True)
    # Written aside and renamed in, so a rank listing the folder at its report() sees another
    # rank's shard whole or not at all (a file half-written while listed is, rightly, refused
    # as "changed while it was being uploaded").
    aside = own.parent / f"{own.name}.shard_{rank}.bin"
    aside.write_bytes(payload(1, rank, 0, 4096))
    os.replace(aside, shared / f"shard_{rank}.bin")
    tr.report(  # the other ranks still store from it: not deleted after this rank's upload
        {"step": 1},
        checkpoint=Checkpoint.from_directory(shared),
        checkpoint_upload_mode=mode,
        delete_local_checkpoint_after_upload=False,
    )
    tr.report(
        {"step": 2},
        checkpoint=Checkpoint.from_directory(tempfile.mkdtemp()),
        checkpoint_upload_mode=mode,
    )
