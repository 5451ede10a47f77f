"""Exceptions raised by the training runtime.

A leaf: it imports nothing of the package (``tests/test_import_graph.py`` checks it), so every
layer may raise these. What an exception carries from higher layers (a
:class:`~trainer_runtime.result.Result`, a :class:`~trainer_runtime.preemption.PreemptionInfo`)
is typed ``Any`` here and named in the docstrings. Errors of a layer of their own live there:
:class:`~trainer_runtime.storage.base.StorageError` in :mod:`trainer_runtime.storage`.
"""

from __future__ import annotations

from typing import Any


class TrainerRuntimeError(Exception):
    """Base class of every error the runtime raises on purpose."""


class TrainingFailedError(TrainerRuntimeError):
    """``fit()`` could not finish: the last failure and the partial result are attached.

    As in Ray Train, ``fit()`` raises one of its subclasses: :class:`WorkerGroupError` (the
    workers failed) or :class:`ControllerError` (the controller did).

    ``cause`` is the exception that ended the run (also chained as ``__cause__``);
    ``result`` (a :class:`~trainer_runtime.result.Result` or None) holds what had been
    committed before the failure (metrics, latest checkpoint), so nothing already stored is
    lost.
    """

    def __init__(
        self, message: str, cause: BaseException | None = None, result: Any = None
    ) -> None:
        super().__init__(message)
        self.cause = cause
        self.result = result


class WorkerGroupError(TrainingFailedError):
    """Training failed because of worker failures (``ray.train.WorkerGroupError``).

    ``worker_failures`` maps each failed worker's rank to its exception (the train
    function's own exception where it could be carried over, with ``traceback_text``
    holding the worker's traceback).
    """

    def __init__(
        self,
        error_message: str,
        worker_failures: dict[int, BaseException],
        cause: BaseException | None = None,
        result: Any = None,
        traceback_text: str | None = None,
    ) -> None:
        # Ray prefixes "Training failed due to worker errors:"; the first line here says what
        # failed instead (it becomes a TrainJob's status.message).
        super().__init__(error_message, cause=cause, result=result)
        self._error_message = error_message
        self.worker_failures = worker_failures
        self.traceback_text = traceback_text

    def __reduce__(self) -> Any:
        return (self.__class__, (self._error_message, self.worker_failures))


class ControllerError(TrainingFailedError):
    """Training failed on the controller side (``ray.train.ControllerError``): a bad
    configuration, or storage that retrying cannot fix. ``controller_failure`` is the cause."""

    def __init__(
        self,
        controller_failure: BaseException,
        message: str | None = None,
        result: Any = None,
    ) -> None:
        super().__init__(
            message or str(controller_failure), cause=controller_failure, result=result
        )
        self.controller_failure = controller_failure
        self._message = message

    def __reduce__(self) -> Any:
        return (self.__class__, (self.controller_failure, self._message))


class PreemptionError(TrainingFailedError):
    """Training stopped because of a preemption (``ray.train.PreemptionError``).

    The attempt ends once the train function was told of the preemption
    (:func:`trainer_runtime.get_preemption_info`) and a checkpoint reported after that was
    committed, when a worker on the preempted node is gone, or when the notice's deadline
    plus ``FailureConfig.preemption_grace_s`` passed first (``drain_timed_out``). With Ray
    workers the worker group then restarts in place, up to
    ``FailureConfig.max_preemption_failures`` times; ``fit()`` raises this past that budget,
    and always in local mode. The next run with the same ``storage_path`` and ``name``
    resumes from ``result.checkpoint``.
    """

    def __init__(
        self,
        preemption_info: Any,
        drain_timed_out: bool = False,
        result: Any = None,
    ) -> None:
        self.preemption_info = preemption_info
        self.drain_timed_out = drain_timed_out
        super().__init__(
            "Training was interrupted by node preemption "
            f"(preempted_ranks={preemption_info.preempted_ranks}, "
            f"drain_timed_out={drain_timed_out}).",
            result=result,
        )

    def __reduce__(self) -> Any:
        return (self.__class__, (self.preemption_info, self.drain_timed_out))


class PreemptionStop(TrainerRuntimeError):
    """Internal: the attempt stops after a preemption notice (see :class:`PreemptionError`)."""

    def __init__(
        self, preemption_info: Any, drain_timed_out: bool = False, driver: bool = False
    ) -> None:
        super().__init__(f"preempted ranks {preemption_info.preempted_ranks}")
        self.preemption_info = preemption_info
        self.drain_timed_out = drain_timed_out
        #: The driver process itself got the notice: the run stops (``fit()`` raises
        #: :class:`PreemptionError`), it cannot restart in place.
        self.driver = driver


class WorkerFailure(TrainerRuntimeError):
    """Internal: a worker of the group failed (process died, train function raised, upload
    failed). The controller restarts the group, or raises :class:`WorkerGroupError`.

    ``permanent``: restarting cannot help (a bad ``report()`` call, storage access denied):
    the run fails at once.
    """

    def __init__(
        self,
        message: str,
        rank: int | None = None,
        traceback_text: str | None = None,
        exception: BaseException | None = None,
        permanent: bool = False,
    ) -> None:
        super().__init__(message)
        self.rank = rank
        self.traceback_text = traceback_text
        self.exception = exception
        self.permanent = permanent

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


class NotRetriableError(TrainerRuntimeError):
    """An error that no retry (of a storage call, or of the workers) can fix: bad input or
    fencing. :func:`trainer_runtime.storage.base.is_permanent_error` stops at it."""


class CheckpointSourceError(ReportError, NotRetriableError):
    """A reported checkpoint folder vanished or changed before its upload finished.

    The checkpoint is not committed. A restart would repeat the same train code, so the
    run fails at once with the folder named and the fix.
    """


class FencedError(NotRetriableError):
    """A newer driver took over the run folder; this process must stop writing to it."""


class ValidationDispatchError(TrainerRuntimeError):
    """Recording validation results failed (e.g. the manifest could not be saved)."""
