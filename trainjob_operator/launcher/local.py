"""``trainjob run MANIFEST``: run a TrainJob on this machine, on an embedded local Ray.

Everything is checked before anything starts (manifest, entrypoints, storage);
a bad manifest exits 2 with one line per problem. Progress (phase, step and
metrics, checkpoints committed and validated, best so far, elapsed time) is
shown by :class:`~trainjob_operator.launcher.progress.ProgressDisplay`: a live line on a
terminal, plain lines otherwise. The Ray workers' own output goes to a file
whose path is printed (``--verbose`` also shows it). The final TrainJob status
is printed (and written to ``--output`` as YAML or JSON). Exit status: 0
Succeeded, 1 Failed, 2 invalid input.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, TextIO

import yaml

from trainer_runtime.errors import TrainerRuntimeError
from trainjob_operator.api.errors import ManifestError
from trainjob_operator.api.manifest import load_trainjobs
from trainjob_operator.constants import API_VERSION, KIND, METRICS_PORT_ENV
from trainjob_operator.launcher.progress import (
    DisplayLogHandler,
    ProgressDisplay,
    WorkerLogSink,
    is_live,
)
from trainjob_operator.launcher.status import StatusTracker
from trainjob_operator.launcher.trainer import EntrypointError, RunPlan, build_trainer
from trainjob_operator.launcher.trainer import plan_run as _plan_run

EXIT_OK, EXIT_FAILED, EXIT_INVALID = 0, 1, 2

LOCAL_WORKERS_PER_CPU = 4
"""Most Ray worker processes ``trainjob run`` starts per CPU of this machine."""
LOCAL_WORKER_MEMORY = 512 * 2**20
"""Memory a local Ray worker process is assumed to need (a Python process with torch)."""
LOCAL_LOGICAL_CPUS_PER_CPU = 16
"""Most logical Ray CPUs the local Ray may advertise per CPU of this machine (Ray starts
worker processes in proportion to its CPU count)."""


def _machine_memory() -> int | None:
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, OSError, ValueError):  # pragma: no cover - not on Linux
        return None


def local_capacity_problem(plan: RunPlan) -> str | None:
    """Why this machine cannot run ``plan``'s workers on a local Ray, or None when it can.

    Only for a Ray that ``trainjob run`` starts itself (not with ``RAY_ADDRESS``): workers are
    processes here, so their number is capped by this machine's CPUs and memory, and so are
    the logical CPUs they reserve. The message is ``field: message (hint: ...)``.
    """
    if plan.num_workers == 0 or os.environ.get("RAY_ADDRESS"):
        return None
    cpus = os.cpu_count() or 1
    memory = _machine_memory()
    limit = LOCAL_WORKERS_PER_CPU * cpus
    machine = f"{cpus} CPU(s)"
    if memory is not None:
        limit = max(1, min(limit, memory // LOCAL_WORKER_MEMORY))
        machine += f", {memory / 2**30:.1f} GiB of memory"
    hint = (
        f"pass --num-workers N with N <= {limit} to try it here (0 runs in this process), or "
        "run it on a cluster (kubectl apply)"
    )
    if plan.num_workers > limit:
        return (
            f"spec.scaling.numWorkers: {plan.num_workers} Ray workers do not fit on this machine "
            f"({machine}: at most {limit} worker processes) (hint: {hint})"
        )
    logical = plan.num_workers * plan.worker_cpus
    if logical > LOCAL_LOGICAL_CPUS_PER_CPU * cpus:
        return (
            f'spec.scaling.resourcesPerWorker["cpu"]: {plan.num_workers} worker(s) x '
            f"{plan.worker_cpus:g} CPU = {logical:g} CPUs, more than this machine can emulate "
            f"({machine}: at most {LOCAL_LOGICAL_CPUS_PER_CPU * cpus}) (hint: lower cpu or "
            "--num-workers for a local run; the manifest's values apply on a cluster)"
        )
    return None


def env_from_problems(job: Any) -> tuple[list[str], list[str]]:
    """``(notes, problems)`` of ``spec.env`` entries with ``valueFrom`` for a local run.

    Kubernetes resolves ``valueFrom`` (secretKeyRef, configMapKeyRef, fieldRef...) in a
    cluster; here a variable of that name set in this shell is used instead (the local Ray
    workers inherit this environment), and one that is not set is a problem naming the fix.
    """
    notes: list[str] = []
    problems: list[str] = []
    for index, var in enumerate(job.spec.env):
        if var.value_from is None:
            continue
        source = ", ".join(sorted(var.value_from)) or "valueFrom"
        if var.name in os.environ:
            notes.append(
                f"spec.env[{index}] ({var.name}) comes from {source} in a cluster; using "
                f"${var.name} from this shell"
            )
        else:
            problems.append(
                f"spec.env[{index}].valueFrom: {var.name} comes from {source}, which only "
                f"Kubernetes resolves (hint: export {var.name}=... before trainjob run, or give "
                "it a literal value: for a local run)"
            )
    return notes, problems


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


def _start_ray(plan: RunPlan, display: ProgressDisplay, verbose: bool) -> WorkerLogSink | None:
    """Start (or join) Ray; the workers' output goes to a file instead of this terminal."""
    import ray

    # Ray's own driver-side messages (its "ray" logger prints to stderr by itself) go through
    # the display, as every other log record does.
    ray_logger = logging.getLogger("ray")
    ray_logger.handlers = [
        h for h in logging.getLogger().handlers if isinstance(h, DisplayLogHandler)
    ]
    dispatcher = _dispatcher()
    log_to_driver = dispatcher is not None or verbose
    if os.environ.get("RAY_ADDRESS"):
        ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=log_to_driver)
    else:
        validation = plan.job.spec.validation
        slots = float(validation.max_concurrent if validation else 1)
        needed = plan.num_workers * plan.worker_cpus + slots
        ray.init(
            address="local",
            num_cpus=max(os.cpu_count() or 1, int(needed + 0.999)),
            resources={"validation": slots},
            include_dashboard=False,
            log_to_driver=log_to_driver,
            configure_logging=False,
            runtime_env={
                "env_vars": {
                    "PYTHONPATH": os.pathsep.join(
                        p for p in (os.getcwd(), os.environ.get("PYTHONPATH", "")) if p
                    )
                }
            },
        )
    logs_dir = _ray_logs_dir()
    if dispatcher is None:  # pragma: no cover - not in the pinned Ray
        if logs_dir is not None and not verbose:
            display.message(f"Ray worker logs: {logs_dir} (--verbose shows them here)")
        return None
    folder = logs_dir if logs_dir is not None else Path(tempfile.mkdtemp(prefix="trainjob-"))
    sink = WorkerLogSink(
        folder / "trainjob-workers.log",
        display,
        verbose=verbose,
        autoscaler_events=_autoscaler_events(),
        title=f"trainjob run {plan.job.metadata.name}: the Ray workers' stdout and stderr",
    )
    dispatcher.remove_handler("ray_print_logs")
    dispatcher.add_handler("trainjob_worker_logs", sink)
    also = "also shown below" if verbose else "--verbose shows them here"
    display.message(f"Ray worker logs: {sink.path} ({also})")
    return sink


def _dispatcher() -> Any:
    """Where Ray hands the driver each batch of worker output (``log_to_driver``), or None."""
    try:
        from ray._private import ray_logging
    except ImportError:  # pragma: no cover - not in the pinned Ray
        return None
    return getattr(ray_logging, "global_worker_stdstream_dispatcher", None)


def _autoscaler_events() -> Any:
    """Ray's filter keeping the events of the autoscaler's output, or None."""
    try:
        from ray._private import worker as ray_worker
    except ImportError:  # pragma: no cover - not in the pinned Ray
        return None
    return getattr(ray_worker, "filter_autoscaler_events", None)


def _ray_logs_dir() -> Path | None:
    """This session's Ray log folder, when it is on this machine."""
    try:
        from ray._private import worker as ray_worker

        node: Any = ray_worker._global_node
        folder = Path(node.get_logs_dir_path())
    except Exception:  # noqa: BLE001 - private API; a temporary folder will do
        return None
    return folder if folder.is_dir() else None


def _stop_ray(sink: WorkerLogSink | None) -> None:
    import ray

    ray.shutdown()
    if sink is not None:
        _dispatcher().remove_handler("trainjob_worker_logs")
        sink.close()


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
    if not os.environ.get("RAY_ADDRESS") and "ray" not in sys.modules:
        # A fresh local Ray turns on token authentication unless RAY_AUTH_MODE is set, and
        # prints that it did; choose the same mode explicitly (read when Ray is imported).
        os.environ.setdefault("RAY_AUTH_MODE", "token")
    job = _load(args.manifest)
    if job is None:
        return EXIT_INVALID
    if args.num_workers is not None and args.num_workers < 0:
        print("--num-workers: must be >= 0 (0 runs in this process)", file=sys.stderr)
        return EXIT_INVALID
    metrics_port = getattr(args, "metrics_port", None)
    if metrics_port is not None:
        # read by the run's controller when it starts (trainer_runtime._driver_metrics)
        os.environ[METRICS_PORT_ENV] = str(metrics_port)
    try:
        # The manifest's entrypoints are imported from the current folder (documented).
        plan = _plan_run(
            job,
            num_workers=args.num_workers,
            storage_path=args.storage_path,
            import_from=os.getcwd(),
        )
    except (EntrypointError, ValueError) as exc:
        print(f"{args.manifest}: {exc}", file=sys.stderr)
        return EXIT_INVALID
    capacity = local_capacity_problem(plan)
    notes, problems = env_from_problems(job)
    for problem in [capacity, *problems] if capacity else problems:
        print(f"{args.manifest}: {problem}", file=sys.stderr)
    if capacity or problems:
        return EXIT_INVALID
    if job.spec.runtime_env is not None and not job.spec.runtime_env.is_empty():
        notes.append(
            "spec.runtimeEnv applies on a cluster only: trainjob run imports from this folder "
            "and uses this machine's packages and environment"
        )
    for note in notes:
        print(f"{args.manifest}: {note}", file=sys.stderr)
    verbose = bool(getattr(args, "verbose", False))
    out = sys.stdout
    score_attribute = job.spec.checkpoint.score_attribute
    tracker = StatusTracker(score_attribute)
    display = ProgressDisplay(
        tracker,
        out,
        sys.stderr,
        live=is_live(out),
        workers=plan.num_workers,
        score_attribute=score_attribute,
    )
    log_handler = DisplayLogHandler(display, logging.INFO if verbose else logging.WARNING)
    root = logging.getLogger()
    root.addHandler(log_handler)
    root.setLevel(logging.WARNING)
    for name in ("trainer_runtime", "trainjob_operator"):
        logging.getLogger(name).setLevel(logging.INFO if verbose else logging.WARNING)
    logging.captureWarnings(True)  # Python warnings too go through the display
    try:
        return _run(job, plan, tracker, display, verbose, args.output, out, args.manifest)
    finally:
        display.stop()
        logging.captureWarnings(False)
        root.removeHandler(log_handler)


def _run(
    job: Any,
    plan: RunPlan,
    tracker: StatusTracker,
    display: ProgressDisplay,
    verbose: bool,
    output: str | None,
    out: TextIO,
    manifest: str,
) -> int:
    """Start Ray (for Ray workers), build the trainer, fit, report.

    The trainer is built once Ray runs: the datasets function of ``spec.data`` may put rows in
    Ray's object store (``ray.data.from_items``), and called before Ray runs it would start a
    second Ray. A ``ValueError`` building it (what the datasets function returned, named)
    exits 2."""
    mode = "in this process" if plan.num_workers == 0 else f"{plan.num_workers} Ray worker(s)"
    display.message(
        f"TrainJob {job.metadata.name}: {job.spec.entrypoint} on {mode}, storage "
        f"{plan.storage_path}"
    )
    display.start()

    sink: WorkerLogSink | None = None
    error: BaseException | None = None
    invalid: ValueError | None = None
    try:
        if plan.num_workers > 0:
            sink = _start_ray(plan, display, verbose)
        try:
            trainer = build_trainer(plan, [tracker, display])
        except ValueError as exc:
            invalid = exc
        else:
            trainer.fit()
    except TrainerRuntimeError as exc:  # TrainingFailedError, and any error the runtime names
        error = exc
    except KeyboardInterrupt:
        error = KeyboardInterrupt("interrupted")
    finally:
        if plan.num_workers > 0:
            _stop_ray(sink)
    if invalid is not None:
        print(f"{manifest}: {invalid}", file=sys.stderr)
        return EXIT_INVALID
    status = tracker.finish(error)
    display.close(status)
    document = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": job.metadata.name},
        "status": status,
    }
    _write_output(output, document, out)
    if error is not None:
        print(f"TrainJob {job.metadata.name} Failed: {error}", file=sys.stderr)
        if sink is not None:
            print(f"Ray worker logs: {sink.path}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK
