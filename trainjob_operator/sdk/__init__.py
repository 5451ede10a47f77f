"""The Python SDK: submit, follow and manage TrainJobs on a cluster.

- :class:`~trainjob_operator.sdk.client.TrainJobClient`: ``submit`` (a manifest, a dict or a
  model, with ``working_dir=``), ``get``, ``list``, ``wait``, ``logs``, ``result``,
  ``suspend``, ``resume``, ``delete``;
- :mod:`~trainjob_operator.sdk.packaging`: how a working folder is packaged and where it is
  uploaded;
- :mod:`~trainjob_operator.sdk.errors`: the exceptions (all :class:`TrainJobError`).

The ``trainjob submit``/``logs``/``list``/``status``/``checkpoints``/``suspend``/``resume``/
``delete`` commands are built on it.
"""

from trainjob_operator.sdk.client import TERMINAL_PHASES, TrainJobClient, run_folder
from trainjob_operator.sdk.errors import (
    ClusterUnreachable,
    ConfigError,
    InvalidTrainJob,
    PackagingError,
    PermissionDenied,
    TrainJobError,
    TrainJobExists,
    TrainJobNotFound,
    WaitTimeout,
)
from trainjob_operator.sdk.packaging import MAX_PACKAGE_BYTES, Package, package_working_dir

__all__ = [
    "MAX_PACKAGE_BYTES",
    "TERMINAL_PHASES",
    "ClusterUnreachable",
    "ConfigError",
    "InvalidTrainJob",
    "Package",
    "PackagingError",
    "PermissionDenied",
    "TrainJobClient",
    "TrainJobError",
    "TrainJobExists",
    "TrainJobNotFound",
    "WaitTimeout",
    "package_working_dir",
    "run_folder",
]
