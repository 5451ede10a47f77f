"""``DataParallelTrainer``: run a train function on N workers and return a :class:`Result`."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from trainer_runtime._controller import RayController, RunSpec
from trainer_runtime._local import LocalController, local_ranks
from trainer_runtime._worker import check_train_fn_signature
from trainer_runtime.backend import Backend
from trainer_runtime.config import RunConfig, ScalingConfig, ValidationConfig
from trainer_runtime.data_config import DataConfig, GenDataset, check_datasets
from trainer_runtime.errors import UserConfigError
from trainer_runtime.result import Result


class DataParallelTrainer:
    """Runs ``train_loop_per_worker`` on every worker (Ray actors, or this process).

    ``fit()`` returns a :class:`Result`, or raises
    :class:`~trainer_runtime.errors.TrainingFailedError` once
    ``FailureConfig.max_failures`` is exhausted.

    ``datasets`` (name -> ``ray.data.Dataset``, or a function returning one) and
    ``dataset_config`` (:class:`~trainer_runtime.data_config.DataConfig`) are Ray Train's:
    for every worker group the datasets named in ``DataConfig.datasets_to_split`` (all by
    default) are split among its workers with Ray Data's ``streaming_split(num_workers,
    equal=True)``, the others go whole to every worker, and each worker reads its part with
    :func:`trainer_runtime.get_dataset_shard`. The driver's ``ray.data.DataContext`` (when
    ``fit()`` is called) becomes the workers' current one. A restarted worker group gets a new
    split. In local mode (``num_workers=0``) each dataset is one whole shard; under torchrun
    with several processes datasets are refused, as in Ray.
    """

    backend_cls: type[Backend] = Backend

    def __init__(
        self,
        train_loop_per_worker: Callable[..., Any],
        *,
        train_loop_config: dict[str, Any] | None = None,
        scaling_config: ScalingConfig | None = None,
        run_config: RunConfig | None = None,
        backend: Backend | None = None,
        validation_config: ValidationConfig | None = None,
        datasets: dict[str, GenDataset] | None = None,
        dataset_config: DataConfig | None = None,
    ) -> None:
        if not callable(train_loop_per_worker):
            raise TypeError(
                f"train_loop_per_worker must be a function, got {type(train_loop_per_worker)}"
            )
        if train_loop_config is not None and not isinstance(train_loop_config, dict):
            raise TypeError(
                f"train_loop_config must be a dict, got {type(train_loop_config).__name__}"
            )
        self.train_loop_per_worker = train_loop_per_worker
        self.train_loop_config = train_loop_config
        self.scaling_config = scaling_config or ScalingConfig()
        self.run_config = run_config or RunConfig()
        if validation_config is not None:
            # Ray 2.60 passes it to the trainer; RunConfig.validation_config is the same slot.
            if not isinstance(validation_config, ValidationConfig):
                raise TypeError(
                    "validation_config must be a trainer_runtime.ValidationConfig, got "
                    f"{type(validation_config).__name__}"
                )
            self.run_config = dataclasses.replace(
                self.run_config, validation_config=validation_config
            )
        self.backend = backend or self._make_backend()
        self.datasets = check_datasets(datasets, dataset_config)
        self.data_config = dataset_config or DataConfig()

    def _make_backend(self) -> Backend:
        return self.backend_cls()

    def _spec(self) -> RunSpec:
        return RunSpec(
            self.train_loop_per_worker,
            self.train_loop_config,
            self.scaling_config,
            self.run_config,
            self.backend,
            datasets=self.datasets,
            data_config=self.data_config,
        )

    def fit(self) -> Result:
        """Run training to completion (resuming from the run folder's latest checkpoint).

        Raises:
            ValueError: a train function of more than one required argument (Ray's message).
        """
        check_train_fn_signature(self.train_loop_per_worker)
        spec = self._spec()
        if self.scaling_config.local_mode:
            world = local_ranks().world_size
            if self.datasets and world > 1:
                # Ray's own sentence (its local mode asserts it), then what to do instead.
                raise UserConfigError(
                    "Ray Data is not supported in local mode with multiple workers. "
                    f"This process is one of {world} torchrun processes (WORLD_SIZE={world}) "
                    f"and the trainer was given datasets {sorted(self.datasets)}: run with "
                    "ScalingConfig(num_workers=N) on Ray so that each worker gets a shard, "
                    "or run a single process (each dataset is then one whole shard)"
                )
            return LocalController(spec).run()
        return self._ray_controller(spec).run()

    def _ray_controller(self, spec: RunSpec) -> Any:
        return RayController(spec)
