"""Validation during training: latency from ``report()`` to validation start, and training
throughput while validations run, ours vs Ray Train (2 Ray workers).

Both frameworks validate a reported checkpoint asynchronously as a Ray task:

* ``trainer_runtime``: ``report(..., checkpoint=c, validate_fn=fn, validate_config=cfg)``; the
  task asks for the custom resource ``validation`` and no CPU (``ValidationConfig`` defaults);
* Ray Train 2.60: ``TorchTrainer(..., validation_config=ValidationConfig(fn, task_config=
  ValidationTaskConfig(fn_kwargs=cfg), ray_remote_kwargs={"num_cpus": 0, "resources":
  {"validation": 1}}))`` and ``ray.train.report(..., checkpoint=c, validation=True)``, so the
  task lands on the same resource. Ray Train runs at most one validation at a time; ours is
  set to the same (``max_concurrent_validations=1``, the default).

The Ray cluster has 4 CPUs and ``{"validation": 1}``. Each step is a fixed amount of compute
(``--step-s``, torch matmuls with 1 thread, calibrated once in the driver). After a baseline
phase without checkpoints, every ``--every`` steps rank 0 writes a checkpoint (``--size-mib``
random bytes + a JSON file with the step) to a fresh folder and reports it with validation (the
other rank reports ``None``); every checkpoint is followed by a full interval of compute.
Upload mode: SYNC (both frameworks' default), local storage.

The validation function reads the whole committed checkpoint, then simulates the rest of the
validation for ``--val-s`` seconds. By default it waits (``--val-work sleep``): in a cluster
validation runs on separate machines (the validation pool), and on this 2-core VM real
validation compute would only measure CPU contention, the same for both frameworks;
``--val-work compute`` runs matmuls instead.

Figures per ``fit()``:

* ``start_latency``: validation task started (first line of the function, wall clock) minus
  the moment rank 0 called ``report()`` with that checkpoint; the first one separately (it
  waits for a new Ray worker process, in both frameworks), p50 and max of the others; split
  into report -> the controller registered the checkpoint (a driver ``Callback.on_checkpoint``
  for ours, a ``UserCallback.after_report`` in Ray Train's controller) -> validation start;
* training throughput: steps per second of step time for the steps that ran while a
  validation was running (step midpoint inside a validation's [start, end]) and for the other
  steps of the same phase, from the end of the first validation on (the first one starts a
  new Ray worker process, seconds of CPU, in both frameworks); ``during_vs_outside`` = the
  ratio (1.0: validation costs training nothing). The gaps between steps (checkpoint
  writes, ``report()``) are left out here and measured as ``report_ms``;
  ``phase_vs_baseline`` is the whole phase's steps per wall second over the baseline
  phase's, so it includes them;
* ``report_ms``: time in ``report()`` for the calls with a checkpoint (rank 0).

Ray Train's controller starts a validation when it polls its workers (every
``RAY_TRAIN_HEALTH_CHECK_INTERVAL_S``, 2 s by default); it runs with the default and with
``--ray-poll-s`` (0.1 s).

Usage::

    python benchmarks/bench_validation.py [--quick] [--checkpoints N] [--every N]
        [--step-s 0.1] [--val-s 1.0] [--val-work sleep|compute] [--size-mib 16]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import common

NAME = "validation"
MiB = common.MiB
POLL_ENV = "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"


# -- the validation function ------------------------------------------------------------------
def _validate_core(checkpoint: Any, cfg: dict[str, Any]) -> dict[str, Any]:
    """Read the checkpoint, then wait or compute ``val_s``; log the times to a JSONL file."""
    start = time.time()
    with checkpoint.as_directory() as d:
        meta = json.loads(Path(d, "meta.json").read_text())
        nbytes = 0
        with open(Path(d, "weights.bin"), "rb") as fh:
            while chunk := fh.read(8 * MiB):
                nbytes += len(chunk)
    read_done = time.time()
    if cfg["val_work"] == "compute":
        import torch

        torch.set_num_threads(1)
        a = torch.randn(cfg["matmul_n"], cfg["matmul_n"])
        while time.time() - read_done < cfg["val_s"]:
            torch.mm(a, a)
    else:
        time.sleep(cfg["val_s"])
    end = time.time()
    line = {
        "index": meta["index"],
        "step": meta["step"],
        "start": start,
        "read_done": read_done,
        "end": end,
        "bytes": nbytes,
        "pid": os.getpid(),
    }
    with open(Path(cfg["out_dir"], "validations.jsonl"), "a") as fh:
        fh.write(json.dumps(line) + "\n")
    return {"val_score": float(meta["step"])}


def validate_ours(checkpoint: Any, config: dict[str, Any]) -> dict[str, Any]:
    """trainer_runtime's signature: ``fn(checkpoint, config) -> dict``."""
    return _validate_core(checkpoint, config)


def validate_ray_train(checkpoint: Any, **kwargs: Any) -> dict[str, Any]:
    """Ray Train's signature: ``fn(checkpoint, **fn_kwargs) -> dict``."""
    return _validate_core(checkpoint, kwargs)


# -- the train function -----------------------------------------------------------------------
def validation_loop(config: dict[str, Any]) -> None:
    """The measured train function (every rank, either framework)."""
    import torch

    framework = config["framework"]
    if framework == "ours":
        import trainer_runtime as api
    else:
        import ray.train as api  # type: ignore[no-redef]

    torch.set_num_threads(1)
    rank = api.get_context().get_world_rank()
    a = torch.randn(config["matmul_n"], config["matmul_n"])
    iters = config["iters_per_step"]

    def work() -> None:
        for _ in range(iters):
            torch.mm(a, a)

    for _ in range(3):
        work()  # warm-up
    payload = os.urandom(config["size_bytes"]) if rank == 0 else b""
    tmp_root = Path(config["local_tmp"])
    every = config["every"]
    steps: list[tuple[float, float]] = []  # (start, end) wall clock of every step's compute
    reports: list[dict[str, Any]] = []
    baseline_start = time.time()
    for _ in range(config["baseline_steps"]):
        t0 = time.time()
        work()
        steps.append((t0, time.time()))
    baseline_end = time.time()
    step = config["baseline_steps"]
    for i in range(config["checkpoints"] * every):
        t0 = time.time()
        work()
        steps.append((t0, time.time()))
        step += 1
        if i % every != 0:
            continue
        index = i // every
        ckpt = None
        if rank == 0:
            folder = Path(tempfile.mkdtemp(prefix="val-ckpt-", dir=tmp_root))
            (folder / "weights.bin").write_bytes(payload)
            (folder / "meta.json").write_text(json.dumps({"step": step, "index": index}))
            ckpt = api.Checkpoint.from_directory(str(folder))
        t0 = time.time()
        if framework == "ours":
            api.report(
                {"step": step},
                checkpoint=ckpt,
                validate_fn=validate_ours if ckpt is not None else None,
                validate_config=config["val_cfg"] if ckpt is not None else None,
            )
        else:
            ray_report: Any = api.report  # ray.train.report: validation=...
            ray_report({"step": step}, checkpoint=ckpt, validation=ckpt is not None)
        reports.append({"index": index, "step": step, "start": t0, "end": time.time()})
    out = {
        "rank": rank,
        "baseline": [baseline_start, baseline_end],
        "baseline_steps": config["baseline_steps"],
        "steps": steps,
        "reports": reports,
        "loop_end": time.time(),
    }
    Path(config["out_dir"], f"rank_{rank}.json").write_text(json.dumps(out))


# -- the driver side --------------------------------------------------------------------------
def _log_registered(path: str, step: Any) -> None:
    """Append ``{"step", "t"}``: the controller registered the checkpoint of ``step``."""
    with open(path, "a") as fh:
        fh.write(json.dumps({"step": step, "t": time.time()}) + "\n")


def _ours_registered_callback(path: str) -> Any:
    """A trainer_runtime Callback (driver) logging when each checkpoint was committed."""
    from trainer_runtime import Callback

    class _Cb(Callback):
        def __init__(self) -> None:
            self.seen: set[str] = set()

        def on_checkpoint(self, record: Any, best: Any) -> None:
            if record.name not in self.seen:  # later calls: its validation finished
                self.seen.add(record.name)
                _log_registered(path, record.metrics.get("step"))

    return _Cb()


def _ray_registered_callback(path: str) -> Any:
    """A Ray Train UserCallback (controller actor) logging when each checkpoint was registered."""
    from ray.train import UserCallback

    class _Cb(UserCallback):
        def after_report(self, run_context: Any, metrics: Any, checkpoint: Any) -> None:
            if checkpoint is not None:
                first = metrics[0] if isinstance(metrics, list) else metrics
                _log_registered(path, first.get("step"))

    return _Cb()


def _trainer(framework: str, config: dict[str, Any], storage: Path, workers: int) -> Any:
    name = f"val-{framework}-{int(time.time() * 1000)}"
    registered = str(Path(config["out_dir"], "registered.jsonl"))
    if framework == "ours":
        from trainer_runtime import RunConfig, ScalingConfig, ValidationConfig
        from trainer_runtime.torch import TorchTrainer

        return TorchTrainer(
            validation_loop,
            train_loop_config=config,
            scaling_config=ScalingConfig(num_workers=workers),
            run_config=RunConfig(
                name=name,
                storage_path=str(storage),
                validation_config=ValidationConfig(max_concurrent_validations=1),
                callbacks=[_ours_registered_callback(registered)],
            ),
        )
    import ray.train
    import ray.train.torch
    from ray.train.v2.api.validation_config import ValidationConfig as RayValidationConfig
    from ray.train.v2.api.validation_config import ValidationTaskConfig

    return ray.train.torch.TorchTrainer(
        validation_loop,
        train_loop_config=config,
        scaling_config=ray.train.ScalingConfig(num_workers=workers),
        run_config=ray.train.RunConfig(
            name=name,
            storage_path=str(storage),
            callbacks=[_ray_registered_callback(registered)],
        ),
        validation_config=RayValidationConfig(  # type: ignore[call-arg]
            validate_ray_train,
            task_config=ValidationTaskConfig(fn_kwargs=config["val_cfg"]),
            ray_remote_kwargs={"num_cpus": 0, "resources": {"validation": 1}},
        ),
    )


def _overlap(a0: float, a1: float, windows: list[tuple[float, float]]) -> float:
    """Seconds of [a0, a1] covered by the (non-overlapping) windows."""
    return sum(max(0.0, min(a1, w1) - max(a0, w0)) for w0, w1 in windows)


def analyse(
    rank0: dict[str, Any], vals: list[dict[str, Any]], registered: list[dict[str, Any]]
) -> dict[str, Any]:
    """Latencies and throughput of one fit from rank 0's timeline and the validation log."""
    b0, b1 = rank0["baseline"]
    nb = rank0["baseline_steps"]
    base_rate = nb / (b1 - b0) if nb else None
    steps = rank0["steps"][nb:]
    p0, p1 = b1, rank0["loop_end"]
    windows = sorted((v["start"], v["end"]) for v in vals)
    in_win = _overlap(p0, p1, windows)

    def inside(s: list[float]) -> bool:
        mid = (s[0] + s[1]) / 2
        return any(w0 <= mid <= w1 for w0, w1 in windows)

    # The first validation starts a fresh Ray worker process (imports: seconds of CPU) for
    # either framework; the throughput split starts after it ended.
    first_end = min((v["end"] for v in vals if v["index"] == 0), default=p0)
    steady = [s for s in steps if s[0] >= first_end]
    dur_in = [s[1] - s[0] for s in steady if inside(s)]
    dur_out = [s[1] - s[0] for s in steady if not inside(s)]
    # Steps per second of step time (the gaps between steps are checkpoint writes and
    # report() calls, measured separately): what validation costs the training compute.
    during = len(dur_in) / sum(dur_in) if dur_in else None
    outside = len(dur_out) / sum(dur_out) if dur_out else None
    by_index = {v["index"]: v for v in vals}
    reg_by_step = {g["step"]: g["t"] for g in registered}
    latencies: list[float] = []
    read_s = []
    to_registered = []
    registered_to_start = []
    for r in rank0["reports"]:
        v = by_index.get(r["index"])
        reg = reg_by_step.get(r["step"])
        if reg is not None:
            to_registered.append(reg - r["start"])
        if v is None:
            continue
        latencies.append(v["start"] - r["start"])
        read_s.append(v["read_done"] - v["start"])
        if reg is not None:
            registered_to_start.append(v["start"] - reg)
    report_ms = [(r["end"] - r["start"]) * 1e3 for r in rank0["reports"]]
    return {
        "checkpoints": len(rank0["reports"]),
        "validated": len(vals),
        "start_latency_s": latencies,
        # The first validation waits for a new Ray worker process; the rest reuse it.
        "start_latency_first_s": latencies[0] if latencies else None,
        "start_latency_p50_s": common.median(latencies[1:]) if latencies[1:] else None,
        "start_latency_max_s": max(latencies[1:]) if latencies[1:] else None,
        "to_registered_p50_s": common.median(to_registered) if to_registered else None,
        "registered_to_start_p50_s": (
            common.median(registered_to_start[1:]) if registered_to_start[1:] else None
        ),
        "read_s_p50": common.median(read_s) if read_s else None,
        "report_ms_p50": common.median(report_ms) if report_ms else None,
        "report_ms_max": max(report_ms) if report_ms else None,
        "baseline_steps_per_s": base_rate,
        "phase_steps_per_s": len(steps) / (p1 - p0) if p1 > p0 else None,
        "during_validation_steps_per_s": during,
        "outside_validation_steps_per_s": outside,
        "during_vs_outside": during / outside if during and outside else None,
        "phase_vs_baseline": (len(steps) / (p1 - p0)) / base_rate if base_rate else None,
        "validation_window_s": in_win,
        "steps_in_validation": len(dur_in),
    }


def run_fit(
    framework: str, args: argparse.Namespace, iters: int, ray_poll_s: float | None
) -> dict[str, Any]:
    """One ``fit()``; returns :func:`analyse`'s figures plus the fit's wall times."""
    out_dir = common.scratch_dir("val-out")
    local_tmp = common.scratch_dir("val-local")
    storage = common.scratch_dir("val-storage")
    val_cfg = {
        "out_dir": str(out_dir),
        "val_s": args.val_s,
        "val_work": args.val_work,
        "matmul_n": args.matmul_n,
    }
    config = {
        "framework": framework,
        "out_dir": str(out_dir),
        "local_tmp": str(local_tmp),
        "size_bytes": args.size_mib * MiB,
        "every": args.every,
        "checkpoints": args.checkpoints,
        "baseline_steps": args.baseline_steps,
        "matmul_n": args.matmul_n,
        "iters_per_step": iters,
        "val_cfg": val_cfg,
    }
    old_poll = os.environ.pop(POLL_ENV, None)
    if ray_poll_s is not None:
        os.environ[POLL_ENV] = repr(ray_poll_s)
    try:
        trainer = _trainer(framework, config, storage, args.workers)
        fit_start = time.time()
        trainer.fit()
        fit_end = time.time()
        rank0 = json.loads((out_dir / "rank_0.json").read_text())
        log = out_dir / "validations.jsonl"
        vals = [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []
        reg_log = out_dir / "registered.jsonl"
        registered = (
            [json.loads(x) for x in reg_log.read_text().splitlines()] if reg_log.exists() else []
        )
    finally:
        os.environ.pop(POLL_ENV, None)
        if old_poll is not None:
            os.environ[POLL_ENV] = old_poll
        common.rmtree(out_dir)
        common.rmtree(local_tmp)
        common.rmtree(storage)
    mode = "trainer_runtime"
    if framework == "ray_train":
        mode = (
            f"Ray Train, poll {ray_poll_s:g} s" if ray_poll_s else "Ray Train, poll 2 s (default)"
        )
    return {
        "framework": framework,
        "mode": mode,
        "ray_poll_s": ray_poll_s,
        "fit_s": fit_end - fit_start,
        "after_loop_s": fit_end - rank0["loop_end"],
        **analyse(rank0, vals, registered),
        "loadavg_1m_after": common.loadavg_1m(),
    }


def _line(r: dict[str, Any]) -> str:
    def f(v: float | None, d: int = 3) -> str:
        return "n/a" if v is None else f"{v:.{d}f}"

    return (
        f"{r['mode']}: validated {r['validated']}/{r['checkpoints']}, start latency p50 "
        f"{f(r['start_latency_p50_s'])} s max {f(r['start_latency_max_s'])} s (registered "
        f"{f(r['to_registered_p50_s'])} s, then {f(r['registered_to_start_p50_s'])} s); steps/s "
        f"baseline "
        f"{f(r['baseline_steps_per_s'], 2)}, during validation "
        f"{f(r['during_validation_steps_per_s'], 2)}, outside "
        f"{f(r['outside_validation_steps_per_s'], 2)} ({f(r['during_vs_outside'])}x); report "
        f"p50 {f(r['report_ms_p50'], 1)} ms; fit {r['fit_s']:.1f} s"
    )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer checkpoints (4)")
    parser.add_argument("--checkpoints", type=int, help="checkpoints per fit (8; 4 --quick)")
    parser.add_argument("--every", type=int, default=20, help="steps between checkpoints (20)")
    parser.add_argument("--step-s", type=float, default=0.1, help="compute per step (0.1 s)")
    parser.add_argument("--baseline-steps", type=int, default=20)
    parser.add_argument("--val-s", type=float, default=1.0, help="validation length (1 s)")
    parser.add_argument("--val-work", choices=("sleep", "compute"), default="sleep")
    parser.add_argument("--size-mib", type=int, default=16, help="checkpoint size (16 MiB)")
    parser.add_argument("--matmul-n", type=int, default=256)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--ray-poll-s",
        type=float,
        default=0.1,
        help="Ray Train's tuned RAY_TRAIN_HEALTH_CHECK_INTERVAL_S (0 disables that run)",
    )
    parser.add_argument("--repeats", type=int, default=1, help="fits per configuration")
    parser.add_argument("--no-ray-train", action="store_true", help="skip the Ray Train runs")
    args = parser.parse_args(argv)
    args.checkpoints = args.checkpoints or (4 if args.quick else 8)

    common.setup_paths()
    skip_ray_train = "skipped (--no-ray-train)" if args.no_ray_train else common.ray_train_status()
    cal = common.calibrate_matmuls(args.step_s, args.matmul_n, 1, 1.5)
    print(f"[validation] {cal['iters_per_step']} matmuls per {args.step_s:g} s step", flush=True)
    configs: list[tuple[str, float | None]] = [("ours", None)]
    if skip_ray_train is None:
        configs.append(("ray_train", None))
        if args.ray_poll_s > 0:
            configs.append(("ray_train", args.ray_poll_s))
    common.start_ray(num_cpus=4, resources={"validation": 1})
    fits: list[dict[str, Any]] = []
    try:
        for rep in range(args.repeats):
            order = configs if rep % 2 == 0 else list(reversed(configs))
            for framework, poll in order:
                fit = run_fit(framework, args, cal["iters_per_step"], poll)
                fit["repeat"] = rep
                print("[validation] " + _line(fit), flush=True)
                fits.append(fit)
    finally:
        common.stop_ray()
    data = {
        "params": {
            "workers": args.workers,
            "checkpoints": args.checkpoints,
            "every": args.every,
            "step_s": args.step_s,
            "interval_s": args.every * args.step_s,
            "baseline_steps": args.baseline_steps,
            "val_s": args.val_s,
            "val_work": args.val_work,
            "size_mib": args.size_mib,
            "matmul_n": args.matmul_n,
            "ray_poll_s": args.ray_poll_s,
            "repeats": args.repeats,
            "upload_mode": "SYNC",
            "quick": args.quick,
            "ray_num_cpus": 4,
        },
        "ray_train": skip_ray_train or "measured",
        "calibration": cal,
        "fits": fits,
    }
    common.write_result(NAME, data)
    return data


if __name__ == "__main__":
    main()
