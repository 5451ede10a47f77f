"""The driver pod's manifest env round-trips into the TrainJob the driver runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainjob_operator.api.models import load_trainjobs
from trainjob_operator.driver_main import load_job
from trainjob_operator.render import render_driver_pod

REPO = Path(__file__).resolve().parent.parent


def test_driver_loads_the_manifest_the_operator_rendered(monkeypatch: pytest.MonkeyPatch) -> None:
    job = load_trainjobs(REPO / "examples" / "quickstart.yaml")[0]
    pod = render_driver_pod(job, uid="uid-1")
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    monkeypatch.setenv("TRAINJOB_MANIFEST", env["TRAINJOB_MANIFEST"])
    loaded = load_job(None)
    assert loaded.metadata.name == "quickstart"
    assert loaded.spec.entrypoint == job.spec.entrypoint
    assert loaded.spec.validation is not None and job.spec.validation is not None
    assert loaded.spec.validation.entrypoint == job.spec.validation.entrypoint
    assert loaded.spec.checkpoint == job.spec.checkpoint


def test_tpu_spec_becomes_tpu_scaling(monkeypatch: pytest.MonkeyPatch) -> None:
    from trainjob_operator.driver import build_trainer, plan_run

    monkeypatch.setenv("TPU_WORKER_ID", "0")  # as on a GKE TPU host
    job = load_trainjobs(REPO / "examples" / "tpu-v6e-4x4.yaml")[0]
    trainer = build_trainer(plan_run(job), [])
    scaling = trainer.scaling_config
    assert scaling.use_tpu and scaling.num_workers == 4
    assert scaling.topology == "4x4" and scaling.num_slices == 1
    assert scaling.worker_resources()["TPU"] == 4
    assert type(trainer).__name__ == "JaxTrainer"
