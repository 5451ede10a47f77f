"""The runtime's view of a run as TrainJob status: :class:`StatusTracker`.

A runtime callback that keeps a camelCase ``status`` dict (phase, conditions, progress,
checkpoints, validations, worker failures) up to date; the in-cluster driver publishes it to
the API server, ``trainjob run`` prints it and its progress display reads it.
"""

from __future__ import annotations

import copy
import datetime as dt
import math
import threading
from typing import Any

# The step rule is the driver metrics' (trainjob_train_step): one rule for both.
from trainer_runtime._driver_metrics import step_of
from trainer_runtime.callbacks import Callback
from trainer_runtime.checkpoint_manager import CheckpointRecord, CheckpointStatus
from trainjob_operator.api.status import ConditionType, Phase, Reason, TrainJobStatus
from trainjob_operator.constants import now

__all__ = ["StatusTracker", "json_safe", "step_of"]


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
        #: Workers of the running worker group (``progress.workers``; None before it starts).
        self.world_size: int | None = None
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
        with self._lock:
            return copy.deepcopy(self.status)

    def on_run_start(self, run_path: str, world_size: int, attempt: int) -> None:
        """The worker group is up."""
        with self._lock:
            self.status["phase"] = Phase.RUNNING.value
            self.status["workers"] = {"ready": world_size, "desired": world_size}
            self.world_size = world_size
            self.status.setdefault("progress", {})["workers"] = world_size
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
                "step": step_of(metrics, self.reports - 1),
                "metrics": json_safe(dict(metrics)),
                "updatedAt": _now(),
            }
            if self.world_size is not None:
                self.status["progress"]["workers"] = self.world_size

    def _checkpoint(self, record: CheckpointRecord) -> dict[str, Any]:
        metrics = record.all_metrics
        return {
            "path": record.path,
            "step": step_of(metrics, record.round),
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
