"""User-facing configuration objects, shaped like Ray Train V2's.

A user of ``ray.train`` switches by changing imports:
``from ray.train import ScalingConfig, RunConfig`` becomes
``from trainer_runtime import ScalingConfig, RunConfig``.
"""

from __future__ import annotations

import datetime as _dt
import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol

from trainer_runtime.callbacks import Callback, UserCallback
from trainer_runtime.checkpoint import CheckpointUploadMode
from trainer_runtime.storage import join_uri, split_query_uri, validate_storage_uri
from trainer_runtime.tpu import (
    TpuSliceShape,
    infer_num_slices,
    slice_shape,
    tpu_worker_resources,
    validate_single_host_tpu,
    validate_tpu_scaling,
)

_PLACEMENT_STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")


@dataclass
class ScalingConfig:
    """How many workers to run and what each one gets.

    ``num_workers=0`` is local mode: the train function runs in this process
    (or in each ``torchrun`` process) without Ray.

    TPUs (``use_tpu=True``), as in Ray Train: one worker on a single TPU host needs nothing
    more (it asks for ``{"TPU": 1}``, or the ``TPU`` entry of ``resources_per_worker``; an
    ``accelerator_type`` without a ``topology`` is only checked for validity: Ray Train 2.60
    asks for no ``accelerator_type:`` resource there either, checked side by side on a fake
    TPU node in ``tests/runtime/test_tpu_single_host.py``). More workers
    need ``accelerator_type`` (``v6e``, ``v5e``, ``v5p``, ``v4``, or Ray's ``TPU-V6E``,
    ``TPU-V5LITEPOD``...) and ``topology`` (``4x4``...). There is one worker per TPU host:
    ``num_workers`` must be a multiple of the hosts per slice, and the number of slices is
    ``num_workers / hosts`` (``num_slices``, when given, must agree; see
    :mod:`trainer_runtime.tpu`). Each worker gets ``{"TPU": chips per host}`` plus any other
    ``resources_per_worker``, and each slice is reserved as a unit (see
    :class:`~trainer_runtime.worker_group.WorkerGroup`); ``placement_strategy`` does not apply.

    ``label_selector``, as in Ray Train: Ray node labels each worker's node must have (Ray's
    label scheduling, as ``bundle_label_selector`` of the workers' placement group), one dict
    for every worker or a list of one dict per worker; not with a multi-host TPU request
    (the slice is chosen by the runtime), as in Ray Train.

    Elastic training, as in Ray Train 2.60: ``num_workers=(min_workers, max_workers)``
    starts with as many workers as the Ray cluster can place now (at most ``max_workers``,
    waiting up to ``placement_timeout_s`` for ``min_workers``), continues with fewer (down to
    ``min_workers``) when a lost worker cannot be replaced, and grows back when the cluster
    has room again: every ``elastic_resize_monitor_interval_s`` seconds the running group's
    size is compared with what fits, and a different size restarts the group from the latest
    committed checkpoint (see :mod:`trainer_runtime._scaling_policy`). A tuple is never local
    mode; ``label_selector`` as a list has one entry per worker up to ``max_workers``; with
    TPUs both bounds are multiples of the hosts per slice (whole slices come and go).
    """

    num_workers: int | tuple[int, int] = 1
    use_gpu: bool = False
    resources_per_worker: dict[str, float] | None = None
    placement_strategy: str = "PACK"
    use_tpu: bool = False
    topology: str | None = None
    accelerator_type: str | None = None
    #: TPU slices; 0 (the default) infers it from ``num_workers`` and the topology. It is
    #: always >= 1 after construction.
    num_slices: int = 0
    #: Seconds to wait for the cluster to grant every worker's resources.
    placement_timeout_s: float = 600.0
    #: Ray node labels the workers' nodes must have: one selector for all, or one per worker.
    label_selector: dict[str, str] | list[dict[str, str]] | None = None
    #: Elastic training (``num_workers=(min, max)``): while the worker group runs, how often
    #: (seconds) its size is compared with what the cluster can place (Ray Train's field).
    elastic_resize_monitor_interval_s: float = 60.0

    def __post_init__(self) -> None:
        self._check_num_workers()
        if self.use_gpu and self.use_tpu:
            raise ValueError(  # Ray Train 2.60's sentence first
                "Cannot specify both `use_gpu=True` and `use_tpu=True`. ScalingConfig: "
                "use_gpu and use_tpu are mutually exclusive; set only one"
            )
        self._check_accelerator_resources()
        if self.placement_strategy not in _PLACEMENT_STRATEGIES:
            raise ValueError(
                f"ScalingConfig.placement_strategy={self.placement_strategy!r} is not valid; "
                f"choose one of {', '.join(_PLACEMENT_STRATEGIES)}"
            )
        if self.resources_per_worker is not None:
            for key, value in self.resources_per_worker.items():
                if not isinstance(value, int | float) or value < 0:
                    raise ValueError(
                        f"ScalingConfig.resources_per_worker[{key!r}] must be a number >= 0, "
                        f"got {value!r}"
                    )
        if (
            not isinstance(self.num_slices, int)
            or isinstance(self.num_slices, bool)
            or self.num_slices < 0
        ):
            raise ValueError(
                f"ScalingConfig.num_slices must be an int >= 1 (0: inferred), got "
                f"{self.num_slices!r}"
            )
        if self.use_tpu and self.topology is None and self.max_workers <= 1:
            validate_single_host_tpu(
                self.accelerator_type, self.num_slices, self.resources_per_worker
            )
            self.num_slices = 1
        elif self.use_tpu:
            self.num_slices = infer_num_slices(
                self.max_workers, self.accelerator_type, self.topology, self.num_slices
            )
            shape = validate_tpu_scaling(
                num_workers=self.max_workers,
                topology=self.topology,
                accelerator_type=self.accelerator_type,
                num_slices=self.num_slices,
                resources_per_worker=self.resources_per_worker,
            )
            if self.min_workers % shape.hosts != 0:
                # Ray Train 2.60's sentence.
                raise ValueError(
                    f"The configured `min_workers` ({self.min_workers}) must be a multiple of "
                    f"{shape.hosts} for the specified topology ({shape.topology}). TPU "
                    "workloads typically require symmetric resource distribution across all "
                    "slices to function correctly."
                )
        else:
            # accelerator_type without TPUs is Ray's: the workers' nodes must have that
            # accelerator (e.g. "A100"), asked for as a sliver of ``accelerator_type:<type>``.
            given = [
                name
                for name, value in (
                    ("topology", self.topology),
                    ("num_slices", self.num_slices if self.num_slices > 1 else None),
                )
                if value is not None
            ]
            if given:
                raise ValueError(
                    f"ScalingConfig: {', '.join(given)} only apply to TPUs; set use_tpu=True "
                    "(or remove them)"
                )
            self.num_slices = 1
        self._check_label_selector()

    def _check_accelerator_resources(self) -> None:
        """Ray Train 2.60's checks of ``GPU`` and ``TPU`` in ``resources_per_worker`` against
        ``use_gpu`` and ``use_tpu``, with its sentences."""
        if not self.resources_per_worker:
            return
        for name, flag in (("GPU", self.use_gpu), ("TPU", self.use_tpu)):
            count = sum(
                value for key, value in self.resources_per_worker.items() if key.upper() == name
            )
            if not flag and count > 0:
                attr = f"use_{name.lower()}"
                raise ValueError(
                    f"`{attr}` is False but `{name}` was found in `resources_per_worker`. "
                    f"Either set `{attr}` to True or remove `{name}` from "
                    "`resources_per_worker."
                )

    def _check_num_workers(self) -> None:
        """Ray Train 2.60's checks of ``num_workers`` (an int, or ``(min, max)``) and of
        ``elastic_resize_monitor_interval_s``, with its sentences (users match their text)."""
        value = self.num_workers
        is_fixed = isinstance(value, int) and not isinstance(value, bool)
        is_elastic = (
            isinstance(value, tuple)
            and len(value) == 2
            and all(isinstance(x, int) and not isinstance(x, bool) for x in value)
        )
        if not (is_fixed or is_elastic):
            raise ValueError(
                f"ScalingConfig(num_workers) must be an int or a tuple of two ints. Got {value!r}."
            )
        interval = self.elastic_resize_monitor_interval_s
        if isinstance(interval, bool) or not isinstance(interval, int | float) or interval < 0:
            raise ValueError(
                "ScalingConfig(elastic_resize_monitor_interval_s) must be non-negative. "
                f"Got {interval!r}."
            )
        if self.min_workers < 0:
            ours = f" ScalingConfig.num_workers must be >= 0 (0 = local mode), got {value}"
            raise ValueError(
                f"Invalid ScalingConfig(num_workers={value}): "
                f"Number of workers cannot be negative.{ours if is_fixed else ''}"
            )
        if self.min_workers > self.max_workers:
            raise ValueError(
                f"Invalid ScalingConfig(num_workers={value}): "
                f"min_workers={self.min_workers} must be <= max_workers={self.max_workers}."
            )
        if is_elastic and self.max_workers < 1:
            # Ray accepts (0, 0) and then has no worker to start; a tuple is never local mode.
            raise ValueError(
                f"Invalid ScalingConfig(num_workers={value}): max_workers must be >= 1 (a "
                "(min_workers, max_workers) tuple runs Ray workers; num_workers=0 is local mode)."
            )

    @property
    def elasticity_enabled(self) -> bool:
        """Whether ``num_workers`` is a ``(min_workers, max_workers)`` tuple (Ray Train's)."""
        return isinstance(self.num_workers, tuple)

    @property
    def min_workers(self) -> int:
        """The fewest workers a group runs with (``num_workers`` when fixed)."""
        return self.num_workers if isinstance(self.num_workers, int) else self.num_workers[0]

    @property
    def max_workers(self) -> int:
        """The most workers a group runs with (``num_workers`` when fixed)."""
        return self.num_workers if isinstance(self.num_workers, int) else self.num_workers[1]

    def for_group(self, num_workers: int) -> ScalingConfig:
        """This configuration for one worker group of ``num_workers`` (a fixed int): what the
        worker group and the backend of one attempt see. A list ``label_selector`` keeps its
        first ``num_workers`` entries, as Ray Train's ``_label_selector_per_worker``."""
        if not self.elasticity_enabled and num_workers == self.num_workers:
            return self
        selector = self.label_selector
        if isinstance(selector, list):
            selector = [dict(s) for s in selector[:num_workers]]
        return replace(
            self,
            num_workers=num_workers,
            num_slices=0 if self.use_tpu and self.topology is not None else self.num_slices,
            label_selector=selector,
        )

    def _check_label_selector(self) -> None:
        selector = self.label_selector
        if selector is None:
            return
        selectors = selector if isinstance(selector, list) else [selector]
        for item in selectors:
            if not isinstance(item, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in item.items()
            ):
                raise ValueError(
                    "ScalingConfig.label_selector must be a dict of label -> value strings "
                    f"(or a list of them, one per worker), got {item!r}"
                )
        if isinstance(selector, list) and len(selector) != self.max_workers:
            raise ValueError(
                "If `label_selector` is a list, it must be the same length as "
                f"`max_workers` (or `num_workers` when fixed). Got {len(selector)} selectors "
                f"for num_workers={self.num_workers}."
            )
        if self.use_tpu and self.max_workers > 1:
            raise ValueError(
                "Cannot set `label_selector` when `use_tpu=True` because "
                "Ray Train automatically reserves a TPU slice with a predefined label."
            )

    def label_selector_per_worker(self) -> list[dict[str, str]] | None:
        """``label_selector`` as one dict per worker, up to ``max_workers`` (None: no label
        constraint)."""
        if self.label_selector is None:
            return None
        if isinstance(self.label_selector, list):
            return [dict(s) for s in self.label_selector]
        return [dict(self.label_selector) for _ in range(self.max_workers)]

    @property
    def local_mode(self) -> bool:
        """True when the train function runs without Ray (``num_workers=0``; a
        ``(min, max)`` tuple never is, as in Ray Train)."""
        return self.num_workers == 0

    @property
    def tpu_shape(self) -> TpuSliceShape | None:
        """The shape of one TPU slice (hosts, chips per host, pod type), or None without TPUs."""
        if not self.use_tpu or self.topology is None:
            return None  # no TPU, or a single TPU host (no slice to reserve)

        assert self.topology is not None and self.accelerator_type is not None
        return slice_shape(self.accelerator_type, self.topology)

    @property
    def total_resources(self) -> dict[str, float]:
        """Ray Train's property: the resources all workers ask for together, each entry of
        :meth:`worker_resources` times ``num_workers`` (``max_workers`` when elastic: an
        upper bound, as in Ray), entries of 0 left out, as in Ray.

        Equal to Ray Train 2.60's for CPU workers and explicit ``resources_per_worker``;
        where the workers' requests differ from Ray Train's, this is what the runtime asks
        for: ``use_gpu=True`` without ``resources_per_worker`` adds 1 CPU per worker (Ray
        Train asks for the GPU alone), and a TPU worker asks for the ``TPU`` chips of its
        host (Ray Train adds 1 CPU and an ``accelerator_type:`` resource per worker).
        """
        return {
            key: value * self.max_workers
            for key, value in self.worker_resources().items()
            if value != 0
        }

    def worker_resources(self) -> dict[str, float]:
        """The Ray resources one worker asks for (defaults: 1 CPU, plus 1 GPU with use_gpu).

        With ``use_tpu`` the default is ``{"TPU": chips per host}`` (one worker per host),
        plus the other ``resources_per_worker`` entries.
        """
        shape = self.tpu_shape
        if shape is not None:
            return tpu_worker_resources(shape, self.resources_per_worker)
        if self.resources_per_worker is not None:
            resources = {
                ("CPU" if k.lower() == "cpu" else "GPU" if k.lower() == "gpu" else k): v
                for k, v in self.resources_per_worker.items()
            }
        else:
            resources = {"CPU": 1.0}
        if self.use_gpu and not resources.get("GPU"):  # as Ray: GPU 0 with use_gpu asks 1
            resources["GPU"] = 1.0
        if self.accelerator_type and not self.use_tpu:
            # Ray's constraint resource: any node with that accelerator advertises 1 of it.
            resources.setdefault(f"accelerator_type:{self.accelerator_type}", 0.001)
        if self.use_tpu:  # a single TPU host, as Ray Train: {"TPU": 1} unless given
            resources = {k: v for k, v in resources.items() if k.upper() != "TPU"} | {
                "TPU": float(
                    next(
                        (
                            v
                            for k, v in (self.resources_per_worker or {}).items()
                            if k.upper() == "TPU"
                        ),
                        1.0,
                    )
                )
            }
            if self.resources_per_worker is None:
                resources.pop("CPU", None)
        return resources


@dataclass
class CheckpointConfig:
    """Which checkpoints to keep.

    ``num_to_keep=None`` keeps all. With ``checkpoint_score_attribute`` the
    best ``num_to_keep`` by that metric are kept, otherwise the most recent.
    The latest checkpoint is never deleted.
    """

    num_to_keep: int | None = None
    checkpoint_score_attribute: str | None = None
    checkpoint_score_order: Literal["max", "min"] = "max"

    def __post_init__(self) -> None:
        if self.num_to_keep is not None and (
            not isinstance(self.num_to_keep, int) or self.num_to_keep < 1
        ):
            raise ValueError(
                f"CheckpointConfig.num_to_keep must be None (keep all) or an int >= 1, "
                f"got {self.num_to_keep!r}"
            )
        if self.checkpoint_score_order not in ("max", "min"):
            raise ValueError(
                f"CheckpointConfig.checkpoint_score_order must be 'max' or 'min', "
                f"got {self.checkpoint_score_order!r}"
            )


@dataclass
class FailureConfig:
    """How many worker-group failures to survive (``-1``: unlimited), and how fast to retry.

    After a failure the group restarts and resumes from the latest committed checkpoint.
    Restarts back off exponentially: the n-th failure in a row waits
    ``restart_backoff_s * 2**(n-1)`` seconds (at most ``max_restart_backoff_s``) before the
    workers start again, so a short outage (storage, network) does not use up
    ``max_failures`` in a few seconds: with the defaults, three failures in a row span
    2 + 4 + 8 = 14 s. A failure after an attempt that committed a checkpoint starts the
    sequence again. ``restart_backoff_s=0`` restarts at once.
    """

    max_failures: int = 0
    restart_backoff_s: float = 2.0
    max_restart_backoff_s: float = 60.0
    #: Ray Train 2.60's preemption fields. With Ray workers a preemption (a drained Ray
    #: node, or a worker's SIGTERM) ends the attempt once the train function committed a
    #: checkpoint after the notice, or once the notice's deadline plus
    #: ``preemption_grace_s`` passed; the worker group then restarts from the latest
    #: checkpoint on other nodes, up to ``max_preemption_failures`` times (-1: always),
    #: not counted against ``max_failures``. Past that, and always in local mode (the
    #: process itself is going away), ``fit()`` raises :class:`PreemptionError`.
    #: ``relax_collectives_on_preemption``: once a preemption is noticed, report rounds and
    #: collectives complete with the surviving ranks only, so rank 0 can commit a last
    #: checkpoint without workers that were reclaimed or hang (no effect when rank 0 itself
    #: is preempted; a preempted rank's checkpoint upload under way is still waited for,
    #: and one that starts after its round committed is skipped, writing nothing).
    max_preemption_failures: int = -1
    relax_collectives_on_preemption: bool = False
    preemption_grace_s: float = 0.0

    def __post_init__(self) -> None:
        if (
            not isinstance(self.max_failures, int)
            or isinstance(self.max_failures, bool)
            or self.max_failures < -1
        ):
            raise ValueError(
                f"FailureConfig.max_failures must be an int >= -1 (-1 = unlimited), "
                f"got {self.max_failures!r}"
            )
        if (
            not isinstance(self.max_preemption_failures, int)
            or isinstance(self.max_preemption_failures, bool)
            or self.max_preemption_failures < -1
        ):
            raise ValueError(
                f"FailureConfig.max_preemption_failures must be an int >= -1 (-1 = unlimited), "
                f"got {self.max_preemption_failures!r}"
            )
        if not isinstance(self.relax_collectives_on_preemption, bool):
            raise ValueError(
                "FailureConfig.relax_collectives_on_preemption must be a bool, got "
                f"{self.relax_collectives_on_preemption!r}"
            )
        for name in ("restart_backoff_s", "max_restart_backoff_s", "preemption_grace_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise ValueError(f"FailureConfig.{name} must be a number >= 0, got {value!r}")

    def allows(self, failures: int) -> bool:
        """Whether a run that has seen ``failures`` failures may restart once more."""
        return self.max_failures == -1 or failures <= self.max_failures

    def allows_preemption(self, preemptions: int) -> bool:
        """Whether a run preempted ``preemptions`` times may restart in place once more."""
        return self.max_preemption_failures == -1 or preemptions <= self.max_preemption_failures

    def backoff_s(self, failures_in_a_row: int) -> float:
        """Seconds to wait before restarting after the n-th failure in a row (n >= 1)."""
        if failures_in_a_row < 1 or self.restart_backoff_s == 0:
            return 0.0
        exponent = min(failures_in_a_row - 1, 30)
        return float(min(self.max_restart_backoff_s, self.restart_backoff_s * 2**exponent))


class ValidationFn(Protocol):
    """What ``ValidationConfig.fn`` is (Ray Train's ``ValidationFn``): called with the
    checkpoint and the task's keyword arguments, it returns the validation metrics."""

    def __call__(self, checkpoint: Any, **kwargs: Any) -> dict[str, Any]: ...


@dataclass
class ValidationTaskConfig:
    """One validation's settings, passed as ``report(validation=ValidationTaskConfig(...))``
    (Ray Train 2.60's class of the same name).

    ``fn_kwargs`` are merged over ``ValidationConfig.task_config.fn_kwargs`` (these win)
    and passed as ``fn(checkpoint, **fn_kwargs)``; they must be JSON-serialisable, so that a
    new driver can re-queue a validation its predecessor left pending. ``timeout_s``
    (None: no timeout) counts from when the validation starts running.
    """

    fn_kwargs: dict[str, Any] | None = None
    timeout_s: float | None = None

    def __post_init__(self) -> None:
        if self.fn_kwargs is None:
            self.fn_kwargs = {}
        if not isinstance(self.fn_kwargs, dict):
            raise ValueError(
                f"ValidationTaskConfig.fn_kwargs must be a dict, got {type(self.fn_kwargs)}"
            )
        if self.timeout_s is not None and not self.timeout_s > 0:
            raise ValueError(
                "The `timeout_s` should be None or greater than zero, actual value: "
                f"{self.timeout_s}"
            )


#: ``ValidationConfig.resources`` of a TrainJob: the operator's validation pool advertises it.
VALIDATION_RESOURCE = "validation"


@dataclass
class ValidationConfig:
    """How checkpoints are validated: Ray Train 2.60's ``ValidationConfig`` and more.

    Ray 2.60 form: ``ValidationConfig(fn, task_config=ValidationTaskConfig(...),
    ray_remote_kwargs={...})`` passed as ``TorchTrainer(..., validation_config=...)``;
    ``report(..., checkpoint=c, validation=True)`` (or a ``ValidationTaskConfig``) then runs
    ``fn(checkpoint, **fn_kwargs) -> dict`` as a Ray task once ``c`` is committed. Ray 2.51
    form: ``report(..., validate_fn=f, validate_config=cfg)`` runs ``f(checkpoint, cfg)``.
    Either way the returned metrics merge into the checkpoint's (and rank it).

    The rest is keyword-only and ours: at most ``max_concurrent_validations`` run at once;
    ``timeout_s`` is the default timeout; ``wait_for_validations``: ``fit()`` waits for
    them. Placement: ``ray_remote_kwargs`` (Ray's ``.options()``) wins; else ``resources``
    and ``num_cpus``; else, when the Ray cluster advertises a ``validation`` resource (a
    TrainJob's validation pool, or ``trainjob run``'s local Ray), each validation asks for
    one unit of it and no CPU, so it runs on that cheaper pool; on a plain ``ray.init()`` it
    asks for what a Ray task asks for by default (1 CPU), as in Ray Train.
    ``validate_fn``/``validate_config`` validate *every* checkpoint (how a TrainJob's
    ``spec.validation.entrypoint`` takes effect).
    """

    fn: Callable[..., Any] | None = None
    task_config: ValidationTaskConfig | None = None
    ray_remote_kwargs: dict[str, Any] | None = None
    max_concurrent_validations: int = field(default=1, kw_only=True)
    #: Seconds a validation may run, counted from when it starts running: time spent
    #: waiting for a node (a pool scaling up from zero) does not count.
    timeout_s: float | None = field(default=None, kw_only=True)
    #: Ray resources each validation asks for; None: see the class docstring.
    resources: dict[str, float] | None = field(default=None, kw_only=True)
    num_cpus: float | None = field(default=None, kw_only=True)
    wait_for_validations: bool = field(default=True, kw_only=True)
    validate_fn: Callable[..., Any] | None = field(default=None, kw_only=True)
    validate_config: dict[str, Any] | None = field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        if self.fn is not None and not callable(self.fn):
            raise ValueError(f"ValidationConfig.fn must be callable, got {self.fn!r}")
        if self.task_config is None:
            self.task_config = ValidationTaskConfig()
        if self.ray_remote_kwargs is None:
            self.ray_remote_kwargs = {}
        if self.max_concurrent_validations < 1:
            raise ValueError(
                "ValidationConfig.max_concurrent_validations must be >= 1, got "
                f"{self.max_concurrent_validations}"
            )
        if self.timeout_s is not None and self.timeout_s <= 0:
            raise ValueError(f"ValidationConfig.timeout_s must be > 0, got {self.timeout_s}")

    def task_options(self, cluster_resources: dict[str, float]) -> dict[str, Any]:
        """The Ray ``.options()`` of a validation task on a cluster with these resources."""
        if self.ray_remote_kwargs:
            return dict(self.ray_remote_kwargs)
        if self.resources is not None:
            return {"num_cpus": self.num_cpus or 0.0, "resources": dict(self.resources)}
        if cluster_resources.get(VALIDATION_RESOURCE, 0) > 0:
            return {"num_cpus": self.num_cpus or 0.0, "resources": {VALIDATION_RESOURCE: 1.0}}
        return {} if self.num_cpus is None else {"num_cpus": self.num_cpus}


def _default_storage_path() -> str:
    return os.environ.get("TRAINJOB_STORAGE_PATH") or os.path.expanduser("~/trainjob_results")


def _default_name() -> str:
    return "run-" + _dt.datetime.now().strftime("%Y-%m-%d_%H-%M-%S")


@dataclass
class RunConfig:
    """Where a run stores its checkpoints and how it reacts to failures.

    A new driver with the same ``storage_path`` and ``name`` resumes from the
    latest committed checkpoint recorded in ``<storage_path>/<name>``.

    ``storage_path``: a local or mounted folder, ``gs://bucket/prefix``, ``s3://bucket/prefix``
    (or another scheme pyarrow serves), or with ``storage_filesystem`` (any
    ``pyarrow.fs.FileSystem``, as in Ray Train) a path on that filesystem without its scheme
    (``bucket/prefix``). ``worker_runtime_env``: Ray's runtime environment of the worker
    actors (a dict or ``ray.runtime_env.RuntimeEnv``; its ``env_vars`` are merged with
    ``worker_env``, whose values win). ``callbacks``: :class:`~trainer_runtime.callbacks.Callback`
    and Ray Train's :class:`~trainer_runtime.callbacks.UserCallback` instances.
    """

    name: str | None = None
    storage_path: str | None = None
    failure_config: FailureConfig | None = None
    checkpoint_config: CheckpointConfig | None = None
    validation_config: ValidationConfig | None = None
    callbacks: list[Any] = field(default_factory=list)
    #: Extra environment variables set in every worker process.
    worker_env: dict[str, str] = field(default_factory=dict)
    #: Upload mode of ``report()`` calls that pass none (default: SYNC, as in Ray Train).
    checkpoint_upload_mode: str | None = None
    #: A ``pyarrow.fs.FileSystem`` holding ``storage_path`` (Ray Train's ``storage_filesystem``).
    storage_filesystem: Any = None
    #: Ray runtime environment of the worker actors (Ray Train's ``worker_runtime_env``).
    worker_runtime_env: Any = None

    def __post_init__(self) -> None:
        if self.name is None:
            self.name = _default_name()
        if not self.name or "/" in self.name:
            raise ValueError(
                f"RunConfig.name must be a non-empty string without '/', got {self.name!r}"
            )
        if self.storage_path is None:
            self.storage_path = _default_storage_path()
        if self.storage_filesystem is not None and not _is_pyarrow_filesystem(
            self.storage_filesystem
        ):
            raise ValueError(
                "RunConfig.storage_filesystem must be a pyarrow.fs.FileSystem, got "
                f"{type(self.storage_filesystem).__name__}"
            )

        # s3://bucket/prefix?endpoint_override=...: pyarrow's filesystem and the path on it.
        self.storage_path, self.storage_filesystem = split_query_uri(
            self.storage_path, self.storage_filesystem
        )
        self.storage_path = validate_storage_uri(
            self.storage_path, field="RunConfig.storage_path", filesystem=self.storage_filesystem
        )
        self.failure_config = self.failure_config or FailureConfig()
        self.checkpoint_config = self.checkpoint_config or CheckpointConfig()
        self.validation_config = self.validation_config or ValidationConfig()
        self.callbacks = list(self.callbacks or [])

        for callback in self.callbacks:
            if not isinstance(callback, Callback | UserCallback):
                raise ValueError(
                    "RunConfig.callbacks must be trainer_runtime.UserCallback (Ray Train's hooks) "
                    f"or trainer_runtime.Callback instances, got {type(callback).__name__}"
                )
        if self.worker_runtime_env is None:
            self.worker_runtime_env = {}
        if not isinstance(self.worker_runtime_env, dict):
            raise ValueError(
                "RunConfig.worker_runtime_env must be a dict or a ray.runtime_env.RuntimeEnv, "
                f"got {type(self.worker_runtime_env).__name__}"
            )
        if self.checkpoint_upload_mode is not None:
            self.checkpoint_upload_mode = CheckpointUploadMode.parse(
                self.checkpoint_upload_mode
            ).value

    @property
    def run_path(self) -> str:
        """The run folder: ``<storage_path>/<name>``."""
        assert self.storage_path is not None and self.name is not None
        return join_uri(self.storage_path, self.name)

    def worker_runtime_env_with(self, env: dict[str, str] | None = None) -> dict[str, Any]:
        """The worker actors' Ray ``runtime_env``: ``worker_runtime_env`` with ``env`` (and
        ``worker_env``) merged into its ``env_vars``; ``{}`` when there is nothing to set."""
        runtime_env = dict(self.worker_runtime_env or {})
        env_vars = {
            **dict(runtime_env.get("env_vars") or {}),
            **self.worker_env,
            **(env or {}),
        }
        if env_vars:
            runtime_env["env_vars"] = env_vars
        return runtime_env


def _is_pyarrow_filesystem(value: Any) -> bool:
    try:
        import pyarrow.fs as pafs
    except ImportError:  # pragma: no cover - depends on the install
        return hasattr(value, "open_output_stream")
    return isinstance(value, pafs.FileSystem)


def resolved(run_config: RunConfig | None) -> RunConfig:
    """A RunConfig with every optional part filled in."""
    return run_config if run_config is not None else RunConfig()
