"""The exceptions of :class:`~trainjob_operator.sdk.TrainJobClient`: each names the TrainJob
(when there is one) and the cause in words, never a raw HTTP error."""

from __future__ import annotations

from typing import Any

__all__ = [
    "ClusterUnreachable",
    "ConfigError",
    "InvalidTrainJob",
    "PackagingError",
    "PermissionDenied",
    "TrainJobError",
    "TrainJobExists",
    "TrainJobNotFound",
    "WaitTimeout",
]


class TrainJobError(Exception):
    """Base of the SDK's errors. ``name``: the TrainJob (None before one is known);
    ``namespace``: its namespace; ``reason``: a short machine-readable cause.

    ``invalid_input``: the request itself is wrong (the CLI exits 2 and nothing was created);
    otherwise the cluster or the storage failed (exit status 1).
    """

    invalid_input = False

    def __init__(
        self,
        message: str,
        *,
        name: str | None = None,
        namespace: str | None = None,
        reason: str = "",
    ) -> None:
        where = f"TrainJob {namespace}/{name}: " if name and namespace else ""
        where = where or (f"TrainJob {name}: " if name else "")
        super().__init__(where + message)
        self.name = name
        self.namespace = namespace
        self.reason = reason or type(self).__name__


class ConfigError(TrainJobError):
    """No usable kubeconfig, or an unknown context."""

    invalid_input = True


class ClusterUnreachable(TrainJobError):
    """The API server did not answer (or the TrainJob CRD is not installed)."""


class PermissionDenied(TrainJobError):
    """RBAC refused the request (HTTP 403)."""

    invalid_input = True


class InvalidTrainJob(TrainJobError):
    """The manifest fails the checks of ``trainjob validate`` or the admission webhook.

    ``problems``: one line per problem (``FIELD: MESSAGE (hint: ...)``)."""

    def __init__(
        self,
        problems: list[str],
        *,
        name: str | None = None,
        namespace: str | None = None,
        reason: str = "Invalid",
    ) -> None:
        super().__init__("; ".join(problems), name=name, namespace=namespace, reason=reason)
        self.problems = problems

    invalid_input = True


class TrainJobExists(TrainJobError):
    """A TrainJob of that name already exists in the namespace."""

    invalid_input = True


class TrainJobNotFound(TrainJobError):
    """No TrainJob of that name in the namespace (or the namespace does not exist)."""

    invalid_input = True


class PackagingError(TrainJobError):
    """The working folder cannot be shipped: too large, entrypoint missing, no storage."""

    invalid_input = True


class WaitTimeout(TrainJobError, TimeoutError):
    """:meth:`TrainJobClient.wait` gave up; ``last`` is the TrainJob as last seen."""

    last: Any = None
