"""Turn a TrainJob into a runtime trainer: entrypoints, workers and storage resolved first
(:func:`plan_run`), then the TorchTrainer/JaxTrainer (:func:`build_trainer`).

Shared by ``trainjob run`` (:mod:`.local`, this machine) and the in-cluster driver
(:mod:`.driver`); both publish :class:`~trainjob_operator.launcher.status.StatusTracker`'s view
of the run.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from trainer_runtime import (
    CheckpointConfig,
    DataConfig,
    FailureConfig,
    RunConfig,
    ScalingConfig,
    ValidationConfig,
)
from trainer_runtime.callbacks import Callback
from trainer_runtime.config import VALIDATION_RESOURCE
from trainer_runtime.data_config import select_data_nodes
from trainjob_operator.api.fields import split_entrypoint
from trainjob_operator.api.trainjob import TrainJob
from trainjob_operator.constants import DATA_LABELS_ENV, WORKER_LABEL_SELECTOR_ENV

__all__ = [
    "DEFAULT_LOCAL_STORAGE",
    "EntrypointError",
    "RunPlan",
    "build_datasets",
    "build_trainer",
    "plan_run",
    "resolve_entrypoint",
]

DEFAULT_LOCAL_STORAGE = "~/trainjob_results"


class EntrypointError(ValueError):
    """An entrypoint cannot be imported; ``field`` names the manifest field."""

    def __init__(self, field: str, message: str, hint: str) -> None:
        super().__init__(f"{field}: {message} (hint: {hint})")
        self.field = field


def resolve_entrypoint(
    entrypoint: str, field: str, import_from: str | None = None
) -> Callable[..., Any]:
    """Import ``package.module:function`` from the interpreter's ``sys.path``.

    ``import_from``: a folder to make importable first (``trainjob run`` passes the current
    folder). Without it nothing is added: the in-cluster driver imports the user's code from
    the image's path (``PYTHONPATH``, ``/workspace`` in the runtime image, and the working
    directory, which ``python -m`` puts first).
    """
    if import_from is not None and import_from not in sys.path:
        sys.path.insert(0, import_from)
    module_name, attr = split_entrypoint(entrypoint)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise EntrypointError(
            field,
            f"cannot import module {module_name!r} ({exc})",
            "run from the folder that contains the package, or add it to PYTHONPATH",
        ) from exc
    except Exception as exc:
        raise EntrypointError(
            field,
            f"importing {module_name!r} failed: {exc!r}",
            "fix the module so that it imports cleanly",
        ) from exc
    fn = getattr(module, attr, None)
    if fn is None:
        names = sorted(
            n for n in dir(module) if not n.startswith("_") and callable(getattr(module, n))
        )
        raise EntrypointError(
            field,
            f"module {module_name!r} has no attribute {attr!r}",
            f"callables there: {', '.join(names[:10]) or 'none'}",
        )
    if not callable(fn):
        raise EntrypointError(field, f"{entrypoint} is not callable", "point it at a function")
    return fn


@dataclass
class RunPlan:
    """Everything needed to start the run, resolved before anything starts."""

    job: TrainJob
    train_fn: Callable[..., Any]
    validate_fn: Callable[..., Any] | None
    num_workers: int
    storage_path: str
    worker_cpus: float
    worker_gpus: int = 0
    """GPUs per worker: the ``nvidia.com/gpu`` count the worker pods are rendered with."""
    trainer_kwargs: dict[str, Any] = field(default_factory=dict)
    datasets_fn: Callable[..., Any] | None = None
    """``spec.data.datasets``: called with ``spec.config`` to build the trainer's datasets."""
    min_workers: int | None = None
    """Elastic training (``spec.scaling.minWorkers`` or ``tpu.minSlices``): the fewest workers
    the run goes on with; ``num_workers`` is then the most. None: a fixed size."""


def plan_run(
    job: TrainJob,
    num_workers: int | None = None,
    storage_path: str | None = None,
    import_from: str | None = None,
) -> RunPlan:
    """Resolve entrypoints, workers and storage of ``job`` (raises EntrypointError).

    ``import_from``: see :func:`resolve_entrypoint`.
    """
    spec = job.spec
    train_fn = resolve_entrypoint(spec.entrypoint, "spec.entrypoint", import_from)
    validate_fn = (
        resolve_entrypoint(spec.validation.entrypoint, "spec.validation.entrypoint", import_from)
        if spec.validation is not None
        else None
    )
    datasets_fn = (
        resolve_entrypoint(spec.data.datasets, "spec.data.datasets", import_from)
        if spec.data is not None
        else None
    )
    workers = spec.scaling.num_workers if num_workers is None else num_workers
    elastic_min = spec.scaling.elastic_min_workers
    if elastic_min is not None:
        # A smaller worker count given here (``trainjob run --workers``) caps the minimum too.
        elastic_min = min(elastic_min, workers) if workers > 0 else None
    storage = (
        storage_path
        or (spec.storage.path if spec.storage else None)
        or os.path.expanduser(DEFAULT_LOCAL_STORAGE)
    )
    # What each worker pod's Ray node advertises: one worker actor per pod.
    cpus = float(spec.scaling.cpus_per_worker())
    gpus = spec.scaling.gpus_per_worker() if spec.scaling.tpu is None else 0
    if spec.framework == "jax" and importlib.util.find_spec("trainer_runtime.jax") is None:
        raise EntrypointError(
            "spec.framework",
            "framework 'jax' needs trainer_runtime.jax, which this version does not include yet",
            "use framework: torch",
        )
    if (
        spec.scaling.tpu is not None
        and workers > 0
        and not os.environ.get("RAY_ADDRESS")
        and not os.environ.get("TPU_WORKER_ID")
    ):
        # Only meaningful for ``trainjob run`` starting its own local Ray on a machine without
        # TPUs. A driver that joins an existing cluster (``RAY_ADDRESS``: the in-cluster driver
        # pod, which runs on a CPU node) finds the TPU hosts through Ray's resources.
        raise EntrypointError(
            "spec.scaling.tpu",
            "this machine has no TPU hosts and RAY_ADDRESS names no Ray cluster to join",
            "run the TrainJob on GKE, set RAY_ADDRESS to a Ray cluster with TPU hosts, or pass "
            "--num-workers 0 to run the train function here in one process",
        )
    return RunPlan(
        job,
        train_fn,
        validate_fn,
        workers,
        storage,
        cpus,
        worker_gpus=gpus,
        datasets_fn=datasets_fn,
        min_workers=elastic_min,
    )


def _label_selector_from_env(name: str) -> dict[str, str] | None:
    """The Ray label selector (a JSON object) in the env var ``name``; None when unset."""
    value = os.environ.get(name)
    if not value:
        return None
    selector = json.loads(value)
    if not isinstance(selector, dict):
        raise ValueError(f"{name} must be a JSON object, got {value!r}")
    return {str(key): str(label) for key, label in selector.items()}


def worker_label_selector() -> dict[str, str] | None:
    """The Ray node labels the train workers must be placed on: set by the operator in the
    driver pod (:data:`~trainjob_operator.constants.WORKER_LABEL_SELECTOR_ENV`: the worker
    pods' Ray nodes, not the validation pool's); None elsewhere (``trainjob run``)."""
    return _label_selector_from_env(WORKER_LABEL_SELECTOR_ENV)


def data_label_selector() -> dict[str, str] | None:
    """The Ray node labels the training datasets' Ray Data tasks must run on: set by the
    operator in the driver pod (:data:`~trainjob_operator.constants.DATA_LABELS_ENV`: the data
    pool's Ray nodes); None elsewhere (``trainjob run``: any node of the local Ray)."""
    return _label_selector_from_env(DATA_LABELS_ENV)


def build_datasets(plan: RunPlan) -> tuple[dict[str, Any], DataConfig | None]:
    """The trainer's ``datasets`` and ``dataset_config`` from ``spec.data`` (empty and None
    without it). Call after ``ray.init``: the datasets function may start Ray Data work.

    ``datasets_fn(spec.config)`` must return a dict of name -> ``ray.data.Dataset``. With
    :func:`data_label_selector` set (a TrainJob's driver), the selector becomes the driver's
    ``DataContext.execution_options.label_selector`` before the function runs (what it starts,
    and the workers' copy of the context, stay on the data pool) and each dataset's
    ``ExecutionOptions.label_selector`` (Ray Train's default ingest options do not carry it
    over), so their reads and ``map_batches`` run on the data pool only.

    Raises:
        EntrypointError: when the function returns anything but a dict of datasets, or
            ``datasetsToSplit`` names a dataset it did not return (invalid input).
        RuntimeError: when the function itself raises (e.g. storage unreachable: retried).
    """
    data = plan.job.spec.data
    if data is None or plan.datasets_fn is None:
        return {}, None
    selector = data_label_selector()
    if selector:
        select_data_nodes(selector)
    try:
        datasets = plan.datasets_fn(dict(plan.job.spec.config))
    except Exception as exc:
        raise RuntimeError(f"spec.data.datasets ({data.datasets}) raised {exc!r}") from exc
    if not isinstance(datasets, dict) or not all(
        isinstance(name, str) and hasattr(ds, "streaming_split") for name, ds in datasets.items()
    ):
        raise EntrypointError(
            "spec.data.datasets",
            f"{data.datasets} returned {type(datasets).__name__}, not a dict of "
            "name -> ray.data.Dataset",
            "return e.g. {'train': ray.data.read_parquet(...)}",
        )
    unknown = sorted(set(data.datasets_to_split or ()) - set(datasets))
    if unknown:
        raise EntrypointError(
            "spec.data.datasetsToSplit",
            f"names {unknown}, which {data.datasets} did not return (it returned "
            f"{sorted(datasets) or 'none'})",
            "name the keys of the dict the datasets function returns",
        )
    options = None
    if selector:
        options = {}
        for name in datasets:
            options[name] = DataConfig.default_ingest_options()
            options[name].label_selector = dict(selector)
    config = DataConfig(
        datasets_to_split=list(data.datasets_to_split)
        if data.datasets_to_split is not None
        else "all",
        execution_options=options,
    )
    return datasets, config


def build_trainer(plan: RunPlan, callbacks: list[Callback], *, forward_env: bool = True) -> Any:
    """The runtime trainer (TorchTrainer / JaxTrainer) for a planned run.

    ``forward_env``: give the worker actors ``spec.env`` (its literal values) through
    ``RunConfig.worker_env``, as ``trainjob run`` needs. The in-pod driver passes ``False``:
    the worker pods already carry ``spec.env``, and the Ray ``runtime_env`` that
    ``worker_env`` becomes would keep Ray from giving the worker actors the processes the
    pods' raylets prestarted (:func:`trainjob_operator.render.ray.worker_prestart_env`).
    """
    spec = plan.job.spec
    validation = spec.validation
    upload_mode = {"async": "async", "sync": "sync", "none": "no_upload"}[
        spec.checkpoint.upload_mode
    ]
    resources: dict[str, float] = {"CPU": plan.worker_cpus}
    if plan.worker_gpus > 0:
        # The same count the worker pods get (``nvidia.com/gpu``; ``useGpu`` alone means 1).
        resources["GPU"] = float(plan.worker_gpus)
    run_config = RunConfig(
        name=plan.job.metadata.name,
        storage_path=plan.storage_path,
        checkpoint_config=CheckpointConfig(
            num_to_keep=spec.checkpoint.num_to_keep,
            checkpoint_score_attribute=spec.checkpoint.score_attribute,
            checkpoint_score_order=spec.checkpoint.score_order,
        ),
        failure_config=FailureConfig(
            max_failures=spec.failure.max_failures,
            max_preemption_failures=spec.failure.max_preemption_failures,
        ),
        validation_config=ValidationConfig(
            # The validation pool advertises this resource, also while it is scaled to zero:
            # validations wait for a pool node rather than run on the training workers.
            resources={VALIDATION_RESOURCE: 1.0},
            max_concurrent_validations=validation.max_concurrent if validation else 1,
            timeout_s=float(validation.timeout_seconds)
            if validation and validation.timeout_seconds
            else None,
            validate_fn=plan.validate_fn,
            validate_config=(
                validation.config
                if validation and validation.config is not None
                else dict(spec.config)
            ),
        ),
        checkpoint_upload_mode=upload_mode,
        callbacks=callbacks,
        worker_env=(
            {e.name: e.value for e in spec.env if e.value is not None} if forward_env else {}
        ),
    )
    tpu = spec.scaling.tpu
    timeout = spec.scaling.placement_timeout_seconds
    interval = spec.scaling.elastic_resize_interval_seconds
    scaling = ScalingConfig(
        # Elastic (spec.scaling.minWorkers, tpu.minSlices): Ray Train's (min, max) tuple.
        num_workers=(
            (plan.min_workers, plan.num_workers)
            if plan.min_workers is not None
            else plan.num_workers
        ),
        elastic_resize_monitor_interval_s=(
            float(interval)
            if interval is not None
            else ScalingConfig.elastic_resize_monitor_interval_s
        ),
        use_gpu=spec.scaling.use_gpu or plan.worker_gpus > 0,  # GPUs asked: Ray needs use_gpu
        resources_per_worker=resources,
        use_tpu=tpu is not None,
        accelerator_type=tpu.accelerator_type if tpu is not None else None,
        topology=tpu.topology if tpu is not None else None,
        num_slices=tpu.num_slices if tpu is not None else 1,
        # spec.scaling.placementTimeoutSeconds; unset keeps the runtime's default (600 s).
        placement_timeout_s=(
            float(timeout) if timeout is not None else ScalingConfig.placement_timeout_s
        ),
        label_selector=worker_label_selector(),
    )
    datasets, dataset_config = build_datasets(plan)
    data_kwargs: dict[str, Any] = (
        {"datasets": datasets, "dataset_config": dataset_config} if dataset_config else {}
    )
    if spec.framework == "torch":
        from trainer_runtime.torch import TorchTrainer

        return TorchTrainer(
            plan.train_fn,
            train_loop_config=dict(spec.config),
            scaling_config=scaling,
            run_config=run_config,
            **data_kwargs,
        )
    from trainer_runtime.jax import JaxTrainer

    jax_trainer: Any = JaxTrainer(
        plan.train_fn,
        train_loop_config=dict(spec.config),
        scaling_config=scaling,
        run_config=run_config,
        **data_kwargs,
    )
    return jax_trainer
