"""JAX support: ``JaxTrainer`` (``jax.distributed`` across Ray workers, on CPU or TPU slices).

Mirrors ``ray.train.v2.jax``: ``from ray.train.v2.jax import JaxTrainer`` becomes
``from trainer_runtime.jax import JaxTrainer``::

    from trainer_runtime import RunConfig, ScalingConfig
    from trainer_runtime.jax import JaxTrainer

    JaxTrainer(
        train_func,
        train_loop_config={"steps": 100},
        scaling_config=ScalingConfig(
            num_workers=4, use_tpu=True, topology="4x4", accelerator_type="TPU-V6E"
        ),
        run_config=RunConfig(name="run", storage_path="gs://bucket/runs"),
    ).fit()

How it runs:

* One worker actor per TPU host (``num_workers`` = hosts per slice x ``num_slices``, from the
  table in :mod:`trainer_runtime.tpu`), each asking for ``{"TPU": chips per host}``. Each slice
  is one placement group pinned to one slice through Ray's ``TPU-<pod type>-head`` and
  ``{TPU_NAME: 1}`` resources; all slices are reserved before any worker starts, within
  ``ScalingConfig.placement_timeout_s`` (see :class:`trainer_runtime.worker_group.WorkerGroup`).
  Multi-slice workers get ``MEGASCALE_NUM_SLICES``, ``MEGASCALE_SLICE_ID``,
  ``MEGASCALE_COORDINATOR_ADDRESS`` and ``MEGASCALE_PORT``.
* :class:`JaxBackend`: rank 0 picks ``ip:free port`` as the coordinator and every worker calls
  ``jax.distributed.initialize(coordinator, num_workers, rank)`` before the train function
  starts, with ``JAX_PLATFORMS`` = ``tpu`` for TPU workers and ``cpu`` otherwise (a
  ``JAX_PLATFORMS`` already in the workers' environment wins, e.g. from
  ``RunConfig.worker_env``); on CPU, cross-process collectives use gloo. At tear-down,
  ``jax.distributed.shutdown()`` runs with a bounded wait.
* ``num_workers=0`` (local mode) runs the function in this process without ``jax.distributed``.
* ``report``, checkpoints, validation and restarts are the shared
  :class:`~trainer_runtime.trainer.DataParallelTrainer` machinery.

What has and has not been run on real TPUs
------------------------------------------
Nothing in this package has been run on a real TPU yet. What is tested (``tests/runtime``):

* two and four JAX processes on CPU joined by ``jax.distributed`` (gloo), with a
  cross-process collective checked for the right value, checkpoints, resume, local mode;
* the TPU table, the ``ScalingConfig`` checks, and slice placement on a local Ray cluster whose
  nodes *fake* TPU hosts (``ray start --resources='{"TPU": 4}'`` with ``TPU_NAME``,
  ``TPU_WORKER_ID``, ``TPU_ACCELERATOR_TYPE`` set, so that Ray's own TPU code advertises the
  slice and head resources, or with those resources declared directly); JAX runs on CPU there.

Not run: libtpu / ``JAX_PLATFORMS=tpu`` initialisation, ICI within a slice, multi-slice
(megascale/DCN) collectives, the ``TPU_WORKER_HOSTNAMES`` ordering on GKE, or Ray's TPU
resource advertisement on real GKE TPU pods (the resource names come from reading Ray 2.60's
``ray/_private/accelerators/tpu.py`` and ``ray/util/tpu.py``, and from running that code with
the TPU environment variables faked).
"""

from trainer_runtime.jax.backend import JaxBackend, JaxConfig
from trainer_runtime.jax.trainer import JaxTrainer

__all__ = ["JaxBackend", "JaxConfig", "JaxTrainer"]
