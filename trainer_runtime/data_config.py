"""``DataConfig``: how the trainer's Ray Datasets reach its workers (``ray.train.DataConfig``).

Ray Data does the work: each dataset named in ``datasets_to_split`` is split with
``Dataset.streaming_split(num_workers, equal=True, locality_hints=<the workers' nodes>)`` and
each worker's :func:`trainer_runtime.get_dataset_shard` returns its ``DataIterator``; every
other dataset goes whole to every worker (``Dataset.iterator()``). Each pass over a shard
(``iter_batches``, ``iter_torch_batches`` ...) executes the dataset again: one epoch.

Ray is needed only when datasets are given (``ray.data`` is imported then, not before).
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, Union

if TYPE_CHECKING:
    from ray.data import DataIterator, Dataset, ExecutionOptions

#: A ``ray.data.Dataset``, or a function of no arguments returning one (called once per
#: worker group, as Ray Train does).
logger = logging.getLogger(__name__)

GenDataset = Union["Dataset", Callable[[], "Dataset"]]


class DataConfig:
    """Which datasets are split among the workers, and Ray Data's execution options for them.

    Same constructor and semantics as ``ray.train.DataConfig`` (Ray 2.60), so
    ``from ray.train import DataConfig`` becomes ``from trainer_runtime import DataConfig``:

    * ``datasets_to_split``: ``"all"`` (the default) or a list of names of the trainer's
      ``datasets``. Those are split equally among the workers (``streaming_split``); the
      others go whole to every worker. A name that is not one of the trainer's ``datasets``
      is refused when the trainer is built (Ray ignores it).
    * ``execution_options``: a ``ray.data.ExecutionOptions`` for every dataset, or a dict of
      dataset name to ``ExecutionOptions``; datasets without one get
      :meth:`default_ingest_options` (the driver's ``DataContext`` options).
    * ``enable_shard_locality``: hand each worker the blocks on its own node where possible
      (``locality_hints``).

    As in Ray, :meth:`configure` may be overridden by a subclass for custom assignments.
    """

    def __init__(
        self,
        datasets_to_split: Literal["all"] | list[str] = "all",
        execution_options: ExecutionOptions | dict[str, ExecutionOptions] | None = None,
        enable_shard_locality: bool = True,
    ) -> None:
        if isinstance(datasets_to_split, list) or datasets_to_split == "all":
            self._datasets_to_split = datasets_to_split
        else:
            raise TypeError(
                "`datasets_to_split` should be a 'all' or a list of strings of "
                "dataset names. Received "
                f"{type(datasets_to_split).__name__} with value {datasets_to_split}."
            )
        if isinstance(datasets_to_split, list):
            bad = [n for n in datasets_to_split if not isinstance(n, str)]
            if bad:
                raise TypeError(
                    "`datasets_to_split` should be a 'all' or a list of strings of dataset "
                    f"names. Received {bad!r} among the names: name the datasets as in the "
                    "trainer's `datasets` dict, e.g. DataConfig(datasets_to_split=['train'])."
                )
        self._user_execution_options = execution_options
        self._enable_shard_locality = enable_shard_locality

    def _get_user_execution_options(self, dataset_name: str) -> ExecutionOptions | None:
        """The user's execution options for ``dataset_name``, if any."""
        if self._user_execution_options is None:
            return None
        if isinstance(self._user_execution_options, dict):
            return self._user_execution_options.get(dataset_name)
        return self._user_execution_options

    def _resolve_execution_options(self, dataset_name: str) -> ExecutionOptions:
        """A deep copy of the execution options in effect for ``dataset_name``."""
        return copy.deepcopy(
            self._get_user_execution_options(dataset_name) or self.default_ingest_options()
        )

    def configure(
        self,
        datasets: dict[str, Dataset],
        world_size: int,
        worker_handles: list[Any] | None,
        worker_node_ids: list[str] | None,
        **kwargs: Any,
    ) -> list[dict[str, DataIterator]]:
        """Each worker's ``DataIterator`` per dataset name (a list of ``world_size`` dicts).

        Called on the driver once per worker group, with the workers' Ray node ids.
        """
        output: list[dict[str, DataIterator]] = [{} for _ in range(world_size)]
        for dataset_name, dataset in datasets.items():
            if dataset.name is None:
                dataset.set_name(dataset_name)
        split = set(datasets) if self._datasets_to_split == "all" else set(self._datasets_to_split)
        locality_hints = worker_node_ids if self._enable_shard_locality else None
        for name, ds in datasets.items():
            ds = ds.copy(ds)
            ds.context.execution_options = self._resolve_execution_options(name)
            if name in split:
                for i, shard in enumerate(
                    ds.streaming_split(world_size, equal=True, locality_hints=locality_hints)
                ):
                    output[i][name] = shard
            else:
                for i in range(world_size):
                    output[i][name] = ds.iterator()
        return output

    @staticmethod
    def default_ingest_options() -> ExecutionOptions:
        """The Ray Data options used for ingest by default: those of the current
        ``DataContext`` (resource limits, excluded resources, order, progress)."""
        from ray.data import ExecutionOptions
        from ray.data.context import DataContext

        ctx = DataContext.get_current()
        return ExecutionOptions(
            resource_limits=ctx.execution_options.resource_limits,
            exclude_resources=ctx.execution_options.exclude_resources,
            preserve_order=ctx.execution_options.preserve_order,
            verbose_progress=ctx.execution_options.verbose_progress,
        )


def check_datasets(datasets: Any, dataset_config: Any) -> dict[str, Any]:
    """The trainer's ``datasets`` and ``dataset_config`` checked together (clear errors at
    construction, naming the argument and the fix); returns the datasets as a dict."""
    if datasets is None:
        datasets = {}
    if not isinstance(datasets, Mapping):
        raise TypeError(
            f"datasets must be a dict of name -> ray.data.Dataset, got "
            f"{type(datasets).__name__}: pass datasets={{'train': ds}} and read it in the "
            "train function with trainer_runtime.get_dataset_shard('train')"
        )
    for name, ds in datasets.items():
        if not isinstance(name, str):
            raise TypeError(f"datasets keys must be names (str), got {name!r}")
        if not (callable(ds) or hasattr(ds, "streaming_split")):
            raise TypeError(
                f"datasets[{name!r}] must be a ray.data.Dataset or a function of no arguments "
                f"returning one, got {type(ds).__name__}"
            )
    if dataset_config is not None:
        if not callable(getattr(dataset_config, "configure", None)):
            raise TypeError(
                "dataset_config must be a trainer_runtime.DataConfig (or ray.train.DataConfig), "
                f"got {type(dataset_config).__name__}"
            )
        to_split = getattr(dataset_config, "_datasets_to_split", "all")
        if isinstance(to_split, Sequence) and not isinstance(to_split, str):
            unknown = [n for n in to_split if n not in datasets]
            if unknown:
                raise ValueError(
                    f"DataConfig(datasets_to_split=...) names {unknown!r}, which "
                    f"{'is' if len(unknown) == 1 else 'are'} not in the trainer's datasets "
                    f"({sorted(datasets) or 'none given'}): pass them in "
                    "datasets={name: ray.data.Dataset} or remove them from datasets_to_split"
                )
    return dict(datasets)


def group_shards(
    datasets: Mapping[str, GenDataset],
    dataset_config: DataConfig,
    world_size: int,
    worker_node_ids: list[str] | None,
) -> list[dict[str, DataIterator]]:
    """Each rank's shards for one new worker group, as Ray Train V2 builds them: dataset
    functions are called (once per group), then ``dataset_config.configure`` splits the
    datasets for this group's size and nodes."""
    built = {k: v() if callable(v) else v for k, v in datasets.items()}
    shards = dataset_config.configure(
        datasets=built,
        world_size=world_size,
        worker_handles=None,
        worker_node_ids=worker_node_ids,
    )
    if len(shards) != world_size:
        raise ValueError(
            f"{type(dataset_config).__name__}.configure returned {len(shards)} shard dicts "
            f"for {world_size} workers: it must return one dict per worker"
        )
    return shards


def local_shards(
    datasets: Mapping[str, GenDataset], dataset_config: DataConfig
) -> dict[str, DataIterator]:
    """Local mode (one process, no worker group): every dataset whole, as one shard (a
    ``DataIterator`` over the dataset with its execution options; no split, whatever
    ``datasets_to_split`` says)."""
    out: dict[str, DataIterator] = {}
    for name, gen in datasets.items():
        ds = gen() if callable(gen) else gen
        if ds.name is None:
            ds.set_name(name)
        ds = ds.copy(ds)
        resolve = getattr(dataset_config, "_resolve_execution_options", None)
        if resolve is not None:
            ds.context.execution_options = resolve(name)
        out[name] = ds.iterator()
    return out


def shutdown_shards(shards: Sequence[Mapping[str, Any]]) -> None:
    """Stop the Ray Data executors behind a finished group's split shards (best effort, as
    Ray Train's ``shutdown_data_executors``): each ``streaming_split`` has one coordinator
    actor, shared by its shards."""
    coordinators = {}
    for per_rank in shards:
        for it in per_rank.values():
            coord = getattr(it, "_coord_actor", None)
            if coord is not None:
                coordinators[id(coord)] = coord
    if not coordinators:
        return
    import ray

    try:
        refs = [c.shutdown_executor.remote() for c in coordinators.values()]
        ray.get(refs, timeout=5)
    except Exception as exc:  # noqa: BLE001 - they go away with their last handle anyway
        logger.debug("stopping the Ray Data split coordinators failed: %s", exc)


#: How often the workers' resources are registered again with Ray Data's coordinator, and after
#: how long a registration lapses (Ray Train 2.60's ``AUTOSCALING_REQUESTS_INTERVAL_S`` and
#: ``AUTOSCALING_REQUESTS_EXPIRE_TIME_S``).
RESOURCE_REQUEST_INTERVAL_S = 20.0
RESOURCE_REQUEST_EXPIRE_S = 180.0


class TrainingResourceRequest:
    """The worker group's resources, registered with Ray Data's autoscaling coordinator at high
    priority, as Ray Train 2.60's scaling policy registers them: Ray Data then budgets what the
    cluster has beyond the training workers, instead of counting their CPUs/GPUs as its own.

    The coordinator is Ray Data's internal actor: a Ray without it, or a failed call, only
    logs (Ray Data then budgets the whole cluster, its default).
    """

    def __init__(self, requester_id: str, resources: list[dict[str, float]]) -> None:
        self.requester_id = requester_id
        self.resources = [dict(r) for r in resources]
        self._sent_at = float("-inf")
        self._coordinator: Any = None

    def _handle(self) -> Any:
        if self._coordinator is None:
            from ray.data._internal.cluster_autoscaler.default_autoscaling_coordinator import (
                get_or_create_autoscaling_coordinator,
            )

            self._coordinator = get_or_create_autoscaling_coordinator()
        return self._coordinator

    def renew(self, force: bool = False) -> None:
        """(Re-)register the resources, at most every ``RESOURCE_REQUEST_INTERVAL_S`` unless
        ``force``; fire and forget."""
        now = time.monotonic()
        if not force and now - self._sent_at < RESOURCE_REQUEST_INTERVAL_S:
            return
        self._sent_at = now
        try:
            from ray.data._internal.cluster_autoscaler.base_autoscaling_coordinator import (
                ResourceRequestPriority,
            )

            self._handle().request_resources.remote(
                requester_id=self.requester_id,
                resources=self.resources,
                expire_after_s=RESOURCE_REQUEST_EXPIRE_S,
                priority=ResourceRequestPriority.HIGH,
            )
        except Exception as exc:  # noqa: BLE001 - Ray Data then budgets the whole cluster
            logger.debug("registering the training resources with Ray Data failed: %s", exc)

    def cancel(self) -> None:
        """Withdraw the registration (the worker group is gone); best effort."""
        if self._coordinator is None:
            return
        try:
            self._coordinator.cancel_request.remote(requester_id=self.requester_id)
        except Exception as exc:  # noqa: BLE001 - it lapses after RESOURCE_REQUEST_EXPIRE_S
            logger.debug("withdrawing the training resources from Ray Data failed: %s", exc)


def capture_data_context() -> Any:
    """A copy of the driver's current ``ray.data.DataContext`` (to install in the workers)."""
    from ray.data.context import DataContext

    return copy.deepcopy(DataContext.get_current())


def select_data_nodes(labels: Mapping[str, str]) -> None:
    """Add ``labels`` to the current ``DataContext``'s ``execution_options.label_selector``:
    the Ray Data work this process starts from now on runs only on Ray nodes with them."""
    from ray.data.context import DataContext

    options = DataContext.get_current().execution_options
    options.label_selector = {**(options.label_selector or {}), **labels}


def install_data_context(ctx: Any) -> None:
    """Make ``ctx`` (the driver's ``DataContext``) the current one in this worker process."""
    from ray.data.context import DataContext

    DataContext._set_current(ctx)
