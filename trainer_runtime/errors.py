"""Exceptions raised by the training runtime."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainer_runtime.result import Result


class TrainerRuntimeError(Exception):
    """Base class of every error the runtime raises on purpose."""


class TrainingFailedError(TrainerRuntimeError):
    """``fit()`` could not finish: the last failure and the partial result are attached.

    ``cause`` is the exception that ended the run (also chained as ``__cause__``);
    ``result`` holds what had been committed before the failure (metrics, latest
    checkpoint), so nothing already stored is lost.
    """

    def __init__(
        self, message: str, cause: BaseException | None = None, result: Result | None = None
    ) -> None:
        super().__init__(message)
        self.cause = cause
        self.result = result


class WorkerGroupError(TrainerRuntimeError):
    """A worker of the group failed (process died, train function raised, upload failed)."""

    def __init__(
        self, message: str, rank: int | None = None, traceback_text: str | None = None
    ) -> None:
        super().__init__(message)
        self.rank = rank
        self.traceback_text = traceback_text

    def __str__(self) -> str:
        base = super().__str__()
        if self.traceback_text:
            return f"{base}\n{self.traceback_text}"
        return base


class CheckpointUploadError(TrainerRuntimeError):
    """Uploading a checkpoint to storage failed; the checkpoint was not committed."""


class ReportError(TrainerRuntimeError, ValueError):
    """``report()`` was called with arguments that cannot be accepted."""


class UserConfigError(TrainerRuntimeError, ValueError):
    """A configuration error that retrying cannot fix: the run fails at once."""


class StorageError(TrainerRuntimeError):
    """A storage operation failed after its retries.

    ``permanent``: retrying cannot help (access denied, bucket not found): the run fails at
    once instead of spending ``FailureConfig.max_failures`` on restarts.
    """

    def __init__(self, message: str, permanent: bool = False) -> None:
        super().__init__(message)
        self.permanent = permanent


class CheckpointSourceError(ReportError):
    """A reported checkpoint folder vanished or changed before its upload finished.

    The checkpoint is not committed. A restart would repeat the same train code, so the
    run fails at once with the folder named and the fix.
    """


class FencedError(TrainerRuntimeError):
    """A newer driver took over the run folder; this process must stop writing to it."""


class ValidationDispatchError(TrainerRuntimeError):
    """Recording validation results failed (e.g. the manifest could not be saved)."""
