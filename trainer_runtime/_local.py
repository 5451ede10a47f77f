"""Local mode (``ScalingConfig(num_workers=0)``): the train function runs in this process.

Run plainly, there is one worker (rank 0 of 1). Under ``torchrun`` every
process is one rank: the process group comes from torchrun's environment, and
rank 0 hosts the run's controller; the other ranks send it their events
through torch.distributed's key-value store. Restarts under torchrun are
torchrun's (``--max-restarts``); each restart resumes from the latest
committed checkpoint.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from trainer_runtime._controller import BaseController, ControllerState
from trainer_runtime._events import Event, EventBuffer, WorkerFinishedEvent
from trainer_runtime._session import TrainSession
from trainer_runtime._worker import run_train_fn
from trainer_runtime.checkpoint import Checkpoint
from trainer_runtime.context import TrainContext
from trainer_runtime.data_config import local_shards
from trainer_runtime.errors import PreemptionStop, TrainingFailedError, UserConfigError
from trainer_runtime.preemption import install_sigterm_handler

logger = logging.getLogger("trainer_runtime")


@dataclass(frozen=True)
class LocalRanks:
    """Ranks of this process (from torchrun's environment, or a single process)."""

    world_rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    node_rank: int = 0


def local_ranks(env: dict[str, str] | None = None) -> LocalRanks:
    """Read torchrun-style rank variables; a single process when they are absent."""
    env = dict(os.environ) if env is None else env
    if "RANK" not in env or "WORLD_SIZE" not in env:
        return LocalRanks()
    world = int(env["WORLD_SIZE"])
    return LocalRanks(
        world_rank=int(env["RANK"]),
        world_size=world,
        local_rank=int(env.get("LOCAL_RANK", env["RANK"])),
        local_world_size=int(env.get("LOCAL_WORLD_SIZE", world)),
        node_rank=int(env.get("GROUP_RANK", env.get("NODE_RANK", "0"))),
    )


class _BackgroundLoop:
    """A daemon thread calling ``_step`` until closed (and ``_has_more`` is False)."""

    thread_name = "background-loop"

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)

    def _start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set() or self._has_more():
            self._step()

    def _has_more(self) -> bool:
        return False

    def _step(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Stop after what is queued has been handled."""
        self._stop.set()
        self._thread.join()


class _EventDrain(_BackgroundLoop):
    """A background loop handing batches of buffered events to ``_handle``.

    After each batch it pauses ``linger_s`` so that events gather into batches: waking this
    thread for every ``report()`` made it compete with the train loop for the GIL on every
    step (about 2x the cost of a metrics-only ``report()`` in ``benchmarks/bench_local.py``).
    """

    poll_s = 0.1
    linger_s = 0.005

    def __init__(self) -> None:
        super().__init__()
        self.buffer = EventBuffer()

    def put(self, event: Event) -> None:
        """Queue one event (the session's sink)."""
        self.buffer.put(event)

    def _has_more(self) -> bool:
        return len(self.buffer) > 0

    def _step(self) -> None:
        batch = self.buffer.drain(self.poll_s)
        if batch:
            self._handle(batch)
            self._stop.wait(self.linger_s)  # returns at once when closing

    def _handle(self, batch: list[Event]) -> None:
        raise NotImplementedError


class _Consumer(_EventDrain):
    """Applies events to the coordinator in a background thread; keeps the first error."""

    thread_name = "local-controller"

    def __init__(self, controller: BaseController, world_size: int) -> None:
        super().__init__()
        self.coordinator = controller.coordinator
        self.world_size = world_size
        self.error: BaseException | None = None
        self.finished: set[int] = set()
        self._start()

    def health_check(self) -> None:
        if self.error is not None:
            raise self.error

    def _step(self) -> None:
        super()._step()
        if self.error is None:
            try:
                self.coordinator.tick()  # get_all_reported_checkpoints(timeout_s=...)
            except BaseException as exc:  # noqa: BLE001 - re-raised in the train thread
                self.error = exc

    def _handle(self, batch: list[Event]) -> None:
        for event in batch:
            if isinstance(event, WorkerFinishedEvent):
                self.finished.add(event.rank)
            if self.error is not None:
                continue
            try:
                self.coordinator.handle(event)
                if self.coordinator.preempted_and_committed():
                    assert self.coordinator.preemption_notice is not None
                    # raised in the train thread at its next get_preemption_info()
                    self.error = PreemptionStop(self.coordinator.preemption_notice)
            except BaseException as exc:  # noqa: BLE001 - re-raised in the train thread
                self.error = exc

    def wait_all_finished(self, timeout: float | None = None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        while len(self.finished) < self.world_size:
            if self.error is not None and self.world_size == 1:
                break
            if deadline is not None and time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True


class _StoreSender(_EventDrain):
    """Non-zero torchrun ranks: ship event batches to rank 0 through the c10d store."""

    thread_name = "event-sender"
    poll_s = 0.05

    def __init__(self, store: Any, prefix: str, rank: int) -> None:
        super().__init__()
        self.store = store
        self.prefix = prefix
        self.rank = rank
        self.seq = 0
        self._start()

    def _handle(self, batch: list[Event]) -> None:
        self.store.set(f"{self.prefix}/ev/{self.rank}/{self.seq}", pickle.dumps(batch))
        self.seq += 1


class _StoreReceiver(_BackgroundLoop):
    """Rank 0 under torchrun: poll the store for other ranks' event batches."""

    thread_name = "event-receiver"

    def __init__(self, store: Any, prefix: str, world_size: int, consumer: _Consumer) -> None:
        super().__init__()
        self.store = store
        self.prefix = prefix
        self.consumer = consumer
        self.next_seq = dict.fromkeys(range(1, world_size), 0)
        self._start()

    def _step(self) -> None:
        got = False
        for rank, seq in self.next_seq.items():
            key = f"{self.prefix}/ev/{rank}/{seq}"
            if self.store.check([key]):
                for event in pickle.loads(self.store.get(key)):
                    self.consumer.put(event)
                self.store.delete_key(key)
                self.next_seq[rank] = seq + 1
                got = True
        if not got:
            time.sleep(0.005)


class _StoreReplyReceiver(_BackgroundLoop):
    """Non-zero torchrun ranks: answers from rank 0's controller, through the c10d store."""

    thread_name = "reply-receiver"

    def __init__(self, store: Any, prefix: str, rank: int, session: TrainSession) -> None:
        super().__init__()
        self.store = store
        self.prefix = prefix
        self.rank = rank
        self.session = session
        self.next_id = 0
        self._start()

    def _step(self) -> None:
        key = f"{self.prefix}/reply/{self.rank}/{self.next_id}"
        if self.store.check([key]):
            value = pickle.loads(self.store.get(key))
            self.store.delete_key(key)
            self.session.deliver(self.next_id, value)
            self.next_id += 1
        else:
            self._stop.wait(0.01)


class LocalController(BaseController):
    """Runs the train function in this process, as one rank."""

    def result(self, error: BaseException | None = None) -> Any:
        """As :meth:`BaseController.result`, with ``metrics`` as Ray Train 2.60's local mode
        has them: the last ``report()``'s metrics, with or without a checkpoint (with the
        validation metrics of its checkpoint merged over them, when it had one)."""
        result = super().result(error)
        last = self.coordinator.latest_metrics
        if last is not None:
            latest = self.manager.latest
            same = latest is not None and latest.round == self.coordinator.latest_metrics_round
            result.metrics = latest.all_metrics if same and latest is not None else dict(last)
        return result

    def _owns_run_folder(self) -> bool:
        """Under torchrun only rank 0 (which hosts the controller) is the run's driver."""
        return local_ranks().world_rank == 0

    def _run_attempt(self) -> None:
        ranks = local_ranks()
        if ranks.world_size > 1:
            self._run_torchrun_rank(ranks)
            return
        spec = self.spec
        install_sigterm_handler()  # SIGTERM -> get_preemption_info() (main thread only)
        session: TrainSession | None = None

        def reply(_rank: int, request_id: int, value: Any) -> None:
            assert session is not None  # requests come from the train function only
            session.deliver(request_id, value)

        offset = self.coordinator.begin_attempt(1, reply)
        consumer = _Consumer(self, 1)
        context = self._context(ranks)
        spec.backend.on_local_start(context, spec.scaling)
        try:
            latest = self.manager.latest
            session = TrainSession(
                context,
                consumer.put,
                latest.checkpoint if latest else None,
                offset,
                health_check=consumer.health_check,
                default_upload_mode=spec.run.checkpoint_upload_mode,
                driver_epoch=self.epoch,
                validation_fn_set=self.validation_fn_set,
                # One process: every dataset whole, as this rank's one shard.
                dataset_shards=(
                    local_shards(spec.datasets, spec.data_config) if spec.datasets else None
                ),
            )
            self._enter(ControllerState.RUNNING)
            run_train_fn(session, spec.train_fn, spec.train_config)
            consumer.wait_all_finished()
        finally:
            consumer.close()
            self.coordinator.end_attempt()
            spec.backend.on_local_shutdown()
        if consumer.error is not None:
            raise consumer.error
        self.coordinator.finish_attempt()

    def _context(self, ranks: LocalRanks) -> TrainContext:
        assert self.spec.run.name is not None and self.spec.run.storage_path is not None
        return TrainContext(
            ranks.world_rank,
            ranks.world_size,
            ranks.local_rank,
            ranks.local_world_size,
            ranks.node_rank,
            self.spec.run.name,
            self.spec.run.storage_path,
            self.attempt,
            self.spec.run.storage_filesystem,
        )

    # -- torchrun ---------------------------------------------------------------------------
    def _run_torchrun_rank(self, ranks: LocalRanks) -> None:
        spec = self.spec
        if not spec.backend.supports_torchrun:
            raise UserConfigError(
                "WORLD_SIZE>1 in the environment (torchrun?) but this trainer's backend cannot "
                "run as torchrun processes; use TorchTrainer, or unset RANK/WORLD_SIZE"
            )
        context = self._context(ranks)
        spec.backend.on_local_start(context, spec.scaling)
        import torch.distributed as dist

        store = dist.PrefixStore(
            "trainjob",
            dist.distributed_c10d._get_default_store(),
        )
        prefix = f"{spec.run.name}/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
        try:
            if ranks.world_rank == 0:
                self._torchrun_rank0(store, prefix, ranks, context)
            else:
                self._torchrun_other(store, prefix, ranks, context)
        finally:
            spec.backend.on_local_shutdown()

    def _torchrun_rank0(
        self, store: Any, prefix: str, ranks: LocalRanks, context: TrainContext
    ) -> None:
        session: TrainSession | None = None

        def reply(rank: int, request_id: int, value: Any) -> None:
            if rank == 0:
                assert session is not None  # rank 0's requests come from its train function
                session.deliver(request_id, value)
            else:
                store.set(f"{prefix}/reply/{rank}/{request_id}", pickle.dumps(value))

        offset = self.coordinator.begin_attempt(ranks.world_size, reply)
        latest = self.manager.latest
        store.set(
            f"{prefix}/start",
            json.dumps(
                {"offset": offset, "latest": latest.path if latest else None, "epoch": self.epoch}
            ),
        )
        consumer = _Consumer(self, ranks.world_size)
        receiver = _StoreReceiver(store, prefix, ranks.world_size, consumer)
        try:
            session = TrainSession(
                context,
                consumer.put,
                latest.checkpoint if latest else None,
                offset,
                health_check=consumer.health_check,
                default_upload_mode=self.spec.run.checkpoint_upload_mode,
                driver_epoch=self.epoch,
                validation_fn_set=self.validation_fn_set,
            )
            self._enter(ControllerState.RUNNING)
            run_train_fn(session, self.spec.train_fn, self.spec.train_config)
            consumer.wait_all_finished(timeout=None if consumer.error is None else 30.0)
        finally:
            receiver.close()
            consumer.close()
            self.coordinator.end_attempt()
        error = consumer.error
        if error is None:
            try:
                self.coordinator.finish_attempt()
            except UserConfigError as exc:
                error = exc
        store.set(
            f"{prefix}/done",
            json.dumps(
                {
                    "error": None if error is None else str(error),
                    "metrics": self.coordinator.latest_metrics,
                }
            ),
        )
        if error is not None:
            raise TrainingFailedError(
                f"Training failed: {error}", cause=error, result=self.result(error)
            )

    def _torchrun_other(
        self, store: Any, prefix: str, ranks: LocalRanks, context: TrainContext
    ) -> None:
        store.wait([f"{prefix}/start"], timedelta(seconds=600))
        start = json.loads(store.get(f"{prefix}/start"))
        sender = _StoreSender(store, prefix, ranks.world_rank)
        replies: _StoreReplyReceiver | None = None
        try:
            latest = (
                Checkpoint(start["latest"], self.spec.run.storage_filesystem)
                if start["latest"]
                else None
            )
            session = TrainSession(
                context,
                sender.put,
                latest,
                int(start["offset"]),
                default_upload_mode=self.spec.run.checkpoint_upload_mode,
                driver_epoch=int(start.get("epoch", 0)),
                validation_fn_set=self.validation_fn_set,
            )
            replies = _StoreReplyReceiver(store, prefix, ranks.world_rank, session)
            self._enter(ControllerState.RUNNING)
            # Ray's local mode: each process's Result holds its own return value.
            own_value = run_train_fn(session, self.spec.train_fn, self.spec.train_config)
        finally:
            sender.close()
            if replies is not None:
                replies.close()
        store.wait([f"{prefix}/done"], timedelta(seconds=3600))
        done = json.loads(store.get(f"{prefix}/done"))
        self.manager.restore()
        self.coordinator.return_value = own_value
        if done["error"] is not None:
            raise TrainingFailedError(
                f"Training failed on rank 0's controller: {done['error']}", result=self.result()
            )
