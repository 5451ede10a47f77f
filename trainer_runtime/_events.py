"""Messages a worker sends to the run's controller, and the buffer that carries them."""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from trainer_runtime.config import ValidationTaskConfig
from trainer_runtime.storage.base import StoredFile


@dataclass
class ReportEvent:
    """One rank's ``report()`` call of round ``round``."""

    rank: int
    round: int
    metrics: dict[str, Any]
    #: Where this rank's checkpoint files go (None: no checkpoint from this rank).
    checkpoint_uri: str | None = None
    upload_mode: str = "sync"
    #: Ray 2.51 form: ``report(validate_fn=, validate_config=)``.
    validate_fn: Callable[..., Any] | None = None
    validate_config: dict[str, Any] | None = None
    #: Ray 2.60 form: ``report(validation=True | ValidationTaskConfig)`` (True arrives as a
    #: default ``ValidationTaskConfig``); runs the trainer's ``ValidationConfig.fn``.
    validation: ValidationTaskConfig | None = None
    time: float = field(default_factory=time.time)
    #: Seconds this rank's previous ``report()`` call took (None: this is its first), for
    #: the driver's ``trainjob_train_report_blocked_seconds``.
    previous_report_s: float | None = None


@dataclass
class UploadDoneEvent:
    """A rank finished storing its files of the checkpoint of ``round``."""

    rank: int
    round: int
    uri: str
    files: int = 0
    bytes: int = 0
    seconds: float = 0.0
    #: What this rank stored (relative path -> size and fingerprint), checked at commit.
    #: None: the files were written in place (``NO_UPLOAD``); the commit lists the folder.
    stored: dict[str, StoredFile] | None = None


@dataclass
class UploadFailedEvent:
    """A rank could not store its checkpoint files of ``round``."""

    rank: int
    round: int
    uri: str
    error: str
    #: Retrying cannot fix it (permission denied, a missing bucket, fenced): fail the run.
    permanent: bool = False
    #: The reported folder vanished or changed before its upload finished (a user error).
    source_error: bool = False
    #: The exception of a ``checkpoint_upload_fn`` (the worker's failure, as in Ray Train).
    exception: BaseException | None = None


@dataclass
class WorkerFinishedEvent:
    """The train function of ``rank`` returned (``error`` None) or raised."""

    rank: int
    error: str | None = None
    traceback: str | None = None
    #: The train function's exception itself, when it can be sent (None otherwise).
    exception: BaseException | None = None
    #: The error is one retrying cannot fix (a bad ``report()`` call, a
    #: ``UserConfigError``): the run fails at once instead of restarting.
    config_error: bool = False
    #: What the train function returned (``Result.return_value``); sent by rank 0 only.
    return_value: Any = None


@dataclass
class RequestEvent:
    """A rank waits for the controller's answer (``collective.*``,
    ``get_all_reported_checkpoints()``); the answer comes back through the worker's
    ``deliver(request_id, value)``."""

    rank: int
    request_id: int
    #: ``collective`` (payload: (sequence number, data)) or ``reported_checkpoints``
    #: (payload: (rounds this rank reported up to, consistency mode, timeout_s)).
    kind: str
    payload: Any = None


Event = ReportEvent | UploadDoneEvent | UploadFailedEvent | WorkerFinishedEvent | RequestEvent


class EventBuffer:
    """A thread-safe FIFO of events with a blocking, batching ``drain``."""

    def __init__(self) -> None:
        self._items: collections.deque[Event] = collections.deque()
        self._cond = threading.Condition()

    def put(self, event: Event) -> None:
        """Append one event and wake a waiting reader."""
        with self._cond:
            self._items.append(event)
            self._cond.notify_all()

    def drain(self, timeout: float) -> list[Event]:
        """Every queued event, waiting up to ``timeout`` seconds for the first one."""
        with self._cond:
            if not self._items:
                self._cond.wait(timeout)
            items = list(self._items)
            self._items.clear()
            return items

    def __len__(self) -> int:
        with self._cond:
            return len(self._items)
