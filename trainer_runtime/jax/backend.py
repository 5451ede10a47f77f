"""``jax.distributed`` set-up for JAX workers (coordinator on rank 0)."""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trainer_runtime.backend import Backend

if TYPE_CHECKING:
    from trainer_runtime.config import ScalingConfig
    from trainer_runtime.context import TrainContext
    from trainer_runtime.worker_group import WorkerGroup

logger = logging.getLogger(__name__)


@dataclass
class JaxConfig:
    """How the JAX workers join one ``jax.distributed`` job.

    Attributes:
        platforms: ``JAX_PLATFORMS`` of the workers. Default: the workers' own
            ``JAX_PLATFORMS`` if set (e.g. through ``RunConfig.worker_env``), else ``tpu`` with
            ``ScalingConfig.use_tpu`` and ``cpu`` otherwise.
        cpu_collectives: cross-process collectives on CPU (``jax_cpu_collectives_implementation``;
            ``gloo`` works without MPI).
        initialization_timeout_s: how long ``jax.distributed.initialize`` waits for all
            processes to connect.
        shutdown_timeout_s: bound on the ``jax.distributed.shutdown`` barrier at tear-down
            (best effort: a dead peer must not hang the controller).
        heartbeat_timeout_s: after this long without a heartbeat JAX declares a peer dead.
    """

    platforms: str | None = None
    cpu_collectives: str = "gloo"
    initialization_timeout_s: int = 300
    shutdown_timeout_s: int = 30
    heartbeat_timeout_s: int = 100

    def __post_init__(self) -> None:
        if self.cpu_collectives not in ("gloo", "mpi"):
            raise ValueError(
                f"JaxConfig.cpu_collectives={self.cpu_collectives!r} is not valid; use gloo or mpi"
            )
        for name in ("initialization_timeout_s", "shutdown_timeout_s", "heartbeat_timeout_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"JaxConfig.{name} must be > 0, got {getattr(self, name)}")

    def resolve_platforms(self, use_tpu: bool, env: dict[str, str] | None = None) -> str:
        """The ``JAX_PLATFORMS`` value for a worker whose environment is ``env``."""
        env = dict(os.environ) if env is None else env
        return self.platforms or env.get("JAX_PLATFORMS") or ("tpu" if use_tpu else "cpu")


def _initialize_distributed(
    coordinator_address: str,
    num_processes: int,
    process_id: int,
    use_tpu: bool,
    config: JaxConfig,
) -> dict[str, Any]:
    """Runs in each worker: set the platform, then ``jax.distributed.initialize``.

    It must run before the process's first JAX computation (the worker actors are fresh
    processes, and the train function starts only after every worker returned).
    """
    platforms = config.resolve_platforms(use_tpu)
    os.environ["JAX_PLATFORMS"] = platforms
    import jax

    jax.config.update("jax_platforms", platforms)
    kwargs: dict[str, Any] = {
        "initialization_timeout": config.initialization_timeout_s,
        "heartbeat_timeout_seconds": config.heartbeat_timeout_s,
        "shutdown_timeout_seconds": config.shutdown_timeout_s,
    }
    if "tpu" not in platforms.split(","):
        # CPU: cross-process collectives need an implementation (gloo over TCP), and there is
        # no cluster to auto-detect (Slurm/MPI/TPU detection would second-guess our ranks).
        jax.config.update("jax_cpu_collectives_implementation", config.cpu_collectives)
        kwargs["cluster_detection_method"] = "deactivate"
    jax.distributed.initialize(coordinator_address, num_processes, process_id, **kwargs)
    return {
        "process_index": jax.process_index(),
        "process_count": jax.process_count(),
        "platforms": platforms,
    }


def _shutdown_distributed() -> None:
    """Runs in each worker: leave the ``jax.distributed`` job if this process joined one."""
    if "jax" not in sys.modules:  # never imported here: nothing was initialised
        return
    import jax

    if jax.distributed.is_initialized():
        jax.distributed.shutdown()


class JaxBackend(Backend):
    """Joins every worker to one ``jax.distributed`` job; rank 0 hosts the coordinator.

    Follows Ray Train's ``ray/train/v2/jax/config.py`` (``_JaxBackend``): rank 0's
    ``ip:free port`` is the coordinator, every worker calls
    ``jax.distributed.initialize(coordinator, num_workers, rank)``, with ``JAX_PLATFORMS=tpu``
    for TPU workers. Unlike Ray's, CPU workers are initialised too (with gloo collectives), so
    multi-process JAX runs and is tested on CPU. TPU slice/MEGASCALE environment comes from the
    worker group.
    """

    supports_torchrun = False

    def __init__(self, config: JaxConfig | None = None) -> None:
        self.config = config or JaxConfig()

    def on_start(self, group: WorkerGroup, scaling: ScalingConfig) -> None:
        """Rank 0 picks the coordinator address; every worker initialises jax.distributed."""
        import ray

        addr, port = ray.get(group.workers[0].actor.address_and_port.remote())
        coordinator = f"{addr}:{port}"
        infos = ray.get(
            [
                w.actor.execute.remote(
                    _initialize_distributed,
                    coordinator,
                    group.world_size,
                    w.rank,
                    scaling.use_tpu,
                    self.config,
                )
                for w in group.workers
            ]
        )
        logger.info(
            "jax.distributed ready: %d processes on %s, coordinator %s",
            group.world_size,
            infos[0]["platforms"] if infos else "?",
            coordinator,
        )

    def on_shutdown(self, group: WorkerGroup) -> None:
        """``jax.distributed.shutdown()`` on every worker, bounded by ``shutdown_timeout_s``."""
        try:
            group.execute(_shutdown_distributed, timeout=self.config.shutdown_timeout_s)
        except Exception as exc:  # noqa: BLE001 - tear-down is best effort; actors die next
            logger.warning("jax.distributed shutdown did not finish cleanly: %s", exc)

    def on_local_start(self, context: TrainContext, scaling: ScalingConfig) -> None:
        """Local mode: nothing to set up (one process, no jax.distributed)."""

    def on_local_shutdown(self) -> None:
        """Local mode: nothing to tear down."""
