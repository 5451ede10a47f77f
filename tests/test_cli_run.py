"""``trainjob run`` end to end, as a user runs it (a subprocess from the project root)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import REPO_ROOT
from trainer_runtime.checkpoint import COMMIT_MARKER

QUICKSTART = REPO_ROOT / "examples" / "quickstart.yaml"
#: the output of `make demo` that the README and the docs show
DEMO_CAPTURE = REPO_ROOT / "docs" / "snippets" / "make-demo.txt"


def _shapes(output: str) -> set[str]:
    """The lines of ``output`` with every path and number replaced, whitespace collapsed."""
    shapes = set()
    for line in output.splitlines():
        line = re.sub(r"\S*/\S*", "PATH", line)
        line = re.sub(r"\d+(\.\d+)?", "N", line)
        shapes.add(" ".join(line.replace("[", "[ ").split()))
    return shapes


def failing_train(config: dict[str, Any]) -> None:
    """A train function with a bug (used as an entrypoint below)."""
    import trainer_runtime as tr

    tr.report({"step": 0})
    raise ZeroDivisionError("the user's bug")


def _trainjob(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "RANK"))}
    env["RAY_AUTH_MODE"] = "disabled"
    return subprocess.run(
        [sys.executable, "-m", "trainjob_operator.cli", *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _manifest(tmp_path: Path, **spec_updates: Any) -> Path:
    doc = yaml.safe_load(QUICKSTART.read_text())
    doc["spec"]["config"]["epochs"] = 2
    doc["spec"]["storage"]["path"] = str(tmp_path / "storage")
    for key, value in spec_updates.items():
        doc["spec"][key] = value
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.ray
def test_quickstart_runs_on_embedded_ray_with_validation(tmp_path: Path) -> None:
    out = tmp_path / "status.json"
    proc = _trainjob("run", str(_manifest(tmp_path)), "--output", str(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Running: 2 worker(s) started" in proc.stdout
    assert "checkpoint_000001 validated: val_loss=" in proc.stdout
    assert "] Succeeded: step 1, 2 checkpoint(s) (2 validated), best " in proc.stdout
    # Output to a pipe: plain lines, no live line; the workers' output only in the log file.
    assert "\r" not in proc.stdout and "\x1b" not in proc.stdout
    assert "pid=" not in proc.stdout + proc.stderr
    assert re.search(r"^Ray worker logs: \S+/trainjob-workers.log ", proc.stdout, re.M)
    # The capture of `make demo` shown in the README and the docs is what it prints now, up to
    # its numbers and paths (the run's progress lines; the status YAML is written to --output).
    capture = DEMO_CAPTURE.read_text().split("\n---\n")[0]
    assert _shapes(capture) <= _shapes(proc.stdout), _shapes(capture) - _shapes(proc.stdout)
    status = json.loads(out.read_text())["status"]
    assert status["phase"] == "Succeeded"
    assert {c["type"]: c["status"] for c in status["conditions"]} == {
        "Created": "True",
        "Running": "False",
        "Succeeded": "True",
    }
    assert status["workers"] == {"ready": 2, "desired": 2}
    assert status["progress"]["step"] == 1  # epochs 0 and 1
    assert status["validations"] == {"pending": 0, "running": 0, "done": 2, "failed": 0}
    assert "val_loss" in status["bestCheckpoint"]["metrics"]
    assert status["bestCheckpoint"]["score"] == status["bestCheckpoint"]["metrics"]["val_loss"]
    run = tmp_path / "storage" / "quickstart"
    assert status["latestCheckpoint"]["path"] == str(run / "checkpoint_000001")
    assert (run / "checkpoint_manifest.json").exists()


@pytest.mark.ray
def test_datasets_built_with_rows_in_the_object_store_reach_the_workers(tmp_path: Path) -> None:
    """spec.data with the quickstart's ``build_datasets`` (``ray.data.from_items``: its rows go
    to Ray's object store as the dataset is built): ``trainjob run`` starts its Ray before it
    calls the datasets function (before, the function started a Ray of its own and the run
    failed with "Maybe you called ray.init twice"), and the workers train on the rows that
    Ray Data's ``map_batches`` tagged on the local node."""
    out = tmp_path / "status.json"
    manifest = _manifest(
        tmp_path,
        entrypoint="examples.quickstart.train:train_func_on_datasets",
        data={"datasets": "examples.quickstart.train:build_datasets"},
        checkpoint={"uploadMode": "async", "numToKeep": 2},
    )
    doc = yaml.safe_load(manifest.read_text())
    del doc["spec"]["validation"]
    doc["spec"]["config"].update({"epochs": 1, "samples": 2048})
    manifest.write_text(yaml.safe_dump(doc))
    proc = _trainjob("run", str(manifest), "--output", str(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    status = json.loads(out.read_text())["status"]
    assert status["phase"] == "Succeeded" and status["progress"]["step"] == 0, status
    metrics = status["latestCheckpoint"]["metrics"]
    assert len(metrics["ingest_nodes"]) == 1 and metrics["data_pool_nodes"] == [], metrics


@pytest.mark.slow  # trainjob run in a child process
def test_local_mode_override_runs_in_one_process(tmp_path: Path) -> None:
    proc = _trainjob("run", str(_manifest(tmp_path)), "--num-workers", "0")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "in this process" in proc.stdout
    status = yaml.safe_load(proc.stdout.split("---\n", 1)[1])["status"]
    assert status["phase"] == "Succeeded"
    assert status["validations"]["done"] == 2  # validation ran in a background thread


@pytest.mark.parametrize(
    "num_workers", ["0", pytest.param("2", marks=pytest.mark.ray, id="ray-workers")]
)
@pytest.mark.slow  # trainjob run in a child process
def test_training_failure_exits_1_with_failed_status(tmp_path: Path, num_workers: str) -> None:
    manifest = _manifest(tmp_path, entrypoint="tests.test_cli_run:failing_train")
    out = str(tmp_path / "s.yaml")
    proc = _trainjob("run", str(manifest), "--num-workers", num_workers, "-o", out)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    status = yaml.safe_load((tmp_path / "s.yaml").read_text())["status"]
    assert status["phase"] == "Failed"
    assert "ZeroDivisionError: the user's bug" in status["message"]
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "TrainingFailed" and "the user's bug" in failed["message"]
    assert "the user's bug" in proc.stderr
    assert re.search(r"\] Failed: .*ZeroDivisionError: the user's bug", proc.stdout)
    if num_workers != "0":  # the worker's traceback reaches the user without --verbose
        assert 'raise ZeroDivisionError("the user\'s bug")' in proc.stderr
        assert "worker group failed (1): the train function failed on rank" in proc.stdout
        assert "(restarting from the latest checkpoint)" in proc.stdout  # maxFailures: 1
        assert re.search(r"^Ray worker logs: \S+/trainjob-workers.log$", proc.stderr, re.M)
        assert "pid=" not in proc.stdout + proc.stderr


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda text: text.replace("scaling:", "scaling: [", 1), "YAML syntax error"),
        (
            lambda text: text.replace("framework: torch", "framework: torch\n  colour: blue"),
            "spec.colour",
        ),
        (lambda text: text.replace("numWorkers: 2", "numWorkers: two"), "spec.scaling.numWorkers"),
        (
            lambda text: text.replace(
                "examples.quickstart.train:train_func", "examples.nowhere:train_func"
            ),
            "spec.entrypoint: cannot import module 'examples.nowhere'",
        ),
        (
            lambda text: text.replace(
                "examples.quickstart.train:validate_func", "examples.quickstart.train:no_such_fn"
            ),
            "spec.validation.entrypoint: module 'examples.quickstart.train' has no attribute",
        ),
    ],
)
@pytest.mark.slow  # trainjob run in a child process
def test_bad_manifests_exit_2_with_one_clear_line_and_start_nothing(
    tmp_path: Path, mutate: Any, expected: str
) -> None:
    manifest = _manifest(tmp_path)
    manifest.write_text(mutate(manifest.read_text()))
    proc = _trainjob("run", str(manifest), timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert expected in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert not (tmp_path / "storage").exists()  # nothing half-started


@pytest.mark.ray
def test_a_trainjob_stores_its_checkpoints_in_s3(tmp_path: Path, s3_server: Any) -> None:
    """``spec.storage.path: s3://bucket/prefix`` (moto's S3 server; the endpoint and the
    credentials come from the AWS_* environment, as a pod gets them from ``spec.env``): two
    Ray workers commit their checkpoints, with the commit markers and the manifest, in the
    bucket, and the status names them there."""
    bucket = s3_server.new_bucket()
    manifest = _manifest(tmp_path, storage={"path": f"s3://{bucket}/runs"})
    out = tmp_path / "status.json"
    proc = _trainjob("run", str(manifest), "--output", str(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    status = json.loads(out.read_text())["status"]
    assert status["phase"] == "Succeeded"
    run = f"s3://{bucket}/runs/quickstart"
    assert status["latestCheckpoint"]["path"] == f"{run}/checkpoint_000001"
    import pyarrow.fs as pafs

    stored = {
        info.path.removeprefix(f"{bucket}/runs/quickstart/")
        for info in s3_server.filesystem().get_file_info(
            pafs.FileSelector(f"{bucket}/runs/quickstart", recursive=True)
        )
        if info.type == pafs.FileType.File
    }
    assert "checkpoint_manifest.json" in stored, stored
    for name in ("checkpoint_000000", "checkpoint_000001"):
        assert f"{name}/{COMMIT_MARKER}" in stored, stored
        assert any(p.startswith(f"{name}/") and not p.endswith(COMMIT_MARKER) for p in stored)
