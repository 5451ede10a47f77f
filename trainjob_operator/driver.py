"""Turn a TrainJob into a runtime trainer, and track its progress as TrainJob status.

Shared by ``trainjob run`` (this machine) and the in-cluster driver pod: both
build the trainer with :func:`build_trainer` and publish
:class:`StatusTracker`'s view of the run.
"""

from __future__ import annotations

import datetime as dt
import importlib
import importlib.util
import math
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from trainer_runtime.callbacks import Callback
from trainer_runtime.checkpoint_manager import CheckpointRecord, CheckpointStatus
from trainjob_operator.api.fields import split_entrypoint
from trainjob_operator.api.quantity import parse_quantity
from trainjob_operator.api.status import ConditionType, Phase, Reason, TrainJobStatus
from trainjob_operator.api.trainjob import TrainJob
from trainjob_operator.constants import now

DEFAULT_LOCAL_STORAGE = "~/trainjob_results"


class EntrypointError(ValueError):
    """An entrypoint cannot be imported; ``field`` names the manifest field."""

    def __init__(self, field: str, message: str, hint: str) -> None:
        super().__init__(f"{field}: {message} (hint: {hint})")
        self.field = field


def resolve_entrypoint(entrypoint: str, field: str) -> Callable[..., Any]:
    """Import ``package.module:function`` (the current directory is importable)."""
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    module_name, attr = split_entrypoint(entrypoint)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise EntrypointError(
            field,
            f"cannot import module {module_name!r} ({exc})",
            "run from the folder that contains the package, or add it to PYTHONPATH",
        ) from exc
    except Exception as exc:
        raise EntrypointError(
            field,
            f"importing {module_name!r} failed: {exc!r}",
            "fix the module so that it imports cleanly",
        ) from exc
    fn = getattr(module, attr, None)
    if fn is None:
        names = sorted(
            n for n in dir(module) if not n.startswith("_") and callable(getattr(module, n))
        )
        raise EntrypointError(
            field,
            f"module {module_name!r} has no attribute {attr!r}",
            f"callables there: {', '.join(names[:10]) or 'none'}",
        )
    if not callable(fn):
        raise EntrypointError(field, f"{entrypoint} is not callable", "point it at a function")
    return fn


@dataclass
class RunPlan:
    """Everything needed to start the run, resolved before anything starts."""

    job: TrainJob
    train_fn: Callable[..., Any]
    validate_fn: Callable[..., Any] | None
    num_workers: int
    storage_path: str
    worker_cpus: float
    worker_gpus: int = 0
    """GPUs per worker: the ``nvidia.com/gpu`` count the worker pods are rendered with."""
    trainer_kwargs: dict[str, Any] = field(default_factory=dict)


def _cpu_quantity(value: int | str | None) -> float:
    return 1.0 if value is None else parse_quantity(value)


def plan_run(
    job: TrainJob, num_workers: int | None = None, storage_path: str | None = None
) -> RunPlan:
    """Resolve entrypoints, workers and storage of ``job`` (raises EntrypointError)."""
    spec = job.spec
    train_fn = resolve_entrypoint(spec.entrypoint, "spec.entrypoint")
    validate_fn = (
        resolve_entrypoint(spec.validation.entrypoint, "spec.validation.entrypoint")
        if spec.validation is not None
        else None
    )
    workers = spec.scaling.num_workers if num_workers is None else num_workers
    storage = (
        storage_path
        or (spec.storage.path if spec.storage else None)
        or os.path.expanduser(DEFAULT_LOCAL_STORAGE)
    )
    cpus = _cpu_quantity(spec.scaling.resources_per_worker.get("cpu"))
    gpus = spec.scaling.gpus_per_worker() if spec.scaling.tpu is None else 0
    if spec.framework == "jax" and importlib.util.find_spec("trainer_runtime.jax") is None:
        raise EntrypointError(
            "spec.framework",
            "framework 'jax' needs trainer_runtime.jax, which this version does not include yet",
            "use framework: torch",
        )
    if (
        spec.scaling.tpu is not None
        and workers > 0
        and not os.environ.get("RAY_ADDRESS")
        and not os.environ.get("TPU_WORKER_ID")
    ):
        # Only meaningful for ``trainjob run`` starting its own local Ray on a machine without
        # TPUs. A driver that joins an existing cluster (``RAY_ADDRESS``: the in-cluster driver
        # pod, which runs on a CPU node) finds the TPU hosts through Ray's resources.
        raise EntrypointError(
            "spec.scaling.tpu",
            "this machine has no TPU hosts and RAY_ADDRESS names no Ray cluster to join",
            "run the TrainJob on GKE, set RAY_ADDRESS to a Ray cluster with TPU hosts, or pass "
            "--num-workers 0 to run the train function here in one process",
        )
    return RunPlan(job, train_fn, validate_fn, workers, storage, cpus, worker_gpus=gpus)


def build_trainer(plan: RunPlan, callbacks: list[Callback]) -> Any:
    """The runtime trainer (TorchTrainer / JaxTrainer) for a planned run."""
    from trainer_runtime import (
        CheckpointConfig,
        FailureConfig,
        RunConfig,
        ScalingConfig,
        ValidationConfig,
    )
    from trainer_runtime.config import VALIDATION_RESOURCE

    spec = plan.job.spec
    validation = spec.validation
    upload_mode = {"async": "async", "sync": "sync", "none": "no_upload"}[
        spec.checkpoint.upload_mode
    ]
    resources: dict[str, float] = {"CPU": plan.worker_cpus}
    if plan.worker_gpus > 0:
        # The same count the worker pods get (``nvidia.com/gpu``; ``useGpu`` alone means 1).
        resources["GPU"] = float(plan.worker_gpus)
    run_config = RunConfig(
        name=plan.job.metadata.name,
        storage_path=plan.storage_path,
        checkpoint_config=CheckpointConfig(
            num_to_keep=spec.checkpoint.num_to_keep,
            checkpoint_score_attribute=spec.checkpoint.score_attribute,
            checkpoint_score_order=spec.checkpoint.score_order,
        ),
        failure_config=FailureConfig(max_failures=spec.failure.max_failures),
        validation_config=ValidationConfig(
            # The validation pool advertises this resource, also while it is scaled to zero:
            # validations wait for a pool node rather than run on the training workers.
            resources={VALIDATION_RESOURCE: 1.0},
            max_concurrent_validations=validation.max_concurrent if validation else 1,
            timeout_s=float(validation.timeout_seconds)
            if validation and validation.timeout_seconds
            else None,
            validate_fn=plan.validate_fn,
            validate_config=(
                validation.config
                if validation and validation.config is not None
                else dict(spec.config)
            ),
        ),
        checkpoint_upload_mode=upload_mode,
        callbacks=callbacks,
        worker_env={e.name: e.value for e in spec.env if e.value is not None},
    )
    tpu = spec.scaling.tpu
    timeout = spec.scaling.placement_timeout_seconds
    scaling = ScalingConfig(
        num_workers=plan.num_workers,
        use_gpu=spec.scaling.use_gpu,
        resources_per_worker=resources,
        use_tpu=tpu is not None,
        accelerator_type=tpu.accelerator_type if tpu is not None else None,
        topology=tpu.topology if tpu is not None else None,
        num_slices=tpu.num_slices if tpu is not None else 1,
        # spec.scaling.placementTimeoutSeconds; unset keeps the runtime's default (600 s).
        placement_timeout_s=(
            float(timeout) if timeout is not None else ScalingConfig.placement_timeout_s
        ),
    )
    if spec.framework == "torch":
        from trainer_runtime.torch import TorchTrainer

        return TorchTrainer(
            plan.train_fn,
            train_loop_config=dict(spec.config),
            scaling_config=scaling,
            run_config=run_config,
        )
    from trainer_runtime.jax import JaxTrainer

    jax_trainer: Any = JaxTrainer(
        plan.train_fn,
        train_loop_config=dict(spec.config),
        scaling_config=scaling,
        run_config=run_config,
    )
    return jax_trainer


def json_safe(value: Any) -> Any:
    """``value`` with every non-finite float as a string: ``"NaN"``, ``"Infinity"``,
    ``"-Infinity"`` (nested dicts, lists and tuples included).

    Reported metrics may hold them (a diverging loss is NaN), but JSON has no such numbers and
    the API server rejects a status patch that contains the bare tokens, so free-form metrics
    in the status carry them as these strings.
    """
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {key: json_safe(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(item) for item in value]
    return value


def _finite_score(value: Any) -> float | None:
    """A checkpoint score as a JSON number, or None (null) when missing or not finite."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    score = float(value)
    return score if math.isfinite(score) else None


def _now() -> str:
    return now()


def _step_of(metrics: dict[str, Any] | None, fallback: int) -> int:
    for key in ("step", "global_step", "iteration", "epoch"):
        value = (metrics or {}).get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    return fallback


class StatusTracker(Callback):
    """Keeps a TrainJob ``status`` dict (camelCase) up to date from runtime callbacks.

    The status is always valid JSON for the API server: non-finite floats in metrics become
    strings (:func:`json_safe`) and a non-finite ``bestCheckpoint.score`` becomes null.

    Phase and conditions (``Created``, ``Running``, ``Restarting``, ``Succeeded``, ``Failed``)
    are what ``trainjob run`` reports; on a cluster the operator owns those keys and the driver
    publishes only its own (``DRIVER_STATUS_KEYS``).
    """

    def __init__(self, score_attribute: str | None = None) -> None:
        self.score_attribute = score_attribute
        self._lock = threading.Lock()
        self.reports = 0
        self.status: dict[str, Any] = {
            "phase": Phase.STARTING.value,
            "startTime": _now(),
            "restarts": 0,
            "workerFailures": 0,
            "validations": {"pending": 0, "running": 0, "done": 0, "failed": 0},
        }
        self._validated: dict[str, str] = {}
        self._latest_round = -1
        self._condition(ConditionType.CREATED, True, Reason.CREATED, "TrainJob accepted")

    def _condition(self, type_: str, true: bool, reason: str, message: str) -> None:
        # One rule for conditions (TrainJobStatus.set_condition) on this dict's conditions.
        typed = TrainJobStatus.model_validate({"conditions": self.status.get("conditions", [])})
        typed.set_condition(type_, true, reason, message, None, dt.datetime.now(dt.UTC))
        self.status["conditions"] = typed.to_dict()["conditions"]

    def snapshot(self) -> dict[str, Any]:
        """A copy of the current status."""
        import copy

        with self._lock:
            return copy.deepcopy(self.status)

    def on_run_start(self, run_path: str, world_size: int, attempt: int) -> None:
        """The worker group is up."""
        with self._lock:
            self.status["phase"] = Phase.RUNNING.value
            self.status["workers"] = {"ready": world_size, "desired": world_size}
            self._condition(
                ConditionType.RUNNING, True, Reason.WORKERS_READY, f"{world_size} worker(s) running"
            )
            if attempt > 0:
                self._condition(
                    ConditionType.RESTARTING, False, Reason.RUNNING, "worker group restarted"
                )

    def on_report(self, round_index: int, metrics: dict[str, Any]) -> None:
        """Rank 0 reported."""
        with self._lock:
            self.reports += 1
            self.status["progress"] = {
                "step": _step_of(metrics, self.reports - 1),
                "metrics": json_safe(dict(metrics)),
                "updatedAt": _now(),
            }

    def _checkpoint(self, record: CheckpointRecord) -> dict[str, Any]:
        metrics = record.all_metrics
        return {
            "path": record.path,
            "step": _step_of(metrics, record.round),
            "metrics": json_safe(dict(metrics)),
        }

    def on_checkpoint(self, record: CheckpointRecord, best: CheckpointRecord | None) -> None:
        """A checkpoint was committed or validated."""
        with self._lock:
            if record.round >= self._latest_round:
                self._latest_round = record.round
                self.status["latestCheckpoint"] = self._checkpoint(record)
            if best is not None:
                entry = self._checkpoint(best)
                # A typed number field: a NaN/inf score is published as null.
                entry["score"] = _finite_score(best.all_metrics.get(self.score_attribute or ""))
                self.status["bestCheckpoint"] = entry
            if record.status not in (
                CheckpointStatus.COMMITTED,
                CheckpointStatus.PENDING_VALIDATION,
            ):
                self._validated[record.name] = record.status
                counts = self.status["validations"]
                counts["done"] = sum(
                    1 for s in self._validated.values() if s == CheckpointStatus.VALIDATED
                )
                counts["failed"] = len(self._validated) - counts["done"]

    def on_validation_demand(self, pending: int, running: int) -> None:
        """Validation queue changed: the operator scales the validation pool by it."""
        with self._lock:
            self.status["validations"]["pending"] = pending
            self.status["validations"]["running"] = running

    def on_failure(self, error: BaseException, failures: int, will_restart: bool) -> None:
        """The worker group failed."""
        with self._lock:
            self.status["workerFailures"] = failures
            self.status["phase"] = (Phase.RESTARTING if will_restart else Phase.FAILED).value
            self.status["message"] = str(error).splitlines()[0]
            if will_restart:
                self._condition(
                    ConditionType.RESTARTING,
                    True,
                    Reason.WORKER_GROUP_FAILED,
                    f"{self.status['message']}; restarting from the latest checkpoint",
                )
                self._condition(
                    ConditionType.RUNNING,
                    False,
                    Reason.WORKER_GROUP_FAILED,
                    self.status["message"],
                )

    def finish(self, error: BaseException | None) -> dict[str, Any]:
        """Final status: Succeeded, or Failed with the error as message."""
        with self._lock:
            self.status["phase"] = (Phase.FAILED if error is not None else Phase.SUCCEEDED).value
            self.status["completionTime"] = _now()
            if error is not None:
                self.status["message"] = str(error).splitlines()[0]
                message = self.status["message"]
                self._condition(ConditionType.FAILED, True, Reason.TRAINING_FAILED, message)
                self._condition(ConditionType.RUNNING, False, Reason.TRAINING_FAILED, message)
            else:
                self.status["message"] = "training finished"
                self._condition(
                    ConditionType.SUCCEEDED, True, Reason.TRAINING_FINISHED, "training finished"
                )
                self._condition(ConditionType.RUNNING, False, Reason.SUCCEEDED, "training finished")
            out = dict(self.status)
        # The published status must always be what the CRD accepts.
        return TrainJobStatus.model_validate(out).to_dict()
