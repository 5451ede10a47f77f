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
