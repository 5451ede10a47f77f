"""``trainjob run MANIFEST``: run a TrainJob on this machine, on an embedded local Ray.

Everything is checked before anything starts (manifest, entrypoints, storage);
a bad manifest exits 2 with one line per problem. Progress (reports,
checkpoints, validations) prints as it happens; the final TrainJob status is
printed (and written to ``--output`` as YAML or JSON). Exit status: 0
Succeeded, 1 Failed, 2 invalid input.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any, TextIO

import yaml

from trainer_runtime.callbacks import Callback
from trainer_runtime.checkpoint_manager import CheckpointRecord
from trainjob_operator.api.models import ManifestError, load_trainjobs
from trainjob_operator.driver import EntrypointError, RunPlan, StatusTracker, build_trainer
from trainjob_operator.driver import plan_run as _plan_run

EXIT_OK, EXIT_FAILED, EXIT_INVALID = 0, 1, 2


def _short(metrics: dict[str, Any] | None, limit: int = 6) -> str:
    parts = []
    for key, value in list((metrics or {}).items())[:limit]:
        parts.append(f"{key}={value:.4g}" if isinstance(value, float) else f"{key}={value}")
    return " ".join(parts)


class ProgressPrinter(Callback):
    """One line per event; metrics lines at most every ``interval`` seconds."""

    def __init__(self, out: TextIO, interval: float = 1.0) -> None:
        self.out = out
        self.interval = interval
        self.start = time.monotonic()
        self._last_metrics = 0.0
        self._pending_line: str | None = None
        self._demand = (0, 0)

    def _print(self, text: str) -> None:
        print(f"[{time.monotonic() - self.start:7.1f}s] {text}", file=self.out, flush=True)

    def on_run_start(self, run_path: str, world_size: int, attempt: int) -> None:
        """Workers started."""
        again = f" (restart {attempt})" if attempt else ""
        self._print(f"started {world_size} worker(s){again}; run folder {run_path}")

    def on_report(self, round_index: int, metrics: dict[str, Any]) -> None:
        """Rate-limited metrics line."""
        now = time.monotonic()
        line = f"report {round_index}: {_short(metrics)}"
        if now - self._last_metrics >= self.interval:
            self._last_metrics = now
            self._print(line)
            self._pending_line = None
        else:
            self._pending_line = line

    def on_checkpoint(self, record: CheckpointRecord, best: CheckpointRecord | None) -> None:
        """Checkpoint committed / validated."""
        if self._pending_line:
            self._print(self._pending_line)
            self._pending_line = None
        extra = f" {_short(record.validation_metrics)}" if record.validation_metrics else ""
        error = f" ({record.validation_error})" if record.validation_error else ""
        best_name = f"; best {best.name}" if best is not None else ""
        self._print(f"checkpoint {record.name}: {record.status}{extra}{error}{best_name}")

    def on_validation_demand(self, pending: int, running: int) -> None:
        """Validation queue changed."""
        if (pending, running) != self._demand:
            self._demand = (pending, running)
            self._print(f"validations: {pending} pending, {running} running")

    def on_failure(self, error: BaseException, failures: int, will_restart: bool) -> None:
        """The worker group failed."""
        what = "restarting from the latest checkpoint" if will_restart else "giving up"
        self._print(f"failure {failures}: {str(error).splitlines()[0]} ({what})")

    def flush(self) -> None:
        """Print a held-back metrics line."""
        if self._pending_line:
            self._print(self._pending_line)
            self._pending_line = None


def _load(manifest: str) -> Any:
    try:
        jobs = load_trainjobs(manifest if manifest == "-" else Path(manifest))
    except ManifestError as exc:
        for error in exc.errors:
            print(f"{manifest}: {error.format()}", file=sys.stderr)
        return None
    except OSError as exc:
        print(f"{manifest}: cannot read: {exc.strerror or exc}", file=sys.stderr)
        return None
    if len(jobs) != 1:
        print(
            f"{manifest}: expected exactly one TrainJob, found {len(jobs)} (hint: split the "
            "file or run each document separately)",
            file=sys.stderr,
        )
        return None
    return jobs[0]


def _start_ray(plan: RunPlan) -> None:
    import ray

    if os.environ.get("RAY_ADDRESS"):
        ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=True)
        return
    validation = plan.job.spec.validation
    slots = float(validation.max_concurrent if validation else 1)
    needed = plan.num_workers * plan.worker_cpus + slots
    ray.init(
        address="local",
        num_cpus=max(os.cpu_count() or 1, int(needed + 0.999)),
        resources={"validation": slots},
        include_dashboard=False,
        log_to_driver=True,
        configure_logging=False,
        runtime_env={
            "env_vars": {
                "PYTHONPATH": os.pathsep.join(
                    p for p in (os.getcwd(), os.environ.get("PYTHONPATH", "")) if p
                )
            }
        },
    )


def _write_output(path: str | None, document: dict[str, Any], out: TextIO) -> None:
    text = yaml.safe_dump(document, sort_keys=False)
    print("---", file=out)
    print(text, file=out, end="")
    if path:
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.suffix == ".json":
            target.write_text(json.dumps(document, indent=2) + "\n")
        else:
            target.write_text(text)


def run_command(args: argparse.Namespace) -> int:
    """Entry point of ``trainjob run`` (see the module docstring)."""
    job = _load(args.manifest)
    if job is None:
        return EXIT_INVALID
    if args.num_workers is not None and args.num_workers < 0:
        print("--num-workers: must be >= 0 (0 runs in this process)", file=sys.stderr)
        return EXIT_INVALID
    try:
        plan = _plan_run(job, num_workers=args.num_workers, storage_path=args.storage_path)
    except (EntrypointError, ValueError) as exc:
        print(f"{args.manifest}: {exc}", file=sys.stderr)
        return EXIT_INVALID
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    out = sys.stdout
    tracker = StatusTracker(job.spec.checkpoint.score_attribute)
    printer = ProgressPrinter(out)
    try:
        trainer = build_trainer(plan, [tracker, printer])
    except ValueError as exc:
        print(f"{args.manifest}: {exc}", file=sys.stderr)
        return EXIT_INVALID
    mode = "in this process" if plan.num_workers == 0 else f"{plan.num_workers} Ray worker(s)"
    print(
        f"TrainJob {job.metadata.name}: {job.spec.entrypoint} on {mode}, storage "
        f"{plan.storage_path}",
        file=out,
        flush=True,
    )
    if plan.num_workers > 0:
        _start_ray(plan)
    from trainer_runtime.errors import TrainingFailedError

    error: BaseException | None = None
    try:
        trainer.fit()
    except TrainingFailedError as exc:
        error = exc
    except KeyboardInterrupt:
        error = KeyboardInterrupt("interrupted")
    finally:
        printer.flush()
        if plan.num_workers > 0:
            import ray

            ray.shutdown()
    status = tracker.finish(error)
    document = {
        "apiVersion": "trainjob.dev/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": job.metadata.name},
        "status": status,
    }
    _write_output(args.output, document, out)
    if error is not None:
        print(f"TrainJob {job.metadata.name} Failed: {error}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK
