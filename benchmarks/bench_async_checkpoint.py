"""Large checkpoints during training: time blocked in ``report()``, goodput, upload throughput.

One worker runs a fixed amount of compute per step (a torch matmul loop; the number of
matmuls is calibrated once in the driver to ``--step-s`` seconds with ``--torch-threads``
threads, then every fit does that same work) and every ``--every`` steps
writes a checkpoint of ``--size-mib`` (one random binary file plus a small JSON file) to a
fresh local folder and reports it. Each ``fit()`` runs three phases back to back:

1. ``baseline``: the same steps without checkpoints (the noise floor of the goodput figure);
2. ``sync``: ``--checkpoints`` checkpoints with ``CheckpointUploadMode.SYNC``;
3. ``async``: ``--checkpoints`` checkpoints with ``CheckpointUploadMode.ASYNC``.

Every checkpoint is followed by a full interval of compute, so an ASYNC upload overlaps
training the way it would in a long run. The loop is the same for ``trainer_runtime`` and
``ray.train`` (Ray Train V2, which has ``CheckpointUploadMode.SYNC`` and ``ASYNC``), each with
local storage and with fake-gcs-server (``gs://`` for ours; a ``pyarrow.fs.GcsFileSystem``
pointed at the emulator for Ray Train, which is how Ray Train writes to GCS).

Per phase:

* ``report_ms`` p50/max: time inside ``report()`` for the calls that carried a checkpoint;
* ``goodput``: time spent computing / phase wall time; ``goodput_excl_write`` leaves out the
  time the loop spent writing its checkpoint files (the user's own I/O, the same under both
  frameworks), i.e. it charges only what the runtime costs;
* ``work_goodput``: steps x (seconds per step in the baseline phase) / phase wall time, which
  also charges compute slowed down by uploads competing for the CPU;
* ``upload_mib_s``: bytes / seconds inside the framework's upload function (instrumented in
  the worker: ``Storage.upload_dir`` for ours, ``TrainContext._upload_checkpoint`` for Ray
  Train), so ASYNC uploads are timed too;
* ``compute_slowdown``: compute time / (steps x baseline seconds per step).
* ``work_goodput_in_phase``: steps x (median seconds of the phase's own steps that overlapped
  no upload) / phase wall time: the same as ``work_goodput`` without the drift of the shared
  machine between the baseline phase and this one.

Raw bounds, measured in the driver with the same file size: ``shutil.copyfile`` between two
local folders, ``google-cloud-storage`` ``Blob.upload_from_filename`` to the emulator
(defaults, of a freshly written file and of one long on disk; and with 32 MiB chunks),
``pyarrow.fs.copy_files`` to the emulator (64 MiB chunks, as Ray Train), and trainer_runtime's
own ``LocalStorage``/``GCSStorage.upload_dir``. The bounds and our ``upload_dir`` each start
after ``--raw-gap-s`` idle seconds, as a run's uploads start after a checkpoint interval of
compute: on a VM that hands freed memory back to its host, that decides whether the page cache
fills at memory speed or pays a host page fault per page (``memory_touch_*`` show it alone).

Usage::

    python benchmarks/bench_async_checkpoint.py [--quick] [--size-mib 256 | --large]
        [--step-s 0.5] [--every 10] [--checkpoints 2] [--storage local,gcs]
        [--frameworks ours,ray_train]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import common
from trainer_runtime.storage.local import _fsync_path as _fsync  # the same fsync(2) as ours

NAME = "async_checkpoint"


def result_name(size_mib: int) -> str:
    """``async_checkpoint`` for 256 MiB, ``async_checkpoint_1gib`` for 1024, else ``..._<n>mib``."""
    if size_mib == 256:
        return NAME
    return f"{NAME}_1gib" if size_mib == 1024 else f"{NAME}_{size_mib}mib"


MiB = common.MiB


# -- the worker side --------------------------------------------------------------------------
def _dir_bytes(path: str) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


def _log_upload(log_path: Path, phase: str, nbytes: int, seconds: float, started: float) -> None:
    """Append one JSON line for a finished upload to ``log_path``."""
    line = {"bytes": nbytes, "seconds": seconds, "started": started, "phase": phase}
    with open(log_path, "a") as fh:
        fh.write(json.dumps(line) + "\n")


def _instrument_uploads(framework: str, log_path: Path, phase: dict[str, str]) -> None:
    """Append one JSON line per finished upload (bytes, seconds, phase) to ``log_path``."""

    def log(nbytes: int, seconds: float, started: float) -> None:
        _log_upload(log_path, phase["name"], nbytes, seconds, started)

    if framework == "ours":
        from trainer_runtime._session import get_session

        storage = get_session("bench").storage
        original = storage.upload_dir

        def upload_dir(local_dir: Any, dest_uri: str, **kwargs: Any) -> Any:
            started = time.time()
            stats = original(local_dir, dest_uri, **kwargs)
            log(stats.bytes, stats.seconds, started)
            return stats

        storage.upload_dir = upload_dir  # type: ignore[method-assign]
        return

    from ray.train.v2._internal.execution import context as ray_context

    cls = ray_context.TrainContext
    original_upload = cls._upload_checkpoint
    if getattr(original_upload, "_bench_wrapped", False):
        return

    def _upload_checkpoint(
        self: Any, checkpoint_dir_name: str, metrics: Any, checkpoint: Any = None, *a: Any, **k: Any
    ) -> Any:
        if checkpoint is None:
            return original_upload(self, checkpoint_dir_name, metrics, checkpoint, *a, **k)
        nbytes = _dir_bytes(checkpoint.path)
        started = time.time()
        t0 = time.perf_counter()
        out = original_upload(self, checkpoint_dir_name, metrics, checkpoint, *a, **k)
        log(nbytes, time.perf_counter() - t0, started)
        return out

    _upload_checkpoint._bench_wrapped = True  # type: ignore[attr-defined]
    cls._upload_checkpoint = _upload_checkpoint  # type: ignore[method-assign]


class PlainTransfer:
    """The in-run raw bound: the library alone stores a checkpoint folder, synchronously.

    ``shutil.copyfile`` into a folder under ``target`` and ``fsync`` of every copy, its
    folder and that folder's parent (local: the durability trainer_runtime's commit gives,
    so that the bound stores as safely as what it bounds), or google-cloud-storage
    ``Blob.upload_from_filename`` with its defaults (``gs://``, the emulator named by
    ``STORAGE_EMULATOR_HOST``); the 2 newest copies are kept, as ``num_to_keep=2`` does.
    """

    def __init__(self, target: str) -> None:
        self.target = target.rstrip("/")
        self.kept: list[str] = []
        self.bucket: Any = None
        if self.target.startswith("gs://"):
            from google.auth.credentials import AnonymousCredentials
            from google.cloud import storage

            client = storage.Client(project="bench", credentials=AnonymousCredentials())
            name, _, self.prefix = self.target[len("gs://") :].partition("/")
            self.bucket = client.bucket(name)

    def store(self, folder: Path, index: int) -> int:
        """Store every file of ``folder`` as checkpoint ``index``; the bytes stored."""
        files = sorted(p for p in folder.rglob("*") if p.is_file())
        if self.bucket is None:
            dest = Path(self.target) / f"raw_{index:06d}"
            for f in files:
                target = dest / f.relative_to(folder)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(f, target)
                _fsync(target)
            for name in {dest / f.relative_to(folder).parent for f in files} | {dest.parent}:
                _fsync(name)
            self.kept.append(str(dest))
        else:
            dest_prefix = f"{self.prefix}/raw_{index:06d}"
            for f in files:
                blob = self.bucket.blob(f"{dest_prefix}/{f.relative_to(folder).as_posix()}")
                blob.upload_from_filename(str(f))
            self.kept.append(dest_prefix)
        return sum(f.stat().st_size for f in files)

    def prune(self) -> None:
        """Delete all but the 2 newest copies (untimed, like the frameworks' own pruning)."""
        while len(self.kept) > 2:
            old = self.kept.pop(0)
            if self.bucket is None:
                shutil.rmtree(old, ignore_errors=True)
            else:
                for blob in list(self.bucket.list_blobs(prefix=f"{old}/")):
                    blob.delete()


def checkpoint_loop(config: dict[str, Any]) -> None:
    """The measured train function (one worker; either framework)."""
    import torch

    framework = config["framework"]
    if framework == "ours":
        import trainer_runtime as api
        from trainer_runtime import CheckpointUploadMode
    else:
        import ray.train as api  # type: ignore[no-redef]
        from ray.train import CheckpointUploadMode  # type: ignore[assignment]

    torch.set_num_threads(config["torch_threads"])
    rank = api.get_context().get_world_rank()
    out_dir = Path(config["out_dir"])
    upload_log = out_dir / f"uploads_{rank}.jsonl"
    phase = {"name": "setup"}
    _instrument_uploads(framework, upload_log, phase)

    a = torch.randn(config["matmul_n"], config["matmul_n"])

    def work(iters: int) -> None:
        for _ in range(iters):
            torch.mm(a, a)

    iters = config["iters_per_step"]  # the same work per step in every fit (see calibrate())
    work(20)  # warm-up

    payload = torch.randint(0, 256, (config["size_bytes"],), dtype=torch.uint8).numpy()
    tmp_root = Path(config["local_tmp"])
    modes = {"sync": CheckpointUploadMode.SYNC, "async": CheckpointUploadMode.ASYNC}
    plain = PlainTransfer(config["raw_target"]) if config.get("raw_target") else None
    phases: list[dict[str, Any]] = []
    step = 0
    for name, n_ckpt in config["phases"]:
        phase["name"] = name
        every = config["every"]
        steps = config["baseline_steps"] if name == "baseline" else n_ckpt * every
        compute_s = write_s = cleanup_s = 0.0
        report_s: list[float] = []
        report_cpu_s: list[float] = []  # CPU time of this thread inside report()
        step_times: list[list[float]] = []  # [wall-clock start, seconds] of every step
        started_at = time.time()
        p_start = time.perf_counter()
        for i in range(steps):
            t_step = time.time()
            c0 = time.perf_counter()
            work(iters)
            seconds_step = time.perf_counter() - c0
            compute_s += seconds_step
            step_times.append([round(t_step, 6), round(seconds_step, 6)])
            step += 1
            if name == "baseline" or i % every != 0:
                continue
            w0 = time.perf_counter()
            folder = Path(tempfile.mkdtemp(prefix=f"ckpt-{rank}-", dir=tmp_root))
            with open(folder / "weights.bin", "wb") as fh:
                fh.write(payload.data)
            (folder / "meta.json").write_text(json.dumps({"step": step}))
            write_s += time.perf_counter() - w0
            if name == "raw":  # the library alone, blocking the loop like SYNC
                assert plain is not None
                started, r0, c0 = time.time(), time.perf_counter(), time.thread_time()
                nbytes = plain.store(folder, step)
                seconds = time.perf_counter() - r0
                report_s.append(seconds)
                report_cpu_s.append(time.thread_time() - c0)
                _log_upload(upload_log, name, nbytes, seconds, started)
                d0 = time.perf_counter()
                shutil.rmtree(folder, ignore_errors=True)
                plain.prune()
                cleanup_s += time.perf_counter() - d0
                continue
            r0, c0 = time.perf_counter(), time.thread_time()
            api.report(
                {"step": step, "phase": name},
                checkpoint=api.Checkpoint.from_directory(str(folder)),
                checkpoint_upload_mode=modes[name],
            )
            report_s.append(time.perf_counter() - r0)
            report_cpu_s.append(time.thread_time() - c0)
            if name == "sync":  # SYNC keeps the local folder by default; drop it (timed)
                d0 = time.perf_counter()
                shutil.rmtree(folder, ignore_errors=True)
                cleanup_s += time.perf_counter() - d0
        wall = time.perf_counter() - p_start
        phases.append(
            {
                "phase": name,
                "steps": steps,
                "checkpoints": len(report_s),
                "started_at": started_at,
                "ended_at": time.time(),
                "wall_s": wall,
                "compute_s": compute_s,
                "write_s": write_s + cleanup_s,
                "report_s": report_s,
                "report_cpu_s": report_cpu_s,
                "step_times": step_times,
            }
        )
    out = {
        "rank": rank,
        "iters_per_step": iters,
        "phases": phases,
        "loop_end": time.time(),
    }
    (out_dir / f"rank_{rank}.json").write_text(json.dumps(out))


# -- the driver side --------------------------------------------------------------------------
def calibrate(step_s: float, matmul_n: int, threads: int, seconds: float) -> dict[str, Any]:
    """Matmuls per ``step_s`` in this process (see :func:`common.calibrate_matmuls`)."""
    return common.calibrate_matmuls(step_s, matmul_n, threads, seconds)


def _trainer(
    framework: str,
    storage: str,
    config: dict[str, Any],
    workers: int,
    emulator: common.Emulator | None,
) -> tuple[Any, str]:
    """The trainer and a description of where it stores checkpoints."""
    name = f"ckpt-{framework}-{int(time.time() * 1000)}"
    if framework == "ours":
        from trainer_runtime import CheckpointConfig, RunConfig, ScalingConfig
        from trainer_runtime.torch import TorchTrainer

        return (
            TorchTrainer(
                checkpoint_loop,
                train_loop_config=config,
                scaling_config=ScalingConfig(num_workers=workers),
                run_config=RunConfig(
                    name=name,
                    storage_path=storage,
                    checkpoint_config=CheckpointConfig(num_to_keep=2),
                ),
            ),
            storage,
        )
    import ray.train
    import ray.train.torch

    kwargs: dict[str, Any] = {"storage_path": storage}
    if storage.startswith("gs://"):
        assert emulator is not None
        kwargs = {
            "storage_path": storage[len("gs://") :],
            "storage_filesystem": emulator.pyarrow_fs(),
        }
    return (
        ray.train.torch.TorchTrainer(
            checkpoint_loop,
            train_loop_config=config,
            scaling_config=ray.train.ScalingConfig(num_workers=workers),
            run_config=ray.train.RunConfig(
                name=name, checkpoint_config=ray.train.CheckpointConfig(num_to_keep=2), **kwargs
            ),
        ),
        storage,
    )


#: Fewest steps free of uploads that make an in-phase reference (see :func:`quiet_step_s`).
MIN_QUIET_STEPS = 5


def quiet_step_s(
    step_times: list[list[float]] | None, uploads: list[dict[str, Any]]
) -> float | None:
    """Median seconds of the steps that overlapped no upload (of any phase), or None when
    fewer than :data:`MIN_QUIET_STEPS` did: the phase's own speed with nothing competing,
    taken in the same minutes as its other steps (the baseline phase, minutes earlier,
    drifts with the shared machine)."""
    if not step_times:
        return None
    busy = [(u["started"], u["started"] + u["seconds"]) for u in uploads]
    quiet = [
        seconds
        for start, seconds in step_times
        if not any(start < end and start + seconds > begin for begin, end in busy)
    ]
    return common.median(quiet) if len(quiet) >= MIN_QUIET_STEPS else None


def _summarize_phase(
    ph: dict[str, Any], uploads: list[dict[str, Any]], ref_step_s: float
) -> dict[str, Any]:
    """Figures of one phase; ``ref_step_s``: seconds per step of compute with nothing else on."""
    ups = [u for u in uploads if u["phase"] == ph["phase"]]
    quiet_s = quiet_step_s(ph.get("step_times"), uploads)
    up_bytes = sum(u["bytes"] for u in ups)
    up_s = sum(u["seconds"] for u in ups)
    report_ms = [s * 1e3 for s in ph["report_s"]]
    wall = ph["wall_s"]
    compute = ph["compute_s"]
    ref_compute = ph["steps"] * ref_step_s
    n_ckpt = ph["checkpoints"]
    return {
        "phase": ph["phase"],
        "steps": ph["steps"],
        "checkpoints": n_ckpt,
        "wall_s": wall,
        "compute_s": compute,
        "ref_compute_s": ref_compute,
        "write_s": ph["write_s"],
        "report_total_s": sum(ph["report_s"]),
        # CPU the calling thread used inside report(): the rest of the wall time it waited
        # (for a core on the shared machine, the GIL, an upload slot, or the upload itself).
        "report_cpu_ms_p50": (
            common.median([c * 1e3 for c in ph["report_cpu_s"]]) if ph.get("report_cpu_s") else None
        ),
        "report_ms_p50": common.median(report_ms) if report_ms else None,
        "report_ms_max": max(report_ms) if report_ms else None,
        "report_ms": report_ms,
        # Share of wall time spent computing (checkpoint writes and report() count against).
        "goodput": compute / wall,
        # The same without the loop's own checkpoint-file writes (what the runtime costs).
        "goodput_excl_write": compute / max(wall - ph["write_s"], 1e-9),
        # Work done vs the baseline phase's speed: also counts CPU stolen by uploads.
        "work_goodput": ref_compute / wall,
        "compute_slowdown": compute / ref_compute,
        # The same against this phase's own steps that overlapped no upload.
        "quiet_step_s": quiet_s,
        "work_goodput_in_phase": ph["steps"] * quiet_s / wall if quiet_s else None,
        # Seconds per checkpoint not spent computing, with and without the file writes.
        "overhead_per_ckpt_s": (wall - compute) / n_ckpt if n_ckpt else None,
        "runtime_overhead_per_ckpt_s": (
            (wall - compute - ph["write_s"]) / n_ckpt if n_ckpt else None
        ),
        "uploads": len(ups),
        "upload_mib_s": (up_bytes / MiB / up_s) if up_s > 0 else None,
        "upload_s": [u["seconds"] for u in ups],
    }


def run_fit(
    framework: str,
    storage_kind: str,
    args: argparse.Namespace,
    emulator: common.Emulator | None,
    iters_per_step: int,
) -> dict[str, Any]:
    """One ``fit()``: baseline, sync and async phases under ``framework`` on ``storage_kind``."""
    out_dir = common.scratch_dir("ckpt-out")
    local_tmp = common.scratch_dir("ckpt-local")
    storage_dir = common.scratch_dir("ckpt-storage")
    bucket = None
    if storage_kind == "gcs":
        assert emulator is not None
        bucket = emulator.new_bucket("ckpt")
        storage = f"gs://{bucket}/runs"
    else:
        storage = str(storage_dir)
    phases = [("baseline", 0)] if args.baseline_steps > 0 else []
    phases += [("sync", args.checkpoints)]
    raw_target = None
    if framework == "ours":  # the in-run raw bound, once per storage, between the two modes
        phases += [("raw", args.checkpoints)]
        raw_target = f"{storage}/plain"
    phases += [("async", args.checkpoints)]
    config = {
        "framework": framework,
        "out_dir": str(out_dir),
        "local_tmp": str(local_tmp),
        "size_bytes": args.size_mib * MiB,
        "step_s": args.step_s,
        "every": args.every,
        "phases": phases,
        "baseline_steps": args.baseline_steps,
        "matmul_n": args.matmul_n,
        "torch_threads": args.torch_threads,
        "iters_per_step": iters_per_step,
        "raw_target": raw_target,
    }
    emu_cpu0 = common.process_cpu_seconds(emulator.pid) if emulator else None
    try:
        trainer, where = _trainer(framework, storage, config, args.workers, emulator)
        fit_start = time.time()
        trainer.fit()
        fit_end = time.time()
        rank0 = json.loads((out_dir / "rank_0.json").read_text())
        log = out_dir / "uploads_0.jsonl"
        lines = log.read_text().splitlines() if log.exists() else []
        uploads = [json.loads(line) for line in lines]
    finally:
        common.rmtree(out_dir)
        common.rmtree(local_tmp)
        common.rmtree(storage_dir)
        if bucket and emulator:
            emulator.delete_bucket(bucket)
    emu_cpu1 = common.process_cpu_seconds(emulator.pid) if emulator else None
    base = [ph for ph in rank0["phases"] if ph["phase"] == "baseline"]
    if base:
        ref_step_s, source = base[0]["compute_s"] / base[0]["steps"], "baseline phase"
    else:
        ref_step_s, source = args.step_s, "driver calibration"
    return {
        "framework": framework,
        "storage": storage_kind,
        "storage_uri": where,
        "fit_s": fit_end - fit_start,
        # fit() returned this long after the loop ended (the last ASYNC upload, tear-down).
        "after_loop_s": fit_end - rank0["loop_end"],
        "emulator_cpu_s": (
            emu_cpu1 - emu_cpu0
            if storage_kind == "gcs" and emu_cpu0 is not None and emu_cpu1 is not None
            else None
        ),
        "ref_step_s": ref_step_s,
        "ref_step_source": source,
        "phases": [_summarize_phase(ph, uploads, ref_step_s) for ph in rank0["phases"]],
    }


def raw_bounds(args: argparse.Namespace, emulator: common.Emulator | None) -> dict[str, Any]:
    """Plain file copies and plain uploads of one file of the checkpoint's size.

    Like the runs do it: the machine first idles ``--raw-gap-s`` seconds (a run computes
    for a checkpoint interval between two checkpoints), then a fresh file of random bytes is
    written (untimed; the train loop writing its checkpoint), then it is copied into a
    destination folder that stays (timed), the source is deleted and the 2 newest destinations
    are kept (``num_to_keep=2``). The idle gap matters on a VM that hands freed memory back to
    its host (virtio-balloon free page reporting): memory freed a few seconds earlier must be
    faulted in again on the host when the next file lands in the page cache, which costs far
    more CPU than the copy itself. ``memory_touch_after_idle`` and ``memory_touch_back_to_back``
    show that cost on its own (filling a new numpy array of the checkpoint's size).
    ``local_copyfile_back_to_back`` is the same copy without the gap (the bound measured
    before), ``local_copyfile_unlinked`` the oldest figure: one file copied again and again,
    each copy deleted at once.

    GCS the same way: ``gcs_plain_fresh`` (the bound) and ``ours_gcs_upload_dir`` upload a file
    written just before (untimed), after the idle gap, as a checkpoint is; the other GCS cases
    run back to back, for reference: ``gcs_plain`` uploads one file that has long been on disk.
    """
    import numpy as np

    src_dir = common.scratch_dir("raw-src")
    dst_dir = common.scratch_dir("raw-dst")
    size = args.size_mib * MiB
    src = src_dir / "weights.bin"
    rng = np.random.default_rng(0)
    payload = rng.integers(0, 256, size, dtype=np.uint8)
    with open(src, "wb") as fh:
        fh.write(payload.data)
    out: dict[str, Any] = {
        "size_mib": args.size_mib,
        "repeats": args.raw_repeats,
        "idle_gap_s": args.raw_gap_s,
    }

    def write_payload(folder: Path) -> None:
        """Write the checkpoint file into a new ``folder``, as the train loop does (untimed)."""
        folder.mkdir()
        with open(folder / "weights.bin", "wb") as fh:
            fh.write(payload.data)

    def measure(cases: list[tuple[Any, ...]], repeats: int, after_idle: set[str]) -> None:
        """Run the cases round-robin ``repeats`` times (drift hits all alike); keep medians.

        A case is ``(label, fn[, prepare[, cleanup]])``: ``prepare(i)`` runs untimed, then
        ``fn(i)`` is timed, then ``cleanup(i)`` runs untimed (either may be None). Cases named
        in ``after_idle`` first sleep ``--raw-gap-s`` seconds, as a run computes between two
        checkpoints. Besides the wall time, each case's CPU seconds are kept: this process's
        (``client_cpu_s``, every thread) and the emulator's (``server_cpu_s``).
        """
        times: dict[str, list[float]] = {c[0]: [] for c in cases}
        cpu: dict[str, list[float]] = {c[0]: [] for c in cases}
        server_cpu: dict[str, list[float]] = {c[0]: [] for c in cases}
        server_pid = emulator.pid if emulator is not None else None
        for i in range(repeats):
            for case in cases:
                label, fn = case[0], case[1]
                prepare = case[2] if len(case) > 2 else None
                cleanup = case[3] if len(case) > 3 else None
                if label in after_idle:
                    time.sleep(args.raw_gap_s)
                if prepare is not None:
                    prepare(i)
                c0, s0 = time.process_time(), common.process_cpu_seconds(server_pid)
                t0 = time.perf_counter()
                fn(i)
                times[label].append(time.perf_counter() - t0)
                cpu[label].append(time.process_time() - c0)
                s1 = common.process_cpu_seconds(server_pid)
                if s0 is not None and s1 is not None:
                    server_cpu[label].append(s1 - s0)
                if cleanup is not None:
                    cleanup(i)
        for label, secs in times.items():
            med = common.median(secs)
            out[label] = {
                "seconds": secs,
                "mib_s": args.size_mib / med,
                "after_idle_s": args.raw_gap_s if label in after_idle else 0.0,
                "client_cpu_s": cpu[label],
                "server_cpu_s": server_cpu[label],
            }
            server = (
                f", emulator CPU {common.median(server_cpu[label]):.2f} s"
                if server_cpu[label] and label.startswith(("gcs", "ours_gcs"))
                else ""
            )
            print(
                f"  raw {label}: {args.size_mib / med:,.1f} MiB/s (median of {repeats}), "
                f"this process's CPU {common.median(cpu[label]):.2f} s{server}"
            )

    def touch_memory(i: int) -> None:
        np.ones(size, dtype=np.uint8)  # allocated, filled and freed at once

    try:
        touch_memory(-1)
        measure(
            [
                ("memory_touch_after_idle", touch_memory),
                ("memory_touch_back_to_back", touch_memory),
            ],
            args.raw_repeats,
            after_idle={"memory_touch_after_idle"},
        )
        if "local" in args.storage:
            from trainer_runtime.storage.local import LocalStorage

            kept: list[Path] = []

            def fresh_source(i: int) -> None:
                write_payload(src_dir / f"fresh_{len(kept)}_{i}")

            def keep(target: Path, source: Path) -> None:
                common.rmtree(source)  # ASYNC deletes the local folder after the upload
                kept.append(target)
                while len(kept) > 2:  # num_to_keep=2
                    common.rmtree(kept.pop(0))

            def latest_source() -> Path:
                return max(src_dir.glob("fresh_*"), key=lambda p: p.stat().st_mtime_ns)

            def copy_kept(i: int, prefix: str = "copy") -> None:
                source = latest_source()
                target = dst_dir / f"{prefix}_{i}"
                target.mkdir()
                shutil.copyfile(source / "weights.bin", target / "weights.bin")
                keep(target, source)

            def copy_kept_fsync(i: int) -> None:
                source = latest_source()
                target = dst_dir / f"fsync_{i}"
                target.mkdir()
                shutil.copyfile(source / "weights.bin", target / "weights.bin")
                for path in (target / "weights.bin", target, dst_dir):
                    _fsync(path)
                keep(target, source)

            def copy_kept_back_to_back(i: int) -> None:
                copy_kept(i, prefix="b2b")

            def ours_local(i: int) -> None:
                source = latest_source()
                target = dst_dir / f"ours_{i}"
                LocalStorage().upload_dir(source, str(target))
                keep(target, source)

            def ours_local_consumed(i: int) -> None:
                source = latest_source()
                target = dst_dir / f"ours_consumed_{i}"
                # ASYNC's default: the source is deleted afterwards, so its file is linked
                LocalStorage().upload_dir(source, str(target), consume_source=True)
                keep(target, source)

            def copy_unlinked(i: int) -> None:
                target = dst_dir / f"unlinked_{i}.bin"
                shutil.copyfile(src, target)
                target.unlink()

            copy_unlinked(-1)  # warm-up
            measure(
                [
                    ("local_copyfile", copy_kept, fresh_source),
                    ("local_copyfile_fsync", copy_kept_fsync, fresh_source),
                    ("ours_local_upload_dir", ours_local, fresh_source),
                    ("ours_local_upload_dir_consumed", ours_local_consumed, fresh_source),
                    ("local_copyfile_back_to_back", copy_kept_back_to_back, fresh_source),
                    ("local_copyfile_unlinked", copy_unlinked),
                ],
                args.raw_repeats,
                after_idle={
                    "local_copyfile",
                    "local_copyfile_fsync",
                    "ours_local_upload_dir",
                    "ours_local_upload_dir_consumed",
                },
            )
        if "gcs" in args.storage and emulator is not None:
            client = emulator.client()
            bucket_name = emulator.new_bucket("raw")
            bucket = client.bucket(bucket_name)

            def plain(i: int) -> None:
                bucket.blob(f"plain/{i}/weights.bin").upload_from_filename(str(src))

            def chunked(i: int) -> None:
                blob = bucket.blob(f"chunked/{i}/weights.bin")
                blob.chunk_size = 32 * MiB
                blob.upload_from_filename(str(src), checksum="crc32c")

            def via_pyarrow(i: int) -> None:
                import pyarrow.fs as pafs

                pafs.copy_files(
                    str(src_dir),
                    f"{bucket_name}/pyarrow/{i}",
                    destination_filesystem=emulator.pyarrow_fs(),
                    chunk_size=64 * MiB,  # what Ray Train passes
                )

            fresh_root = common.scratch_dir("raw-fresh")

            def write_fresh(i: int) -> None:
                # Written just before it is uploaded, as the train loop writes its checkpoint.
                write_payload(fresh_root / f"fresh_{i}")

            def plain_fresh(i: int) -> None:
                blob = bucket.blob(f"plain_fresh/{i}/weights.bin")
                blob.upload_from_filename(str(fresh_root / f"fresh_{i}" / "weights.bin"))

            def ours_gcs(i: int) -> None:
                from trainer_runtime.storage.gcs import GCSStorage

                GCSStorage().upload_dir(fresh_root / f"fresh_{i}", f"gs://{bucket_name}/ours/{i}")

            def delete_all(i: int) -> None:
                # The emulator keeps objects in memory: drop each upload once timed (a few
                # 1 GiB objects plus the garbage of chunked uploads exhaust the machine's RAM).
                for blob in list(bucket.list_blobs()):
                    blob.delete()

            def delete_all_and_fresh(i: int) -> None:
                delete_all(i)
                common.rmtree(fresh_root / f"fresh_{i}")

            try:
                plain(-1)  # warm-up (connection, server allocation)
                delete_all(-1)
                cases: list[tuple[Any, ...]] = [
                    ("gcs_plain_fresh", plain_fresh, write_fresh, delete_all_and_fresh),
                    ("ours_gcs_upload_dir", ours_gcs, write_fresh, delete_all_and_fresh),
                    ("gcs_plain", plain, None, delete_all),
                    ("gcs_chunked_32mib", chunked, None, delete_all),
                ]
                if "ray_train" in args.frameworks:
                    cases.append(("gcs_pyarrow_copy_files", via_pyarrow, None, delete_all))
                measure(
                    cases,
                    args.raw_repeats,
                    after_idle={"gcs_plain_fresh", "ours_gcs_upload_dir"},
                )
            finally:
                emulator.delete_bucket(bucket_name)
                common.rmtree(fresh_root)
    finally:
        common.rmtree(src_dir)
        common.rmtree(dst_dir)
    return out


def emulator_cpu_set(spec: str) -> set[int] | None:
    """The CPUs to pin fake-gcs-server to (None: not pinned).

    Against real GCS the server's CPU is not on the training node; on this machine the
    emulator hashes and copies every byte and would take CPU from the training loop of
    whichever framework is uploading. Pinned to one CPU, it leaves the others to the loop and
    the uploading process, for both frameworks alike.
    """
    allowed = sorted(os.sched_getaffinity(0))
    if spec == "all":
        return None
    if spec == "last":
        return {allowed[-1]} if len(allowed) >= 2 else None
    cpus = {int(c) for c in spec.split(",") if c.strip()}
    if not cpus or not cpus <= set(allowed):
        raise SystemExit(f"--emulator-cpus {spec!r}: pick CPUs among {allowed}")
    return cpus


def warm_up_emulator(emulator: common.Emulator, size: int) -> None:
    """One untimed upload of ``size`` bytes to a fresh emulator, then deleted.

    A just-started fake-gcs-server is slower on its first large upload (its heap grows); without
    this the first SYNC checkpoint of a fit would pay for it.
    """
    import io

    bucket_name = emulator.new_bucket("warm")
    try:
        blob = emulator.client().bucket(bucket_name).blob("warm.bin")
        blob.upload_from_file(io.BytesIO(bytes(size)), size=size)
    finally:
        emulator.delete_bucket(bucket_name)


def _phase_line(ph: dict[str, Any]) -> str:
    def ms(v: float | None) -> str:
        return "n/a" if v is None else f"{v:.2f} ms"

    up = ph["upload_mib_s"]
    return (
        f"{ph['phase']:8s} goodput {ph['goodput']:.4f} (excl. write "
        f"{ph['goodput_excl_write']:.4f})  report p50 {ms(ph['report_ms_p50'])} "
        f"max {ms(ph['report_ms_max'])}  upload {'n/a' if up is None else f'{up:.1f} MiB/s'}"
    )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a 4 s checkpoint interval")
    parser.add_argument("--size-mib", type=int, default=256, help="checkpoint size (256)")
    parser.add_argument(
        "--large",
        action="store_true",
        help="1 GiB checkpoints, every 60 steps (30 s); results in async_checkpoint_1gib.json",
    )
    parser.add_argument("--step-s", type=float, default=0.5, help="compute per step (0.5 s)")
    parser.add_argument("--every", type=int, help="steps between checkpoints (10; 8 --quick)")
    parser.add_argument("--checkpoints", type=int, help="checkpoints per mode (default 2)")
    parser.add_argument("--storage", default="local,gcs", help="local,gcs")
    parser.add_argument("--frameworks", default="ours,ray_train", help="ours,ray_train")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--torch-threads", type=int, default=1)
    parser.add_argument("--matmul-n", type=int, default=256)
    parser.add_argument("--calibrate-s", type=float, default=1.5)
    parser.add_argument("--raw-repeats", type=int, default=3)
    parser.add_argument(
        "--emulator-cpus",
        default="last",
        help="CPUs for fake-gcs-server: 'last' (the highest-numbered CPU, the default, when "
        "there are 2 or more), 'all', or a list such as '1' or '2,3'",
    )
    parser.add_argument(
        "--raw-gap-s",
        type=float,
        help="idle seconds before each raw bound transfer, as a run computes between "
        "checkpoints (default: the checkpoint interval, at most 15)",
    )
    parser.add_argument(
        "--baseline-steps", type=int, default=6, help="steps without checkpoints first (6)"
    )
    args = parser.parse_args(argv)
    if args.large:
        args.size_mib = 1024
    if args.every is None:
        args.every = 60 if args.large else 8 if args.quick else 10
    if args.checkpoints is None:
        args.checkpoints = 2
    if args.raw_gap_s is None:
        args.raw_gap_s = min(args.step_s * args.every, 15.0)
    args.storage = [s for s in args.storage.split(",") if s]
    args.frameworks = [f for f in args.frameworks.split(",") if f]

    common.setup_paths()
    ray_train = common.ray_train_status()
    if ray_train is not None and "ray_train" in args.frameworks:
        print(f"[ckpt] Ray Train skipped: {ray_train}", flush=True)
        args.frameworks = [f for f in args.frameworks if f != "ray_train"]
    cal = calibrate(args.step_s, args.matmul_n, args.torch_threads, args.calibrate_s)
    print(
        f"[ckpt] calibration: {cal['matmuls_per_s']:,.0f} matmuls/s -> "
        f"{cal['iters_per_step']} per {args.step_s:g} s step",
        flush=True,
    )
    emulator_cpus = emulator_cpu_set(args.emulator_cpus)
    emulator = common.Emulator(emulator_cpus) if "gcs" in args.storage else None
    if emulator is not None and emulator_cpus:
        print(f"[ckpt] fake-gcs-server pinned to CPU(s) {sorted(emulator_cpus)}", flush=True)
    fits: list[dict[str, Any]] = []
    try:
        print("[ckpt] raw bounds", flush=True)
        raw = raw_bounds(args, emulator)
        if emulator is not None:
            emulator.restart()  # the local fits must not share the CPU with its GC
        common.start_ray(num_cpus=4)
        for storage_kind in args.storage:
            for framework in args.frameworks:
                if emulator is not None and storage_kind == "gcs":
                    emulator.restart()  # see Emulator.restart: no memory left from before
                    warm_up_emulator(emulator, args.size_mib * MiB)
                print(f"[ckpt] {framework} on {storage_kind}", flush=True)
                fit = run_fit(framework, storage_kind, args, emulator, cal["iters_per_step"])
                fit["loadavg_1m_after"] = round(os.getloadavg()[0], 2)
                for ph in fit["phases"]:
                    print("  " + _phase_line(ph), flush=True)
                print(f"  fit {fit['fit_s']:.1f} s, after loop {fit['after_loop_s']:.1f} s")
                fits.append(fit)
    finally:
        common.stop_ray()
        if emulator is not None:
            emulator.close()
    data = {
        "params": {
            "size_mib": args.size_mib,
            "step_s": args.step_s,
            "every": args.every,
            "interval_s": args.step_s * args.every,
            "checkpoints_per_mode": args.checkpoints,
            "storage": args.storage,
            "frameworks": args.frameworks,
            "workers": args.workers,
            "torch_threads": args.torch_threads,
            "matmul_n": args.matmul_n,
            "baseline_steps": args.baseline_steps,
            "quick": args.quick,
            "ray_num_cpus": 4,
            "num_to_keep": 2,
            # the in-run RAW phase fsyncs local copies (results before this key: it did not)
            "raw_fsync": True,
            # CPUs fake-gcs-server was pinned to (absent or None: not pinned)
            "emulator_cpus": sorted(emulator_cpus) if emulator_cpus else None,
        },
        "ray_train": ray_train or "measured",
        "calibration": cal,
        "raw": raw,
        "fits": fits,
    }
    common.write_result(result_name(args.size_mib), data)
    return data


if __name__ == "__main__":
    main()
