"""The code that runs inside each worker process (a Ray actor, or this process)."""

from __future__ import annotations

import importlib
import inspect
import logging
import os
import pickle
import socket
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from trainer_runtime import _session
from trainer_runtime._events import Event, EventBuffer
from trainer_runtime._metrics import TENSOR_RETURN_MESSAGE, contains_tensor
from trainer_runtime._session import TrainSession
from trainer_runtime.checkpoint import Checkpoint
from trainer_runtime.context import TrainContext
from trainer_runtime.data_config import install_data_context
from trainer_runtime.preemption import install_sigterm_handler


def count_required_parameters(fn: Callable[..., Any]) -> int:
    """The positional parameters of ``fn`` without a default (``*args`` counts), as Ray Train
    counts them: ``f(config, epochs=10)`` takes one, ``partial(f, a=0)`` of ``f(config, a)``
    one."""
    params = inspect.signature(fn).parameters.values()
    positional = (
        inspect.Parameter.POSITIONAL_ONLY,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
        inspect.Parameter.VAR_POSITIONAL,
    )
    return sum(1 for p in params if p.default is inspect.Parameter.empty and p.kind in positional)


def check_train_fn_signature(fn: Callable[..., Any]) -> None:
    """Refuse a train function of more than one required argument, with Ray Train's message
    (``fit()`` raises it, as in Ray)."""
    try:
        required = count_required_parameters(fn)
    except (TypeError, ValueError):  # no signature (some builtins): called with the config
        return
    if required > 1:
        raise _too_many_required(required)


def _too_many_required(required: int) -> ValueError:
    return ValueError(
        "train_loop_per_worker should take in 0 or 1 required arguments, but it accepts "
        f"{required} required arguments instead."
    )


def call_train_fn(fn: Callable[..., Any], config: dict[str, Any] | None) -> Any:
    """``fn(config or {})`` when it has one required argument, else ``fn()`` (Ray Train's
    rule: a config given to a function that requires none is not passed)."""
    try:
        required = count_required_parameters(fn)
    except (TypeError, ValueError):
        return fn(config or {})
    if required > 1:
        raise _too_many_required(required)
    if required == 1:
        return fn(config or {})
    return fn()


def run_train_fn(
    session: TrainSession,
    fn: Callable[..., Any],
    config: dict[str, Any] | None,
    *,
    sent: bool = False,
) -> Any:
    """Run the train function under ``session`` and report how it ended; returns what it
    returned (None when it failed).

    A return value holding torch tensors fails the worker with Ray Train's message; rank 0's
    value becomes ``Result.return_value``. ``sent``: the value travels to another process
    (a Ray worker), so rank 0's must pickle.
    """
    _session.set_session(session)
    try:
        session.prestart_uploader()
        value = call_train_fn(fn, config)
        if contains_tensor(value):
            raise ValueError(TENSOR_RETURN_MESSAGE)
        if sent and value is not None and session.context.world_rank == 0:
            try:
                pickle.dumps(value)
            except Exception as exc:
                raise ValueError(
                    f"the train function's return value ({type(value).__name__}) cannot be "
                    f"pickled ({exc}); it must be serializable to reach Result.return_value"
                ) from exc
    except BaseException as exc:  # noqa: BLE001 - every failure goes to the controller
        session.finish(exc, traceback.format_exc())
        return None
    else:
        session.finish(None, return_value=value)
        return value
    finally:
        _session.set_session(None)


logger = logging.getLogger(__name__)


class Preloader:
    """Imports modules in a background thread, so the import overlaps the controller's
    round trips to a starting worker (torch takes about a second).

    Whatever runs code that may import them (backend set-up, the train function) calls
    :meth:`wait` first: two threads importing the same packages at once can deadlock in
    Python's import locks. A failed import is only logged; the caller's own import
    raises it again where it matters.
    """

    def __init__(self, modules: Sequence[str]) -> None:
        self._done = threading.Event()
        if not modules:
            self._done.set()
            return
        threading.Thread(
            target=self._run, args=(tuple(modules),), name="preload", daemon=True
        ).start()

    def _run(self, modules: tuple[str, ...]) -> None:
        try:
            for name in modules:
                try:
                    importlib.import_module(name)
                except Exception as exc:  # noqa: BLE001 - re-raised by the real import
                    logger.debug("preloading %s failed: %s", name, exc)
        finally:
            self._done.set()

    def wait(self) -> None:
        """Return once every module was imported (or failed to)."""
        self._done.wait()


def free_port() -> int:
    """A free TCP port on this host."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        port: int = s.getsockname()[1]
        return port


def process_start_time(pid: int | str = "self") -> float | None:
    """When process ``pid`` started, in epoch seconds to about 10 ms (Linux ``/proc``;
    ``None`` elsewhere)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    boot = time.time() - uptime  # /proc/stat's btime is whole seconds
    # Field 22 (starttime, clock ticks after boot) counts from after the ")" ending comm.
    ticks = int(stat.rsplit(")", 1)[1].split()[19])
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def started_without_job(environ: Mapping[str, str]) -> bool:
    """Whether this Ray worker process was started by its raylet ahead of any job (prestarted):
    Ray sets ``RAY_JOB_ID`` in a new worker process's environment to the job it starts it for,
    the nil id (``JobID.nil()``) for prestarted ones, and does not change it when it hands the
    process a job."""
    from ray import JobID

    return environ.get("RAY_JOB_ID") == JobID.nil().hex()


class TrainWorker:
    """One training worker. Wrapped with ``ray.remote`` (a threaded actor) by the worker group.

    ``start`` runs the train function in a thread; the controller long-polls
    ``poll`` for events, which also tells it at once when the process dies.
    ``preload``: modules to import in the background from now on (see :class:`Preloader`);
    ``execute`` and ``start`` wait for them.
    """

    def __init__(self, preload: Sequence[str] = ()) -> None:
        # SIGTERM to this process becomes a preemption notice (get_preemption_info()).
        install_sigterm_handler()
        self._preloader = Preloader(preload)
        self._events = EventBuffer()
        self._thread: threading.Thread | None = None
        self._session: TrainSession | None = None

    def node_info(self) -> dict[str, Any]:
        """Where this worker runs, and how its process started: ``process_started`` (epoch
        seconds) and ``raylet_prestarted`` (the raylet started the process ahead of any job,
        ``RAY_enable_worker_prestart``: Ray gives such a process the nil job id, and one it
        starts for a job's request that job's)."""
        import ray

        ctx = ray.get_runtime_context()
        return {
            "node_id": ctx.get_node_id(),
            "ip": ray.util.get_node_ip_address(),
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
            "accelerator_ids": ctx.get_accelerator_ids(),
            "process_started": process_start_time(),
            "raylet_prestarted": started_without_job(os.environ),
        }

    def set_env(self, env: dict[str, str]) -> None:
        """Set environment variables in the worker process."""
        os.environ.update(env)

    def address_and_port(self) -> tuple[str, int]:
        """This node's IP and a free port (rank 0 hosts the rendezvous)."""
        import ray

        return ray.util.get_node_ip_address(), free_port()

    def execute(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run ``fn`` in the worker process (used by backends for set-up)."""
        self._preloader.wait()
        return fn(*args, **kwargs)

    def start(
        self,
        fn: Callable[..., Any],
        config: dict[str, Any] | None,
        context: TrainContext,
        latest_checkpoint: str | None,
        round_offset: int,
        default_upload_mode: str | None = None,
        driver_epoch: int = 0,
        validation_fn_set: bool = False,
        claim_uploads: bool = False,
        dataset_shards: dict[str, Any] | None = None,
        data_context: Any = None,
    ) -> None:
        """Start the train function in a thread and return (``claim_uploads``: see
        ``TrainSession``; ``dataset_shards``: this rank's Ray Data iterators by dataset name,
        for ``get_dataset_shard``; ``data_context``: the driver's ``ray.data.DataContext``,
        made current here)."""
        self._preloader.wait()
        if data_context is not None:
            install_data_context(data_context)
        session = TrainSession(
            context,
            self._events.put,
            (
                Checkpoint(latest_checkpoint, context.storage_filesystem)
                if latest_checkpoint
                else None
            ),
            round_offset,
            default_upload_mode=default_upload_mode,
            driver_epoch=driver_epoch,
            validation_fn_set=validation_fn_set,
            claim_uploads=claim_uploads,
            dataset_shards=dataset_shards,
        )
        self._session = session
        self._thread = threading.Thread(
            target=run_train_fn,
            args=(session, fn, config),
            kwargs={"sent": True},
            name="train-fn",
            daemon=True,
        )
        self._thread.start()

    def deliver(self, request_id: int, value: Any) -> None:
        """The controller's answer to one of this worker's requests (see ``RequestEvent``)."""
        if self._session is not None:
            self._session.deliver(request_id, value)

    def poll(self, timeout: float) -> list[Event]:
        """Events since the last poll, waiting up to ``timeout`` seconds for one."""
        return self._events.drain(timeout)
