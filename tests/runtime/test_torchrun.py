"""Local mode under a real ``torchrun --nproc-per-node=2`` (gloo on CPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT
from tests.runtime.workloads import read_log
from trainer_runtime.checkpoint import COMMIT_MARKER

pytestmark = pytest.mark.slow  # a real torchrun of two processes


def _torchrun(storage: Path, out: Path, steps: int) -> None:
    out.mkdir(exist_ok=True)
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), OMP_NUM_THREADS="1")
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node=2",
            str(Path(__file__).with_name("torchrun_main.py")),
            str(storage),
            str(out),
            str(steps),
        ],
        env=env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]


def test_torchrun_two_processes_report_checkpoint_and_resume(tmp_path: Path) -> None:
    storage = tmp_path / "storage"
    first = tmp_path / "first"
    _torchrun(storage, first, steps=3)

    for rank in (0, 1):
        pg = json.loads((first / f"pg_{rank}.json").read_text())
        assert pg == {
            "sum": 3.0,
            "ddp": "DistributedDataParallel",
            "world": 2,
            "broadcast": {"from": 0},  # collective.broadcast_from_rank_zero under torchrun
        }
        reported = json.loads((first / f"reported_{rank}.json").read_text())
        assert reported == ["checkpoint_000001", "checkpoint_000002"]
        result = json.loads((first / f"result_{rank}.json").read_text())
        # Every rank's fit() returns rank 0's metrics and the committed checkpoint.
        assert result["metrics"] == {"step": 2, "loss": 1 / 3, "rank": 0}
        assert result["checkpoint"] == str(storage / "torchrun" / "checkpoint_000002")
    starts = sorted(
        (e["rank"], e["world_size"], e["local_rank"])
        for e in read_log(first / "log")
        if e["event"] == "start"
    )
    assert starts == [(0, 2, 0), (1, 2, 1)]
    ckpt = storage / "torchrun" / "checkpoint_000002"
    assert sorted(p.name for p in ckpt.iterdir()) == [COMMIT_MARKER, "rank_0.json", "rank_1.json"]
    assert sorted(p.name for p in (storage / "torchrun").iterdir()) == [
        ".trainjob_driver.json",  # which driver owns the run (fencing)
        "checkpoint_000001",
        "checkpoint_000002",
        "checkpoint_manifest.json",
    ]

    second = tmp_path / "second"
    _torchrun(storage, second, steps=5)
    starts = sorted(
        (e["rank"], e["start"]) for e in read_log(second / "log") if e["event"] == "start"
    )
    assert starts == [(0, 3), (1, 3)]  # both ranks resumed after step 2
    result = json.loads((second / "result_1.json").read_text())
    assert result["metrics"]["step"] == 4
    assert result["checkpoint"].endswith("checkpoint_000004")
