"""spec.runtimeEnv end to end on a real Ray cluster: the in-pod driver
(``python -m trainjob_operator.launcher.driver``) reads a working-dir archive that
:func:`~trainjob_operator.sdk.package_working_dir` made from storage (fake-gcs-server), imports
the entrypoints from it, and the train worker and the validation task (on the ``validation``
resource) run in it with ``envVars``: the code is in no image and on no ``sys.path``."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.ports import free_port
from trainer_runtime.result import Result
from trainer_runtime.storage import get_storage
from trainjob_operator.api import parse_trainjob
from trainjob_operator.sdk import package_working_dir
from trainjob_operator.sdk.packaging import archive_uri

pytestmark = [pytest.mark.ray, pytest.mark.slow]

TRAIN = """
import os
import tempfile

from trainer_runtime import Checkpoint, report


def _seen():
    return {"probe": int(os.environ["RTENV_PROBE"]), "marker": int(os.path.exists("marker.txt"))}


def train_func(config):
    folder = tempfile.mkdtemp()
    with open(os.path.join(folder, "weights.txt"), "w") as f:
        f.write("x")
    report(_seen(), checkpoint=Checkpoint.from_directory(folder))


def validate_func(checkpoint, config):
    return {"val_" + k: v for k, v in _seen().items()}
"""


def _start_ray_head(port: int) -> subprocess.Popen[bytes]:
    ray_bin = Path(sys.executable).with_name("ray")
    proc = subprocess.Popen(
        [
            str(ray_bin),
            "start",
            "--head",
            f"--port={port}",
            "--num-cpus=2",
            '--resources={"validation": 1}',
            "--include-dashboard=false",
            "--disable-usage-stats",
            "--block",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    return proc


def test_the_driver_runs_a_working_dir_archive_from_storage(
    tmp_path: Path, gcs_bucket: str
) -> None:
    code = tmp_path / "code"
    (code / "rtenv_probe").mkdir(parents=True)
    (code / "rtenv_probe" / "__init__.py").write_text("")
    (code / "rtenv_probe" / "train.py").write_text(TRAIN)
    (code / "marker.txt").write_text("the working dir is the current folder")
    package = package_working_dir(code)
    storage = tmp_path / "runs"
    uri = archive_uri(f"gs://{gcs_bucket}/runs", "probe", package)
    get_storage(uri).write_bytes(uri, package.data)
    job = parse_trainjob(
        {
            "apiVersion": "trainjob.dev/v1alpha1",
            "kind": "TrainJob",
            "metadata": {"name": "probe", "namespace": "default"},
            "spec": {
                "entrypoint": "rtenv_probe.train:train_func",
                "scaling": {"numWorkers": 1, "resourcesPerWorker": {"cpu": "1"}},
                "validation": {"entrypoint": "rtenv_probe.train:validate_func"},
                "checkpoint": {"scoreAttribute": "val_probe"},
                "storage": {"path": str(storage)},
                "runtimeEnv": {"workingDir": uri, "envVars": {"RTENV_PROBE": "7"}},
            },
        }
    )
    port = free_port()
    head = _start_ray_head(port)
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "TRAINJOB_"))}
        env |= {
            "RAY_ADDRESS": f"127.0.0.1:{port}",
            "TRAINJOB_MANIFEST": json.dumps(job.to_dict()),
            "TRAINJOB_RUNTIME_ENV_DIR": str(tmp_path / "unpacked"),
            "PYTHONPATH": "",
        }
        deadline = time.monotonic() + 60
        while True:  # the head is up when `ray status` answers
            status = subprocess.run(
                [
                    str(Path(sys.executable).with_name("ray")),
                    "status",
                    f"--address={env['RAY_ADDRESS']}",
                ],
                capture_output=True,
                env=env,
            )
            if status.returncode == 0 or time.monotonic() > deadline:
                break
            time.sleep(1)
        driver = subprocess.run(
            [sys.executable, "-m", "trainjob_operator.launcher.driver"],
            cwd=tmp_path,  # not the checkout: the module is only in the archive
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        # SIGTERM to `ray start` alone stops what it started in seconds (to its whole process
        # group the stop hangs, tests/render/test_ray_token_auth.py); then what is left of it.
        head.send_signal(signal.SIGTERM)
        try:
            head.wait(timeout=20)
        except subprocess.TimeoutExpired:
            head.kill()
            head.wait(timeout=20)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(head.pid, signal.SIGKILL)
    assert driver.returncode == 0, driver.stderr[-4000:]
    result = Result.from_path(storage / "probe")
    [record] = result.checkpoints
    expected = {"probe": 7, "marker": 1, "val_probe": 7, "val_marker": 1}
    assert {k: record.all_metrics.get(k) for k in expected} == expected, record.all_metrics
