"""The cluster verbs of ``trainjob`` (and ``kubectl trainjob``): ``submit``, ``logs``,
``list``, ``status``, ``checkpoints``, ``suspend``, ``resume``, ``delete`` and ``dashboard``.

Built on :class:`~trainjob_operator.sdk.TrainJobClient`; registered by
:mod:`trainjob_operator.cli`, which imports this module only when one of them runs.

``submit --follow`` shows the progress display of ``trainjob run``
(:class:`~trainjob_operator.launcher.progress.ProgressDisplay`: event lines, a live status line
on a terminal, plain lines under CI), fed from the TrainJob's status and Events
(:class:`StatusFeed`). Exit status: 0 Succeeded, 1 Failed, 2 invalid input (one line, nothing
created), 130 when Ctrl-C stopped following (the job keeps running).
"""

from __future__ import annotations

import argparse
import datetime as dt
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from trainjob_operator.api.status import Phase
from trainjob_operator.api.trainjob import TrainJob
from trainjob_operator.constants import GROUP, KIND
from trainjob_operator.launcher.progress import ProgressDisplay, format_metrics, is_live
from trainjob_operator.launcher.status import StatusTracker
from trainjob_operator.render.names import ray_auth_secret_name
from trainjob_operator.render.ray import DASHBOARD_PORT
from trainjob_operator.render.security import RAY_AUTH_SECRET_KEY
from trainjob_operator.sdk import (
    ConfigError,
    TrainJobClient,
    TrainJobError,
    TrainJobNotFound,
    run_folder,
)

__all__ = [
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "StatusFeed",
    "checkpoints_command",
    "dashboard_command",
    "dashboard_refusal",
    "delete_command",
    "follow",
    "list_command",
    "logs_command",
    "port_forward_command",
    "resume_command",
    "status_command",
    "submit_command",
    "suspend_command",
]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_INVALID = 2  # cli.EXIT_INVALID
EXIT_INTERRUPTED = 130
_RESOURCE = f"{KIND.lower()}.{GROUP}"
"""How kubectl names the resource in its messages (``<kind>.<group>/NAME created``)."""


def _client(args: argparse.Namespace) -> TrainJobClient:
    return TrainJobClient(
        namespace=args.namespace, context=args.context, kubeconfig=args.kubeconfig
    )


def _fail(exc: TrainJobError, err: TextIO) -> int:
    """One line for an SDK error; 2 for invalid input, else 1."""
    print(f"trainjob: {exc}", file=err)
    return EXIT_INVALID if exc.invalid_input else EXIT_FAILED


def _guard(command: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        try:
            return command(args)
        except TrainJobError as exc:
            return _fail(exc, sys.stderr)

    run.__doc__ = command.__doc__
    run.__name__ = command.__name__
    return run


# --------------------------------------------------------------------------- follow


class _RemoteStatus(StatusTracker):
    """A StatusTracker holding the TrainJob's status as last read from the API server."""

    def replace(self, status: dict[str, Any]) -> None:
        with self._lock:
            self.status = dict(status)


class StatusFeed:
    """Turns successive TrainJob statuses and Events into the progress display's lines.

    The lines are those of ``trainjob run``: the phase as it changes (with
    ``status.message``), each newly committed checkpoint (latest, with the reported metrics),
    each new best validated checkpoint (with the metrics its validation added), the
    operator's Events (reason and message), and the outcome (:meth:`ProgressDisplay.close`).

    The operator posts an Event for each phase change, with the status's message, alongside
    the status write; so a phase change is told once: by its Event when one comes by the next
    poll, else by a ``Phase: message`` line (and an Event arriving after that line is not
    printed again). Events that say what the final line says (the terminal phase's) are left
    to that line.
    """

    def __init__(self, display: ProgressDisplay, tracker: _RemoteStatus, uid: str | None) -> None:
        self.display = display
        self.tracker = tracker
        self.uid = uid
        self._phase: str | None = None
        self._step: Any = None
        self._latest: str | None = None
        self._best: tuple[Any, Any] | None = None
        self._events: set[str] = set()
        self._seen: list[dict[str, Any]] = []  # this job's Events, printed or not
        self._told: set[tuple[str, str]] = set()  # (phase, message) a phase line printed
        self._pending: tuple[str, str] | None = None  # a phase change no Event told yet
        self._waited = 0  # polls since it

    def _own(self, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """This TrainJob's Events not seen before (an older TrainJob of the same name's are
        left out)."""
        new = []
        for event in events:
            key = event["metadata"].get("uid") or event["metadata"]["name"]
            involved = event.get("involvedObject") or {}
            if key in self._events or (self.uid and involved.get("uid") not in (None, self.uid)):
                continue
            self._events.add(key)
            new.append(event)
        return new

    @staticmethod
    def _announces(event: dict[str, Any], phase: str, message: str) -> bool:
        """Whether ``event`` is the operator's Event of the move to ``phase``."""
        text = str(event.get("message", ""))
        return (
            event.get("reason") == phase
            or (bool(message) and text == message)
            or f"; {phase}: " in text  # the first phase, in the Created Event
        )

    def update(self, status: dict[str, Any], events: list[dict[str, Any]]) -> None:
        """Show what changed since the last call."""
        self.tracker.replace(status)
        display = self.display
        phase = status.get("phase")
        message = str(status.get("message") or "")
        finished = phase in (Phase.SUCCEEDED, Phase.FAILED)
        new = self._own(events)
        self._seen.extend(new)
        for event in new:
            text = str(event.get("message", ""))
            if any(text == m or text.endswith(f"{p}: {m}") for p, m in self._told):
                continue  # a phase line told it already
            if finished and self._announces(event, str(phase), message):
                continue  # the final line tells it
            kind = "warning " if event.get("type") == "Warning" else ""
            display.event(f"{kind}{event.get('reason')}: {text}".rstrip())
        if phase and phase != self._phase:
            self._pending, self._waited = (None if finished else (phase, message)), 0
        if self._pending is not None:
            # The Event is posted alongside the status: wait one poll for it.
            told_by_event = any(self._announces(e, *self._pending) for e in self._seen)
            if told_by_event or self._waited >= 1:
                if not told_by_event:
                    pending_phase, pending_message = self._pending
                    display.event(
                        pending_phase + (f": {pending_message}" if pending_message else "")
                    )
                    self._told.add(self._pending)
                self._pending = None
            self._waited += 1
        self._phase = phase or self._phase
        progress = status.get("progress") or {}
        reported = set((progress.get("metrics") or {}).keys())
        if progress.get("step") is not None and progress.get("step") != self._step:
            self._step = progress.get("step")
            display.observe(reported=True)
        latest = status.get("latestCheckpoint") or {}
        if latest.get("path") and latest["path"] != self._latest:
            self._latest = latest["path"]
            name = Path(str(latest["path"])).name
            display.observe(committed=name)
            metrics = format_metrics(_split_metrics(latest.get("metrics"), reported)[0])
            step = latest.get("step")
            display.event(f"{name} committed (step {step}" + (f": {metrics})" if metrics else ")"))
        validations = status.get("validations") or {}
        display.observe(
            validating=int(validations.get("pending", 0)) + int(validations.get("running", 0))
        )
        best = status.get("bestCheckpoint") or {}
        if best.get("path") and (best["path"], best.get("score")) != self._best:
            self._best = (best["path"], best.get("score"))
            if validations.get("done"):
                added = _split_metrics(best.get("metrics"), reported)[1]
                score = display.score_attribute
                if score in added:  # the score first, as trainjob run shows it
                    added = {score: added.pop(score), **added}
                metrics = format_metrics(added)
                name = Path(str(best["path"])).name
                display.event(
                    f"{name} validated" + (f": {metrics}" if metrics else "") + " (best so far)"
                )


def _split_metrics(
    metrics: dict[str, Any] | None, reported: set[str]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A checkpoint's metrics as (those the training reported, those its validation added),
    told apart by the keys of the latest report (``status.progress.metrics``); all of them on
    both sides when that tells nothing apart."""
    metrics = dict(metrics or {})
    train = {k: v for k, v in metrics.items() if k in reported}
    added = {k: v for k, v in metrics.items() if k not in reported}
    if not reported or not train or not added:
        return metrics, metrics
    return train, added


def follow(
    client: TrainJobClient,
    name: str,
    out: TextIO,
    err: TextIO,
    *,
    poll_interval: float = 2.0,
    live: bool | None = None,
) -> int:
    """Show the TrainJob's progress until it ends: 0 Succeeded, 1 Failed (or deleted while
    followed), 130 on Ctrl-C (the job keeps running)."""
    job = client.get(name)
    tracker = _RemoteStatus(job.spec.checkpoint.score_attribute)
    display = ProgressDisplay(
        tracker,
        out,
        err,
        live=is_live(out) if live is None else live,
        workers=job.spec.scaling.num_workers,
        score_attribute=job.spec.checkpoint.score_attribute,
    )
    feed = StatusFeed(display, tracker, job.metadata.uid)
    display.start()
    try:
        while True:
            obj = client.get_object(name)
            status = obj.get("status") or {}
            feed.update(status, client.events(name))
            phase = status.get("phase")
            if phase in (Phase.SUCCEEDED, Phase.FAILED):
                display.close(status)
                return EXIT_OK if phase == Phase.SUCCEEDED else EXIT_FAILED
            time.sleep(poll_interval)
    except KeyboardInterrupt:
        display.stop()
        ns = client.namespace
        print(
            f"Stopped following TrainJob {ns}/{name}; it keeps running. Follow it again: "
            f"trainjob logs -n {ns} {name} -f; stop it: trainjob delete -n {ns} {name} "
            f"(or trainjob suspend -n {ns} {name} to keep its pods' capacity free and resume "
            "later).",
            file=err,
        )
        return EXIT_INTERRUPTED
    except TrainJobNotFound:
        display.stop()
        print(
            f"trainjob: TrainJob {client.namespace}/{name}: deleted while it was followed "
            "(its storage is kept)",
            file=err,
        )
        return EXIT_FAILED
    except TrainJobError:
        display.stop()
        raise


# --------------------------------------------------------------------------- verbs


@_guard
def submit_command(args: argparse.Namespace) -> int:
    """``trainjob submit MANIFEST [--working-dir DIR] [--follow]``."""
    client = _client(args)
    job = client.submit(
        args.manifest,
        working_dir=args.working_dir,
        entrypoint_in_image=args.entrypoint_in_image,
    )
    ns = client.namespace
    runtime_env = job.spec.runtime_env
    if args.working_dir and runtime_env is not None and runtime_env.working_dir:
        print(f"Uploaded {args.working_dir} to {runtime_env.working_dir}")
    print(f"{_RESOURCE}/{job.name} created in namespace {ns}")
    if not args.follow:
        print(
            f"Follow it: trainjob logs -n {ns} {job.name} -f (the driver's output) or "
            f"trainjob status -n {ns} {job.name}"
        )
        return EXIT_OK
    return follow(client, job.name, sys.stdout, sys.stderr)


@_guard
def logs_command(args: argparse.Namespace) -> int:
    """``trainjob logs NAME [-f] [--role ROLE] [--rank N]``."""
    client = _client(args)
    try:
        for line in client.logs(
            args.name, follow=args.follow, role=args.role, rank=args.rank, tail_lines=args.tail
        ):
            print(line, flush=args.follow)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    return EXIT_OK


def _age(timestamp: str | None, now: dt.datetime | None = None) -> str:
    if not timestamp:
        return "?"
    then = dt.datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    seconds = int(((now or dt.datetime.now(dt.UTC)) - then).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{max(seconds, 0)}s"


def _table(rows: list[list[str]], out: TextIO) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip(), file=out)


def list_rows(jobs: list[TrainJob], now: dt.datetime | None = None) -> list[list[str]]:
    """The rows of ``trainjob list``: name, phase, step, latest metric, best checkpoint, age."""
    rows = [["NAME", "PHASE", "STEP", "METRICS", "BEST", "AGE"]]
    for job in jobs:
        status = job.status
        progress = status.progress if status else None
        best = status.best_checkpoint if status else None
        best_text = ""
        if best is not None:
            best_text = Path(best.path).name
            if best.score is not None and job.spec.checkpoint.score_attribute:
                best_text += f" {job.spec.checkpoint.score_attribute}={best.score:.4g}"
        rows.append(
            [
                job.name,
                str(status.phase) if status and status.phase else "Pending",
                str(progress.step) if progress and progress.step is not None else "",
                format_metrics(progress.metrics, limit=2) if progress else "",
                best_text,
                _age(job.metadata.creation_timestamp, now),
            ]
        )
    return rows


@_guard
def list_command(args: argparse.Namespace) -> int:
    """``trainjob list``."""
    client = _client(args)
    jobs = client.list()
    if not jobs:
        print(f"No TrainJobs in namespace {client.namespace}.")
        return EXIT_OK
    _table(list_rows(jobs), sys.stdout)
    return EXIT_OK


def status_lines(obj: dict[str, Any], events: list[dict[str, Any]]) -> list[str]:
    """What ``trainjob status`` prints: phase and message, conditions, restarts with their
    reasons, checkpoints, recent Events."""
    meta = obj["metadata"]
    status = obj.get("status") or {}
    lines = [f"TrainJob {meta.get('namespace')}/{meta['name']}: {status.get('phase', 'Pending')}"]
    if status.get("message"):
        lines.append(f"  {status['message']}")
    progress = status.get("progress") or {}
    if progress:
        lines.append(f"Step {progress.get('step')}: {format_metrics(progress.get('metrics'))}")
    workers = status.get("workers") or {}
    if workers:
        lines.append(f"Workers: {workers.get('ready', 0)}/{workers.get('desired', 0)} ready")
    lines.append("Conditions:")
    for c in status.get("conditions") or []:
        lines.append(
            f"  {c.get('type')}={c.get('status')} {c.get('reason', '')}: {c.get('message', '')}"
        )
    restarts = status.get("restartHistory") or []
    lines.append(
        f"Restarts: {status.get('restarts', 0)} counted, {status.get('ignoredRestarts', 0)} "
        f"not counted, {status.get('workerFailures', 0)} worker-group failure(s)"
    )
    for r in restarts[-5:]:
        counted = "counted" if r.get("counted", True) else "not counted"
        lines.append(
            f"  attempt {r.get('attempt')} {r.get('time', '')} {r.get('reason')} ({counted}): "
            f"{r.get('message', '')}"
        )
    for key, label in (("latestCheckpoint", "Latest checkpoint"), ("bestCheckpoint", "Best")):
        ckpt = status.get(key)
        if ckpt:
            metrics = format_metrics(ckpt.get("metrics"))
            lines.append(f"{label}: {ckpt.get('path')} (step {ckpt.get('step')}: {metrics})")
    validations = status.get("validations")
    if validations:
        lines.append(
            "Validations: "
            + ", ".join(f"{validations.get(k, 0)} {k}" for k in ("pending", "running", "done"))
            + f", {validations.get('failed', 0)} failed"
        )
    if events:
        lines.append("Events (most recent last):")
        for e in events[-10:]:
            when = e.get("lastTimestamp") or e.get("eventTime") or ""
            lines.append(f"  {when} {e.get('type')} {e.get('reason')}: {e.get('message', '')}")
    return lines


@_guard
def status_command(args: argparse.Namespace) -> int:
    """``trainjob status NAME``."""
    client = _client(args)
    obj = client.get_object(args.name)
    for line in status_lines(obj, client.events(args.name)):
        print(line)
    return EXIT_OK


@_guard
def checkpoints_command(args: argparse.Namespace) -> int:
    """``trainjob checkpoints NAME``: the kept checkpoints, read from storage."""
    client = _client(args)
    job = client.get(args.name)
    result = client.result(args.name)
    score = job.spec.checkpoint.score_attribute
    records = list(getattr(result, "checkpoints", []) or [])
    print(f"Run folder: {run_folder(job)}")
    if not records:
        print("No committed checkpoints yet.")
        return EXIT_OK
    rows = [["CHECKPOINT", "STEP", "VALIDATION", "METRICS", "PATH"]]
    for record in records:
        metrics = record.all_metrics
        shown = dict(metrics)
        if score and score in shown:  # the score first
            shown = {score: shown.pop(score), **shown}
        rows.append(
            [
                record.name,
                str(record.round),
                str(record.status.value if hasattr(record.status, "value") else record.status),
                format_metrics(shown, limit=4),
                record.path,
            ]
        )
    _table(rows, sys.stdout)
    best = result.best_checkpoint
    latest = result.checkpoint
    if best is not None:
        print(f"Best: {best.path}")
    if latest is not None:
        print(f"Latest: {latest.path} (a run with this storage path and name resumes from it)")
    return EXIT_OK


@_guard
def suspend_command(args: argparse.Namespace) -> int:
    """``trainjob suspend NAME``."""
    client = _client(args)
    client.suspend(args.name)
    print(f"{_RESOURCE}/{args.name} suspended (its pods are deleted; checkpoints are kept)")
    return EXIT_OK


@_guard
def resume_command(args: argparse.Namespace) -> int:
    """``trainjob resume NAME``."""
    client = _client(args)
    client.resume(args.name)
    print(f"{_RESOURCE}/{args.name} resumed (from its latest checkpoint)")
    return EXIT_OK


@_guard
def delete_command(args: argparse.Namespace) -> int:
    """``trainjob delete NAME``."""
    client = _client(args)
    client.delete(args.name)
    print(f"{_RESOURCE}/{args.name} deleted (storage is kept)")
    return EXIT_OK


def dashboard_refusal(obj: dict[str, Any]) -> str | None:
    """Why ``trainjob dashboard`` cannot reach the TrainJob ``obj``'s dashboard, with the fix
    (None when ``status.dashboard`` names its Service)."""
    status = obj.get("status") or {}
    if status.get("dashboard"):
        return None
    meta = obj["metadata"]
    ns, name = meta.get("namespace"), meta["name"]
    wanted = ((obj.get("spec") or {}).get("ray") or {}).get("dashboard") or {}
    if wanted.get("service"):
        return (
            f"TrainJob {ns}/{name}: its dashboard Service is not there (phase "
            f"{status.get('phase', 'Pending')}): the dashboard runs on the job's Ray head, "
            "which only a starting or running job has"
        )
    return (
        f"TrainJob {ns}/{name}: it has no dashboard Service; add one (its pods keep running): "
        f"kubectl -n {ns} patch trainjob {name} --type merge -p "
        """'{"spec":{"ray":{"dashboard":{"service":true}}}}'"""
    )


def port_forward_command(
    kubectl: str,
    namespace: str,
    dashboard: dict[str, Any],
    port: int,
    context: str | None = None,
    kubeconfig: str | Path | None = None,
) -> list[str]:
    """The ``kubectl port-forward`` argv that makes ``status.dashboard``'s Service (the Ray
    head's dashboard port) local on ``port``, with the kubeconfig and context of the command
    that asked."""
    command = [kubectl]
    if kubeconfig:
        command += ["--kubeconfig", str(kubeconfig)]
    if context:
        command += ["--context", context]
    return [
        *command,
        "-n",
        namespace,
        "port-forward",
        f"svc/{dashboard['service']}",
        f"{port}:{DASHBOARD_PORT}",
    ]


@_guard
def dashboard_command(args: argparse.Namespace) -> int:
    """``trainjob dashboard NAME``: port-forward the job's Ray dashboard (kubectl)."""
    client = _client(args)
    obj = client.get_object(args.name)
    refusal = dashboard_refusal(obj)
    if refusal is not None:
        print(f"trainjob: {refusal}", file=sys.stderr)
        return EXIT_INVALID
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        raise ConfigError(
            "kubectl is not on PATH (the port-forward runs it)",
            name=args.name,
            namespace=client.namespace,
        )
    ns = client.namespace
    command = port_forward_command(
        kubectl, ns, obj["status"]["dashboard"], args.port, args.context, args.kubeconfig
    )
    secret = ray_auth_secret_name(args.name)
    print(f"Ray dashboard of {ns}/{args.name}: http://127.0.0.1:{args.port} (Ctrl-C stops)")
    print(
        f"Its auth token: kubectl -n {ns} get secret {secret} -o "
        f"jsonpath='{{.data.{RAY_AUTH_SECRET_KEY}}}' | base64 -d",
        flush=True,
    )
    try:
        return subprocess.call(command)
    except KeyboardInterrupt:
        return EXIT_OK
