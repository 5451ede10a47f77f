"""The progress display of ``trainjob run`` on its own: live and plain renderings, log file."""

from __future__ import annotations

import io
import logging
import re
from pathlib import Path
from typing import Any

import pytest

from trainer_runtime.checkpoint_manager import CheckpointRecord, CheckpointStatus
from trainjob_operator.launcher.progress import (
    DisplayLogHandler,
    ProgressDisplay,
    WorkerLogSink,
    format_elapsed,
    is_live,
)
from trainjob_operator.launcher.status import StatusTracker


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _display(live: bool, width: int = 200) -> tuple[ProgressDisplay, io.StringIO, Clock]:
    out = Terminal()
    clock = Clock()
    tracker = StatusTracker("val_loss")
    display = ProgressDisplay(
        tracker,
        out,
        out,
        live=live,
        workers=2,
        score_attribute="val_loss",
        clock=clock,
        width=lambda: width,
    )
    return display, out, clock


def _drive(display: ProgressDisplay, clock: Clock) -> None:
    """A run as the controller reports it: start, two rounds, one checkpoint validated."""
    hooks: list[Any] = [display.tracker, display]

    def call(name: str, *args: Any) -> None:
        for hook in hooks:
            getattr(hook, name)(*args)

    clock.now += 5
    call("on_run_start", "/runs/job", 2, 0)
    clock.now += 1
    call("on_report", 0, {"epoch": 0, "train_loss": 0.61234})
    record = CheckpointRecord(
        "checkpoint_000000",
        "/runs/job/checkpoint_000000",
        0,
        {"epoch": 0, "train_loss": 0.61234},
        status=CheckpointStatus.PENDING_VALIDATION,
    )
    call("on_checkpoint", record, None)
    call("on_validation_queue", 1, 0, 0)
    clock.now += 1
    call("on_report", 1, {"epoch": 1, "train_loss": 0.3})
    display.tick()
    clock.now += 1
    record.status = CheckpointStatus.VALIDATED
    record.validation_metrics = {"val_loss": 0.25, "val_accuracy": 0.9}
    call("on_validation_queue", 0, 0, 0)
    call("on_checkpoint", record, record)


def _final(display: ProgressDisplay) -> None:
    display.close(display.tracker.finish(None))


def _screen(raw: str) -> list[str]:
    """What a terminal shows: each line's text after its last carriage return + clear."""
    lines = []
    for line in raw.split("\n"):
        lines.append(line.split("\r\x1b[K")[-1])
    return [line for line in lines if line]


def test_live_display_rewrites_one_status_line_and_keeps_events() -> None:
    display, out, clock = _display(live=True)
    display.message("TrainJob job: pkg.mod:train on 2 Ray worker(s), storage /runs")
    display.start()
    assert out.getvalue().endswith("\r\x1b[K[   0.0s] Starting 2 worker(s)")
    _drive(display, clock)
    live = out.getvalue().rsplit("\r\x1b[K", 1)[1]
    assert live == (
        "[   8.0s] Running | step 1: epoch=1 train_loss=0.3 | checkpoints 1 (1 validated) "
        "| best checkpoint_000000 val_loss=0.25"
    )
    _final(display)
    screen = _screen(out.getvalue())
    assert screen == [
        "TrainJob job: pkg.mod:train on 2 Ray worker(s), storage /runs",
        "[   5.0s] Running: 2 worker(s) started; run folder /runs/job",
        "[   6.0s] checkpoint_000000 committed (step 0: epoch=0 train_loss=0.6123), "
        "validation queued",
        "[   8.0s] checkpoint_000000 validated: val_loss=0.25 val_accuracy=0.9 (best so far)",
        "[   8.0s] Succeeded: step 1, 1 checkpoint(s) (1 validated), "
        "best checkpoint_000000 val_loss=0.25",
    ]
    assert out.getvalue().endswith("best checkpoint_000000 val_loss=0.25\n")  # line cleared


def test_live_line_fits_the_terminal_width() -> None:
    display, out, clock = _display(live=True, width=40)
    display.start()
    _drive(display, clock)
    display.stop()
    drawn = [part.split("\n")[0] for part in out.getvalue().split("\r\x1b[K")[1:]]
    status_lines = [line for line in drawn if "| " in line or "Starting" in line]
    assert status_lines and all(len(line) <= 39 for line in status_lines)
    assert any(line.endswith("...") for line in status_lines)


def test_plain_display_prints_lines_without_control_characters() -> None:
    display, out, clock = _display(live=False)
    display.start()
    _drive(display, clock)
    _final(display)
    text = out.getvalue()
    assert "\r" not in text and "\x1b" not in text
    lines = text.splitlines()
    assert lines[0] == "[   5.0s] Running: 2 worker(s) started; run folder /runs/job"
    assert lines[-1].startswith("[   8.0s] Succeeded: step 1")
    assert not any("Running |" in line for line in lines)  # no status line in plain mode


def test_plain_display_prints_a_step_line_when_quiet_for_the_interval() -> None:
    display, out, clock = _display(live=False)
    display.tracker.on_run_start("/runs/job", 2, 0)
    display.on_run_start("/runs/job", 2, 0)
    for step in range(3):
        clock.now += 4
        display.tracker.on_report(step, {"step": step, "loss": 1.0 / (step + 1)})
        display.on_report(step, {"step": step, "loss": 1.0 / (step + 1)})
        display.tick()
    display.tick()  # nothing new: no second line for the same step
    steps = [line for line in out.getvalue().splitlines() if "] step " in line]
    assert steps == ["[  12.0s] step 2: step=2 loss=0.3333"]  # 10 s after the last line


def test_failure_and_restart_are_events() -> None:
    display, out, _clock = _display(live=False)
    display.tracker.on_run_start("/runs/job", 2, 0)
    error = RuntimeError("the train function failed on rank 1: ZeroDivisionError: boom\ntrace")
    display.tracker.on_failure(error, 1, True)
    display.on_failure(error, 1, True)
    assert "Restarting" in display.status_line()
    display.close(display.tracker.finish(error))
    lines = out.getvalue().splitlines()
    assert lines[0].endswith(
        "worker group failed (1): the train function failed on rank 1: ZeroDivisionError: boom "
        "(restarting from the latest checkpoint)"
    )
    assert re.match(r"\[ +[\d.]+s\] Failed: the train function failed on rank 1", lines[-1])


@pytest.mark.parametrize(
    ("ci", "term", "tty", "expected"),
    [
        (None, "xterm", True, True),
        ("true", "xterm", True, False),
        ("1", "xterm", True, False),
        ("false", "xterm", True, True),
        (None, "dumb", True, False),
        (None, "xterm", False, False),
    ],
)
def test_live_only_on_a_terminal_outside_ci(
    ci: str | None, term: str, tty: bool, expected: bool
) -> None:
    env = {"TERM": term} | ({"CI": ci} if ci is not None else {})
    stream = Terminal() if tty else io.StringIO()
    assert is_live(stream, env) is expected


def test_log_records_print_above_the_live_line() -> None:
    display, out, _clock = _display(live=True)
    display.start()
    logger = logging.getLogger("trainjob.test.progress")
    handler = DisplayLogHandler(display)
    logger.addHandler(handler)
    try:
        logger.warning("storage is slow")
    finally:
        logger.removeHandler(handler)
    display.stop()
    assert "WARNING trainjob.test.progress: storage is slow" in _screen(out.getvalue())


def test_worker_output_goes_to_the_log_file(tmp_path: Path) -> None:
    display, out, _clock = _display(live=False)
    sink = WorkerLogSink(
        tmp_path / "logs" / "workers.log",
        display,
        autoscaler_events=lambda lines: [x for x in lines if "event" in x],
        title="trainjob run job",
    )
    sink({"pid": 12, "actor_name": "TrainWorker", "lines": ["hello", "there"], "is_err": False})
    sink({"pid": 13, "task_name": "validate:checkpoint_000000", "lines": ["warn"], "is_err": True})
    sink({"pid": "autoscaler", "lines": ["status table", "an event"], "is_err": False})
    sink.close()
    assert (tmp_path / "logs" / "workers.log").read_text().splitlines() == [
        "# trainjob run job",
        "(TrainWorker pid=12) hello",
        "(TrainWorker pid=12) there",
        "(validate:checkpoint_000000 pid=13) warn",
        "(autoscaler) an event",
    ]
    assert out.getvalue() == "(autoscaler) an event\n"  # only scheduling events are shown


def test_verbose_shows_worker_output_too(tmp_path: Path) -> None:
    display, out, _clock = _display(live=False)
    sink = WorkerLogSink(tmp_path / "workers.log", display, verbose=True)
    sink({"pid": 12, "actor_name": "TrainWorker", "lines": ["hello"], "is_err": False})
    sink.close()
    assert out.getvalue() == "(TrainWorker pid=12) hello\n"


@pytest.mark.parametrize(
    ("seconds", "text"), [(0, "0.0s"), (59.94, "59.9s"), (65, "1m05s"), (7380, "2h03m")]
)
def test_format_elapsed(seconds: float, text: str) -> None:
    assert format_elapsed(seconds) == text
