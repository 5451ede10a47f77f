"""The in-cluster driver: ``python -m trainjob_operator.launcher.driver``.

Runs in the TrainJob's driver pod: loads its TrainJob (``TRAINJOB_MANIFEST``, JSON set
by the operator; or the file ``TRAINJOB_SPEC_FILE``; else from the API by
``TRAINJOB_NAMESPACE``/``TRAINJOB_NAME``),
connects to the job's Ray cluster (``RAY_ADDRESS``), runs the training, and
publishes progress, checkpoints and validation demand into the TrainJob's
status (the operator scales the validation pool from ``status.validations``).
Exit status: 0 when training succeeded, 1 when it failed (the operator
restarts the cluster up to ``spec.failure.maxRestarts``), 2 for invalid input, 3 when it
stopped on a preemption notice after committing a last checkpoint (a restart not counted):
a worker pod's, or its own SIGTERM (the driver pod deleted, evicted or drained), after
which it commits the checkpoint round in flight, or the one the train function saves on
``get_preemption_info()``, before the grace period ends.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import yaml

from trainer_runtime.checkpoint_manager import CheckpointRecord
from trainer_runtime.errors import PreemptionError, TrainingFailedError
from trainer_runtime.preemption import install_sigterm_handler
from trainjob_operator.api.errors import ManifestError
from trainjob_operator.api.manifest import parse_trainjob
from trainjob_operator.api.trainjob import TrainJob
from trainjob_operator.constants import (
    DRIVER_INVALID_INPUT_EXIT_CODE,
    DRIVER_PREEMPTED_EXIT_CODE,
    KIND,
)
from trainjob_operator.kube import DRIVER_USER_AGENT, ApiError, KubeClient, KubeConfig
from trainjob_operator.launcher.runtime_env import (
    RuntimeEnvError,
    add_import_paths,
    prepare_runtime_env,
)
from trainjob_operator.launcher.status import StatusTracker
from trainjob_operator.launcher.trainer import EntrypointError, build_trainer, plan_run

logger = logging.getLogger("trainjob_operator.launcher.driver")

RUNTIME_ENV_DIR_ENV = "TRAINJOB_RUNTIME_ENV_DIR"
"""Where the driver unpacks spec.runtimeEnv's archives (default /tmp/trainjob-runtime-env)."""

#: status keys the driver owns (the operator owns phase and conditions).
DRIVER_STATUS_KEYS = (
    "progress",
    "latestCheckpoint",
    "bestCheckpoint",
    "validations",
    "workerFailures",
)


class StatusPublisher(StatusTracker):
    """A StatusTracker that merge-patches its driver-owned keys into the TrainJob status.

    Patches go out from a background thread at most every ``min_interval``
    seconds, so a fast ``report()`` loop never waits on the API server.
    """

    def __init__(
        self,
        client: KubeClient,
        namespace: str,
        name: str,
        score_attribute: str | None,
        min_interval: float = 2.0,
    ) -> None:
        super().__init__(score_attribute)
        self.client = client
        self.namespace = namespace
        self.name = name
        self.min_interval = min_interval
        self._dirty = threading.Event()
        self._stop = threading.Event()
        self._last: dict[str, Any] = {}
        self._thread = threading.Thread(target=self._loop, name="status-publisher", daemon=True)
        self._thread.start()

    def _changed(self) -> None:
        self._dirty.set()

    def on_run_start(self, run_path: str, world_size: int, attempt: int) -> None:
        """A worker group started: its size is ``progress.workers``."""
        super().on_run_start(run_path, world_size, attempt)
        self._changed()

    def on_report(self, round_index: int, metrics: dict[str, Any]) -> None:
        """Rank 0 reported."""
        super().on_report(round_index, metrics)
        self._changed()

    def on_checkpoint(self, record: CheckpointRecord, best: CheckpointRecord | None) -> None:
        """Checkpoint committed or validated."""
        super().on_checkpoint(record, best)
        self._changed()

    def on_validation_demand(self, pending: int, running: int) -> None:
        """Demand changed: the operator scales the validation pool from it."""
        super().on_validation_demand(pending, running)
        self._changed()

    def publish(self) -> None:
        """Patch the driver-owned status keys now (when they changed)."""
        snapshot = self.snapshot()
        patch = {k: snapshot[k] for k in DRIVER_STATUS_KEYS if k in snapshot}
        if patch == self._last:
            return
        try:
            self.client.patch(
                KIND, self.namespace, self.name, {"status": patch}, subresource="status"
            )
            self._last = patch
        except ApiError as exc:
            # The API server is away (a restart, an upgrade) or refused: try again after
            # min_interval, not only at the next change (the last report may be the change).
            logger.warning("could not publish status (will retry): %s", exc)
            self._dirty.set()
        except ValueError as exc:
            # Never let one bad patch stop the publisher thread: the next change retries.
            logger.warning("could not publish status: %s", exc)

    def _loop(self) -> None:
        while not self._stop.is_set():
            if self._dirty.wait(0.5):
                self._dirty.clear()
                self.publish()
                self._stop.wait(self.min_interval)

    def close(self) -> None:
        """Publish what is left and stop."""
        self._stop.set()
        self._thread.join(10)
        self.publish()


def load_job(client: KubeClient | None) -> TrainJob:
    """The TrainJob this driver runs: ``TRAINJOB_MANIFEST`` (JSON, set by the operator's
    driver pod), else ``TRAINJOB_SPEC_FILE``, else read from the API."""
    manifest = os.environ.get("TRAINJOB_MANIFEST")
    if manifest:
        return parse_trainjob(json.loads(manifest))
    spec_file = os.environ.get("TRAINJOB_SPEC_FILE")
    if spec_file:
        return parse_trainjob(yaml.safe_load(Path(spec_file).read_text()))
    assert client is not None
    obj = client.get(KIND, os.environ["TRAINJOB_NAMESPACE"], os.environ["TRAINJOB_NAME"])
    if obj is None:
        raise SystemExit("the TrainJob this driver belongs to does not exist")
    return parse_trainjob(obj)


def main() -> int:
    """Run the TrainJob's training on the job's Ray cluster."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    client = (
        KubeClient(KubeConfig.load(), user_agent=DRIVER_USER_AGENT)
        if os.environ.get("TRAINJOB_NAME")
        else None
    )
    try:
        job = load_job(client)
        # spec.runtimeEnv: its archives unpacked here, the entrypoints imported from them.
        runtime_env, import_paths = prepare_runtime_env(
            job.spec.runtime_env,
            Path(os.environ.get(RUNTIME_ENV_DIR_ENV, "/tmp/trainjob-runtime-env")),
        )
        add_import_paths(import_paths)
        plan = plan_run(job)
    except RuntimeEnvError as exc:
        print(f"invalid TrainJob: {exc}" if exc.permanent else str(exc), file=sys.stderr)
        return DRIVER_INVALID_INPUT_EXIT_CODE if exc.permanent else 1
    except (ManifestError, EntrypointError, ValueError) as exc:
        print(f"invalid TrainJob: {exc}", file=sys.stderr)
        return DRIVER_INVALID_INPUT_EXIT_CODE
    name = job.metadata.name
    namespace = job.metadata.namespace or os.environ.get("TRAINJOB_NAMESPACE", "default")
    tracker: StatusTracker = (
        StatusPublisher(client, namespace, name, job.spec.checkpoint.score_attribute)
        if client is not None
        else StatusTracker(job.spec.checkpoint.score_attribute)
    )
    import ray

    # The job's runtime_env (spec.runtimeEnv): every actor and task of this Ray job, the train
    # workers and the validation tasks, inherits it.
    ray.init(
        address=os.environ.get("RAY_ADDRESS", "auto"),
        log_to_driver=True,
        runtime_env=runtime_env,
    )
    # After ray.init, which sets a SIGTERM handler that exits 15: the pod's termination
    # notice (deleted, evicted, drained) becomes a preemption of every rank instead; the run
    # commits what it can and this process exits 3, as for a preempted worker pod.
    install_sigterm_handler()

    start = time.monotonic()
    error: BaseException | None = None
    try:
        # The worker pods carry spec.env (rendered into their containers); spec.data's
        # datasets are built here, on the cluster, their Ray Data work on the data pool.
        build_trainer(plan, [tracker], forward_env=False).fit()
    except EntrypointError as exc:  # spec.data.datasets returned no datasets
        print(f"invalid TrainJob: {exc}", file=sys.stderr)
        return DRIVER_INVALID_INPUT_EXIT_CODE
    except TrainingFailedError as exc:
        error = exc
    finally:
        if isinstance(tracker, StatusPublisher):
            tracker.close()
        ray.shutdown()
    logger.info(
        "training %s after %.0fs", "failed" if error else "finished", time.monotonic() - start
    )
    if isinstance(error, PreemptionError):
        checkpoint = error.result.checkpoint if error.result is not None else None
        print(
            f"TrainJob {name} preempted: {error.preemption_info}; last checkpoint "
            f"{checkpoint.path if checkpoint is not None else 'none'}",
            file=sys.stderr,
        )
        return DRIVER_PREEMPTED_EXIT_CODE
    if error is not None:
        print(f"TrainJob {name} failed: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
