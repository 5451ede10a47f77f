"""The driver pod's env round-trips into the TrainJob and the trainer the driver runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from trainjob_operator.api import TrainJob, load_trainjobs, parse_trainjob
from trainjob_operator.launcher.driver import load_job
from trainjob_operator.launcher.trainer import EntrypointError, build_trainer, plan_run
from trainjob_operator.render import render_driver_pod, render_validation_pods, render_worker_pods

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


def _driver_pod_env(job: TrainJob) -> dict[str, str]:
    """The literal env the operator gives the driver container of ``job``."""
    pod = render_driver_pod(job, uid="uid-1")
    [container] = pod["spec"]["containers"]
    return {e["name"]: e["value"] for e in container["env"] if "value" in e}


def _as_in_the_driver_pod(monkeypatch: pytest.MonkeyPatch, job: TrainJob) -> dict[str, str]:
    """Give this process exactly the driver pod's env (on a CPU node: no TPU_* variables)."""
    for name in ("TPU_WORKER_ID", "TPU_NAME", "TPU_WORKER_HOSTNAMES", "RAY_ADDRESS"):
        monkeypatch.delenv(name, raising=False)
    env = _driver_pod_env(job)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env


def test_tpu_job_plans_in_the_rendered_driver_pod(monkeypatch: pytest.MonkeyPatch) -> None:
    # The driver pod runs on a CPU node: it has RAY_ADDRESS (it joins the job's Ray cluster,
    # whose TPU hosts advertise their slices) but no TPU_WORKER_ID. Planning must not refuse.
    job = load_trainjobs(REPO / "examples" / "tpu-v6e-4x4.yaml")[0]
    env = _as_in_the_driver_pod(monkeypatch, job)
    assert env["RAY_ADDRESS"] == "llm-v6e-4x4-head.llm-v6e-4x4-headless:6379"
    assert not any(name.startswith("TPU_") for name in env)
    loaded = load_job(None)  # from TRAINJOB_MANIFEST, as the driver does
    trainer = build_trainer(plan_run(loaded), [])
    scaling = trainer.scaling_config
    assert scaling.use_tpu and scaling.num_workers == 4
    assert scaling.topology == "4x4" and scaling.num_slices == 1
    assert scaling.worker_resources()["TPU"] == 4
    assert type(trainer).__name__ == "JaxTrainer"


def test_tpu_job_without_a_cluster_or_tpu_hosts_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # `trainjob run` on a laptop: no RAY_ADDRESS to join and no TPU here.
    for name in ("TPU_WORKER_ID", "RAY_ADDRESS"):
        monkeypatch.delenv(name, raising=False)
    job = load_trainjobs(REPO / "examples" / "tpu-v6e-4x4.yaml")[0]
    with pytest.raises(EntrypointError, match=r"^spec\.scaling\.tpu: .*RAY_ADDRESS"):
        plan_run(job)
    assert plan_run(job, num_workers=0).num_workers == 0  # local mode is fine


def test_placement_timeout_comes_from_the_spec(monkeypatch: pytest.MonkeyPatch) -> None:
    job = load_trainjobs(REPO / "examples" / "tpu-v6e-4x4.yaml")[0]
    _as_in_the_driver_pod(monkeypatch, job)
    default = build_trainer(plan_run(job), []).scaling_config
    assert default.placement_timeout_s == 600.0
    body = job.to_dict()
    body["spec"]["scaling"]["placementTimeoutSeconds"] = 3600
    slow = parse_trainjob(body)
    _as_in_the_driver_pod(monkeypatch, slow)
    loaded = load_job(None)  # the field reaches the driver through TRAINJOB_MANIFEST
    assert loaded.spec.scaling.placement_timeout_seconds == 3600
    assert build_trainer(plan_run(loaded), []).scaling_config.placement_timeout_s == 3600.0


def test_failure_budgets_come_from_the_spec(monkeypatch: pytest.MonkeyPatch) -> None:
    job = load_trainjobs(REPO / "examples" / "tpu-v6e-4x4.yaml")[0]
    _as_in_the_driver_pod(monkeypatch, job)
    default = build_trainer(plan_run(job), []).run_config.failure_config
    # Ray Train's default: a preemption restarts the worker group in place, always.
    assert default.max_preemption_failures == -1
    assert default.max_failures == job.spec.failure.max_failures
    body = job.to_dict()
    body["spec"]["failure"] = {"maxFailures": 5, "maxPreemptionFailures": 0}
    _as_in_the_driver_pod(monkeypatch, parse_trainjob(body))
    loaded = load_job(None)  # through TRAINJOB_MANIFEST, as the driver reads it
    failure = build_trainer(plan_run(loaded), []).run_config.failure_config
    assert (failure.max_failures, failure.max_preemption_failures) == (5, 0)


@pytest.mark.parametrize(
    ("scaling", "gpus"),
    [
        ({"numWorkers": 2, "useGpu": True}, 1),
        ({"numWorkers": 2, "useGpu": True, "resourcesPerWorker": {"nvidia.com/gpu": 4}}, 4),
        ({"numWorkers": 2, "resourcesPerWorker": {"nvidia.com/gpu": "2"}}, 2),
        ({"numWorkers": 2, "resourcesPerWorker": {"cpu": "2"}}, 0),
    ],
)
def test_trainer_asks_for_the_gpus_the_worker_pods_get(
    monkeypatch: pytest.MonkeyPatch, scaling: dict[str, Any], gpus: int
) -> None:
    body = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())
    body["spec"]["scaling"] = scaling
    job = parse_trainjob(body)
    [worker, *_] = render_worker_pods(job, uid="uid-1")
    limits = worker["spec"]["containers"][0]["resources"].get("limits", {})
    assert int(limits.get("nvidia.com/gpu", 0)) == gpus
    assert f"--num-gpus={gpus}" in worker["spec"]["containers"][0]["command"]
    _as_in_the_driver_pod(monkeypatch, job)
    resources = build_trainer(plan_run(job), []).scaling_config.worker_resources()
    assert resources.get("GPU", 0) == gpus


def test_status_tracker_keeps_non_finite_metrics_json_safe() -> None:
    from trainer_runtime.checkpoint_manager import CheckpointRecord, CheckpointStatus
    from trainjob_operator.launcher.status import StatusTracker

    tracker = StatusTracker("val_loss")
    tracker.on_report(0, {"step": 0, "loss": float("nan"), "nested": {"g": float("-inf")}})
    record = CheckpointRecord(
        "checkpoint_000000",
        "/ckpt/0",
        0,
        {"loss": float("inf")},
        status=CheckpointStatus.VALIDATED,
        validation_metrics={"val_loss": float("nan")},
    )
    tracker.on_checkpoint(record, record)
    status = tracker.finish(None)
    json.dumps(status, allow_nan=False)  # strict JSON: what the API server accepts
    assert status["progress"]["metrics"] == {"step": 0, "loss": "NaN", "nested": {"g": "-Infinity"}}
    assert status["latestCheckpoint"]["metrics"] == {"loss": "Infinity", "val_loss": "NaN"}
    assert "score" not in status["bestCheckpoint"]  # null: no usable score


def test_worker_group_failures_are_published_apart_from_cluster_restarts() -> None:
    from trainjob_operator.launcher.driver import DRIVER_STATUS_KEYS
    from trainjob_operator.launcher.status import StatusTracker
    from trainjob_operator.reconcile.apply import OPERATOR_STATUS_KEYS

    tracker = StatusTracker()
    tracker.on_run_start("/runs/x", 2, 0)
    tracker.on_failure(RuntimeError("worker 1 died\ntraceback..."), 1, True)
    snapshot = tracker.snapshot()
    assert snapshot["workerFailures"] == 1 and snapshot["phase"] == "Restarting"
    assert snapshot["restarts"] == 0  # whole-cluster restarts are the operator's to count
    assert snapshot["message"] == "worker 1 died"
    # The driver publishes workerFailures; the operator never overwrites it.
    assert "workerFailures" in DRIVER_STATUS_KEYS
    assert "workerFailures" not in OPERATOR_STATUS_KEYS
    final = tracker.finish(None)
    assert final["workerFailures"] == 1
    conditions = {c["type"]: c for c in final["conditions"]}
    assert conditions["Created"]["status"] == "True"
    assert conditions["Restarting"]["reason"] == "WorkerGroupFailed"
    assert "worker 1 died" in conditions["Restarting"]["message"]
    assert conditions["Succeeded"]["status"] == "True"
    assert conditions["Running"]["status"] == "False"
    assert "Failed" not in conditions


def test_progress_workers_is_the_running_groups_size_through_resizes() -> None:
    """An elastic run's worker group shrinks and grows: ``progress.workers`` follows each
    group start, through reports, and is one of the keys the driver publishes."""
    from trainjob_operator.api import TrainJobStatus
    from trainjob_operator.launcher.driver import DRIVER_STATUS_KEYS
    from trainjob_operator.launcher.status import StatusTracker

    tracker = StatusTracker()
    tracker.on_run_start("/runs/x", 2, 0)
    assert tracker.snapshot()["progress"] == {"workers": 2}
    tracker.on_report(0, {"step": 0})
    tracker.on_run_start("/runs/x", 1, 1)  # a worker lost: going on with one
    assert tracker.snapshot()["progress"]["workers"] == 1
    tracker.on_report(1, {"step": 1})
    progress = tracker.snapshot()["progress"]
    assert progress["workers"] == 1 and progress["step"] == 1
    assert "progress" in DRIVER_STATUS_KEYS
    assert TrainJobStatus.model_validate({"progress": progress}).progress.workers == 1


def test_a_failed_run_has_the_failed_condition_with_the_error() -> None:
    from trainjob_operator.launcher.status import StatusTracker

    tracker = StatusTracker()
    tracker.on_run_start("/runs/x", 2, 0)
    assert {c["type"]: c["status"] for c in tracker.snapshot()["conditions"]} == {
        "Created": "True",
        "Running": "True",
    }
    final = tracker.finish(ZeroDivisionError("division by zero"))
    failed = next(c for c in final["conditions"] if c["type"] == "Failed")
    assert failed["status"] == "True" and failed["reason"] == "TrainingFailed"
    assert failed["message"] == "division by zero"


def test_entrypoints_import_from_the_interpreters_path_unless_a_folder_is_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The driver adds nothing to sys.path (no implicit current folder); trainjob run passes
    # the folder it imports from explicitly.
    import sys

    (tmp_path / "mypkg_entry").mkdir()
    (tmp_path / "mypkg_entry" / "__init__.py").write_text("def train(config):\n    pass\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    job = parse_trainjob(
        {
            "apiVersion": "trainjob.dev/v1alpha1",
            "kind": "TrainJob",
            "metadata": {"name": "imp"},
            "spec": {"entrypoint": "mypkg_entry:train", "scaling": {"numWorkers": 0}},
        }
    )
    before = list(sys.path)
    with pytest.raises(EntrypointError, match=r"spec\.entrypoint: cannot import module"):
        plan_run(job)
    assert sys.path == before
    assert plan_run(job, import_from=str(tmp_path)).num_workers == 0
    assert sys.path[0] == str(tmp_path)


def test_only_trainjob_run_forwards_spec_env_to_the_worker_actors() -> None:
    """`trainjob run` hands spec.env to its local workers; the in-pod driver does not (the
    worker pods carry it, and a runtime_env would keep Ray from using prestarted workers)."""
    job = parse_trainjob(
        {
            "apiVersion": "trainjob.dev/v1alpha1",
            "kind": "TrainJob",
            "metadata": {"name": "env"},
            "spec": {
                "entrypoint": "examples.quickstart.train:train_func",
                "env": [{"name": "A", "value": "1"}],
            },
        }
    )
    plan = plan_run(job, storage_path="/tmp/unused")
    assert build_trainer(plan, []).run_config.worker_env == {"A": "1"}
    assert build_trainer(plan, [], forward_env=False).run_config.worker_env == {}
    [worker] = render_worker_pods(job, uid="uid-1")
    assert {"name": "A", "value": "1"} in worker["spec"]["containers"][0]["env"]


def test_train_workers_select_the_worker_pods_ray_nodes_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The validation pool advertises CPUs (for Ray Data's tasks); the driver's trainer places
    its workers by the Ray node label the worker pods start with, never on a pool node."""
    job = load_trainjobs(REPO / "examples" / "quickstart.yaml")[0]
    [worker, *_] = render_worker_pods(job, uid="uid-1")
    [validation] = render_validation_pods(job, uid="uid-1", validation_replicas=1)
    assert "--labels=trainjob.dev/pool=train" in worker["spec"]["containers"][0]["command"]
    pool_command = validation["spec"]["containers"][0]["command"]
    assert "--labels=trainjob.dev/pool=validation" in pool_command
    assert "--num-cpus=1" in pool_command
    _as_in_the_driver_pod(monkeypatch, job)
    scaling = build_trainer(plan_run(job), []).scaling_config
    assert scaling.label_selector == {"trainjob.dev/pool": "train"}
    monkeypatch.delenv("TRAINJOB_WORKER_LABEL_SELECTOR")  # trainjob run: one local Ray node
    assert build_trainer(plan_run(job), []).scaling_config.label_selector is None


def not_datasets(config: dict[str, Any]) -> list[int]:
    """A ``spec.data.datasets`` function that returns no dict of datasets."""
    return [config["rows"]]


def test_the_datasets_function_is_checked_like_the_entrypoint() -> None:
    """An unimportable ``spec.data.datasets`` is refused when planning (exit 2 in the driver),
    one that returns no dict of datasets when the trainer is built, both naming the field."""
    body = {
        "apiVersion": "trainjob.dev/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "data-job"},
        "spec": {
            "entrypoint": "tests.runtime.data_workloads:read_shards",
            "config": {"rows": 3},
            "scaling": {"numWorkers": 0},
            "data": {"datasets": "tests.no_such_module:datasets"},
        },
    }
    with pytest.raises(EntrypointError, match=r"^spec\.data\.datasets: cannot import module"):
        plan_run(parse_trainjob(body))
    body["spec"]["data"] = {"datasets": "tests.test_driver_main:not_datasets"}
    plan = plan_run(parse_trainjob(body))
    with pytest.raises(EntrypointError, match=r"^spec\.data\.datasets: .*returned list"):
        build_trainer(plan, [])
