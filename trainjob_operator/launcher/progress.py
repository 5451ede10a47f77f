"""The progress display of ``trainjob run``.

One display, two renderings of the same state (phase, step and latest metrics, checkpoints
committed and validated, best so far, elapsed time):

- **live** (stdout is a terminal and ``CI`` is not set): events (workers started, checkpoints
  committed and validated, failures) print as lines, and one status line below them is
  rewritten in place (``\\r``) every second and on every report;
- **plain** (output piped or redirected, or ``CI=true``): the same event lines, plus a
  ``step N: metrics`` line when nothing was printed for ``interval`` seconds and a newer report
  came in. No control characters.

Everything else that would print while the display runs (log records, the Ray workers' output
with ``--verbose``) goes through :meth:`ProgressDisplay.message` so that it never tears the
status line. The display reads the run's state from the :class:`StatusTracker` (so it shows
what the final status will say) and must be registered after it.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TextIO

from trainer_runtime.callbacks import Callback
from trainer_runtime.checkpoint_manager import CheckpointRecord, CheckpointStatus
from trainjob_operator.launcher.status import StatusTracker, step_of

__all__ = ["DisplayLogHandler", "ProgressDisplay", "WorkerLogSink", "format_elapsed", "is_live"]

_CLEAR = "\r\x1b[K"
_OUTCOMES = {
    CheckpointStatus.VALIDATED: "validated",
    CheckpointStatus.VALIDATION_FAILED: "validation failed",
    CheckpointStatus.VALIDATION_TIMEOUT: "validation timed out",
    CheckpointStatus.VALIDATION_LOST: "validation lost",
}


def is_live(out: TextIO, environ: dict[str, str] | None = None) -> bool:
    """Whether ``out`` gets the live status line: a terminal, outside CI, not a dumb one."""
    env = os.environ if environ is None else environ
    if env.get("CI", "").strip().lower() not in ("", "0", "false", "no"):
        return False
    if env.get("TERM") == "dumb":
        return False
    isatty = getattr(out, "isatty", None)
    return bool(isatty and isatty())


def format_elapsed(seconds: float) -> str:
    """``9.5s``, ``4m05s``, ``2h03m``."""
    if seconds < 60:
        return f"{seconds:.1f}s"
    whole = int(seconds)
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


def format_metrics(metrics: dict[str, Any] | None, limit: int = 4) -> str:
    """``key=value`` pairs, floats to 4 significant digits, at most ``limit`` of them."""
    parts = []
    for key, value in list((metrics or {}).items())[:limit]:
        shown = f"{value:.4g}" if isinstance(value, float) else str(value)
        parts.append(f"{key}={shown}")
    return " ".join(parts)


class ProgressDisplay(Callback):
    """The run's progress for a person: event lines plus a live status line on a terminal."""

    def __init__(
        self,
        tracker: StatusTracker,
        out: TextIO,
        err: TextIO,
        *,
        live: bool,
        workers: int,
        score_attribute: str | None = None,
        interval: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        width: Callable[[], int] | None = None,
    ) -> None:
        self.tracker = tracker
        self.out = out
        self.err = err
        self.live = live
        self.workers = workers
        self.score_attribute = score_attribute
        self.interval = interval
        self.clock = clock
        self.width = width or (lambda: shutil.get_terminal_size((100, 24)).columns)
        self.start_time = clock()
        self._lock = threading.RLock()
        self._committed: set[str] = set()
        self._validating = 0
        self._last_round = -1
        self._shown_round = -1
        self._last_print = self.start_time
        self._line_shown = False
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None

    # ---------------------------------------------------------------- output

    def _elapsed(self) -> str:
        return format_elapsed(self.clock() - self.start_time)

    def _write(self, stream: TextIO, text: str) -> None:
        """Print ``text`` above the status line (which is redrawn after it)."""
        with self._lock:
            if self._line_shown:
                self.out.write(_CLEAR)
                self.out.flush()
                self._line_shown = False
            stream.write(text + "\n")
            stream.flush()
            self._redraw()

    def message(self, text: str, *, error: bool = False) -> None:
        """A line that is not an event (a log record, a worker's output, a note)."""
        self._write(self.err if error else self.out, text)

    def event(self, text: str) -> None:
        """A timestamped event line."""
        with self._lock:
            self._last_print = self.clock()
            self._write(self.out, f"[{self._elapsed():>7}] {text}")

    def status_line(self) -> str:
        """The run's state in one line (what the live line shows)."""
        status = self.tracker.snapshot()
        phase = status.get("phase", "Starting")
        parts = [f"[{self._elapsed():>7}] {phase}"]
        progress = status.get("progress")
        if progress:
            metrics = format_metrics(progress.get("metrics"))
            parts.append(f"step {progress.get('step')}" + (f": {metrics}" if metrics else ""))
        elif phase == "Starting":
            parts[0] += f" {self.workers} worker(s)" if self.workers else ""
        counts = status.get("validations", {})
        if self._committed:
            text = f"checkpoints {len(self._committed)}"
            extra = []
            if counts.get("done"):
                extra.append(f"{counts['done']} validated")
            if counts.get("failed"):
                extra.append(f"{counts['failed']} failed validation")
            if self._validating:
                extra.append(f"{self._validating} validating")
            parts.append(text + (f" ({', '.join(extra)})" if extra else ""))
        best = self._best_text(status)
        if best:
            parts.append(best)
        return " | ".join(parts)

    def _best_text(self, status: dict[str, Any]) -> str:
        best = status.get("bestCheckpoint")
        if not best or not self.score_attribute or best.get("score") is None:
            return ""
        score = best["score"]
        shown = f"{score:.4g}" if isinstance(score, float) else str(score)
        return f"best {Path(str(best.get('path', ''))).name} {self.score_attribute}={shown}"

    def _redraw(self) -> None:
        if not self.live or self._stop.is_set():
            return
        with self._lock:
            line = self.status_line()
            limit = max(self.width() - 1, 20)
            if len(line) > limit:
                line = line[: limit - 3] + "..."
            self.out.write(_CLEAR + line)
            self.out.flush()
            self._line_shown = True

    def observe(
        self, committed: str | None = None, validating: int | None = None, reported: bool = False
    ) -> None:
        """For a display fed from a TrainJob's status rather than from the run's callbacks
        (``trainjob submit --follow``): count a committed checkpoint, set the validations in
        flight, note a new report (``reported``: a plain display prints its step line)."""
        with self._lock:
            if committed is not None:
                self._committed.add(committed)
            if validating is not None:
                self._validating = validating
            if reported:
                self._last_round += 1
            self._redraw()

    # ---------------------------------------------------------------- life cycle

    def start(self) -> None:
        """Start the ticker (live: redraw every second; plain: a step line when quiet)."""
        self._redraw()
        self._ticker = threading.Thread(target=self._tick, name="trainjob-progress", daemon=True)
        self._ticker.start()

    def _tick(self) -> None:
        while not self._stop.wait(1.0):
            self.tick()

    def tick(self) -> None:
        """One tick of the ticker."""
        with self._lock:
            if self.live:
                self._redraw()
            elif (
                self._last_round > self._shown_round
                and self.clock() - self._last_print >= self.interval
            ):
                self._shown_round = self._last_round
                progress = self.tracker.snapshot().get("progress") or {}
                self.event(
                    f"step {progress.get('step')}: {format_metrics(progress.get('metrics'))}"
                )

    def stop(self) -> None:
        """Stop the ticker and take the live line off the screen."""
        self._stop.set()
        if self._ticker is not None and self._ticker is not threading.current_thread():
            self._ticker.join(timeout=5)
        with self._lock:
            if self._line_shown:
                self.out.write(_CLEAR)
                self.out.flush()
                self._line_shown = False

    def close(self, status: dict[str, Any]) -> None:
        """Stop the live line and print the outcome (from the final ``status``)."""
        self.stop()
        with self._lock:
            phase = status.get("phase", "?")
            summary = str(phase)
            if phase == "Succeeded":
                progress = status.get("progress")
                details = []
                if progress:
                    details.append(f"step {progress.get('step')}")
                if self._committed:
                    counts = status.get("validations", {})
                    validated = f" ({counts['done']} validated)" if counts.get("done") else ""
                    details.append(f"{len(self._committed)} checkpoint(s){validated}")
                best = self._best_text(status)
                if best:
                    details.append(best)
                if details:
                    summary += ": " + ", ".join(details)
            elif status.get("message"):
                summary += f": {status['message']}"
            self._last_print = self.clock()
            self._write(self.out, f"[{self._elapsed():>7}] {summary}")

    # ---------------------------------------------------------------- callbacks

    def on_run_start(self, run_path: str, world_size: int, attempt: int) -> None:
        """Workers started."""
        again = f" (restart {attempt})" if attempt else ""
        self.event(f"Running: {world_size} worker(s) started{again}; run folder {run_path}")

    def on_report(self, round_index: int, metrics: dict[str, Any]) -> None:
        """A report: the live line shows it at once, plain lines when quiet."""
        with self._lock:
            self._last_round = max(self._last_round, round_index)
            self._redraw()

    def on_checkpoint(self, record: CheckpointRecord, best: CheckpointRecord | None) -> None:
        """Committed (with the round's metrics), then validated (with its metrics)."""
        with self._lock:
            if record.name not in self._committed:
                self._committed.add(record.name)
                self._shown_round = max(self._shown_round, record.round)
                step = step_of(record.metrics, record.round)
                metrics = format_metrics(record.metrics)
                queued = (
                    ", validation queued"
                    if record.status == CheckpointStatus.PENDING_VALIDATION
                    else ""
                )
                self.event(
                    f"{record.name} committed (step {step}"
                    + (f": {metrics}" if metrics else "")
                    + f"){queued}"
                )
            outcome = _OUTCOMES.get(record.status)
            if outcome is None:
                return
            if record.validation_error:
                detail = f": {record.validation_error.splitlines()[0]}"
            elif record.validation_metrics:
                detail = f": {format_metrics(record.validation_metrics)}"
            else:
                detail = ""
            is_best = (
                best is not None and best.name == record.name and self.score_attribute is not None
            )
            self.event(f"{record.name} {outcome}{detail}" + (" (best so far)" if is_best else ""))

    def on_validation_queue(self, queued: int, running: int, waiting: int) -> None:
        """Validations queued or running (shown on the live line)."""
        with self._lock:
            self._validating = queued + running
            self._redraw()

    def on_failure(self, error: BaseException, failures: int, will_restart: bool) -> None:
        """The worker group failed."""
        what = "restarting from the latest checkpoint" if will_restart else "giving up"
        first = (str(error).splitlines() or [type(error).__name__])[0]
        self.event(f"worker group failed ({failures}): {first} ({what})")


class DisplayLogHandler(logging.Handler):
    """Log records printed through the display (stderr), so they never tear the live line."""

    def __init__(self, display: ProgressDisplay, level: int = logging.WARNING) -> None:
        super().__init__(level)
        self.display = display
        self.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        """Print one record."""
        try:
            self.display.message(self.format(record), error=True)
        except Exception:  # noqa: BLE001 - logging's contract: report, never raise
            self.handleError(record)


class WorkerLogSink:
    """The Ray workers' stdout/stderr, written to one file (and shown with ``verbose``).

    Ray forwards every worker's output to the driver (``log_to_driver``) and prints it with a
    ``(TrainWorker pid=...)`` prefix; this replaces that printer: lines go to ``path`` with the
    same prefix (no colours, no de-duplication), and through ``display`` when ``verbose``.
    The autoscaler's batches keep only its events (``autoscaler_events``, Ray's own filter;
    none without it), as Ray's printer does; they are rare (a resource request that cannot be
    scheduled) and always shown.
    """

    def __init__(
        self,
        path: Path,
        display: ProgressDisplay,
        *,
        verbose: bool = False,
        autoscaler_events: Callable[[list[str]], Iterable[str]] | None = None,
        title: str = "",
    ) -> None:
        self.path = path
        self.display = display
        self.verbose = verbose
        self.autoscaler_events = autoscaler_events
        self._lock = threading.Lock()
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file: TextIO | None = path.open("a", encoding="utf-8")
        if title:
            self._file.write(f"# {title}\n")
            self._file.flush()

    def __call__(self, data: dict[str, Any]) -> None:
        """One batch of lines from one worker process (Ray's log batch dict)."""
        name = data.get("actor_name") or data.get("task_name") or ""
        pid = data.get("pid")
        raw = list(data.get("lines", []))
        prefix = f"({name} pid={pid})" if name else f"(pid={pid})"
        if pid == "autoscaler":
            raw = list(self.autoscaler_events(raw)) if self.autoscaler_events else []
        if pid in ("raylet", "autoscaler"):
            prefix = f"({pid})"
        if data.get("ip") and data.get("ip") != data.get("localhost"):
            prefix = prefix[:-1] + f", ip={data['ip']})"
        lines = [f"{prefix} {line}" for line in raw]
        if not lines:
            return
        with self._lock:
            if self._file is not None:
                self._file.write("".join(line + "\n" for line in lines))
                self._file.flush()
        if self.verbose or pid == "autoscaler":
            for line in lines:
                self.display.message(line, error=bool(data.get("is_err")))

    def close(self) -> None:
        """Close the file."""
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None
