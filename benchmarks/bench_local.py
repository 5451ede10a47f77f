"""Local mode overhead: a small torch training loop under ``fit()`` vs the same plain loop.

One process, no Ray. The same train function runs three ways:

* ``plain``: called directly; ``report()`` is a no-op and each checkpoint is written straight
  into its final folder under the storage path (what a script without a framework does);
* ``ours``: ``trainer_runtime.torch.TorchTrainer`` with ``ScalingConfig(num_workers=0)``;
  checkpoints are written into a ``tempfile.TemporaryDirectory()`` and reported (SYNC: copied
  into the run folder, committed, listed in the manifest, top-k kept);
* ``ray_train``: ``ray.train.torch.TorchTrainer`` with ``ScalingConfig(num_workers=0)`` (Ray
  Train V2's local mode) and the same code as ``ours``. Ray Train's local mode only keeps the
  last metrics and checkpoint object in memory: it persists nothing, so it does less work than
  ``ours`` and ``plain``. It also logs every ``report()`` at INFO level to stderr; that logger is
  set to WARNING here (``--ray-train-logs`` keeps it), which favours Ray Train.

The loop: an MLP (``--width`` wide, 2 hidden layers) trained with SGD on random batches of
``--batch``; every step calls ``report({"step", "loss"})`` (``loss.item()`` in all three);
every ``--ckpt-every`` steps the model's ``state_dict`` is saved and reported as a checkpoint.

Figures per run: ``fit_s`` (the call, start-up and tear-down included), ``loop_s`` (inside the
function), ``per_step_us`` (loop / steps) and ``fixed_s`` (fit - loop). Overheads are relative
to ``plain``: ``(fit_s / plain fit_s) - 1`` and the extra microseconds per step. Runs alternate
between the variants; medians over ``--repeats``.

Usage::

    python benchmarks/bench_local.py [--quick] [--steps N] [--repeats R]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import common

NAME = "local"
VARIANTS = ("plain", "ours", "ray_train")
#: The logger Ray Train's local mode reports every ``report()`` to (INFO).
RAY_TRAIN_LOCAL_LOGGER = "ray.train.v2._internal.execution.train_fn_utils"


def local_loop(config: dict[str, Any]) -> None:
    """The measured train function (``config["variant"]`` picks the framework)."""
    import torch

    variant = config["variant"]
    if variant == "ours":
        import trainer_runtime as api
    elif variant == "ray_train":
        import ray.train as api  # type: ignore[no-redef]
    torch.manual_seed(0)
    width = config["width"]
    model = torch.nn.Sequential(
        torch.nn.Linear(width, width),
        torch.nn.ReLU(),
        torch.nn.Linear(width, width),
        torch.nn.ReLU(),
        torch.nn.Linear(width, 1),
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(config["batch"], width)
    y = torch.randn(config["batch"], 1)
    every = config["ckpt_every"]
    storage = Path(config["storage"])
    clock = time.perf_counter
    report_s: list[float] = []  # report(metrics) calls
    commit_s: list[float] = []  # report(metrics, checkpoint=) calls (plain: the torch.save)
    t0 = clock()
    for step in range(config["steps"]):
        loss = (model(x) - y).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        metrics = {"step": step, "loss": float(loss.item())}
        if (step + 1) % every != 0:
            if variant != "plain":
                r0 = clock()
                api.report(metrics)
                report_s.append(clock() - r0)
            continue
        if variant == "plain":
            folder = storage / f"checkpoint_{step}"
            folder.mkdir(parents=True)
            r0 = clock()
            torch.save(model.state_dict(), folder / "model.pt")
            commit_s.append(clock() - r0)
            continue
        with tempfile.TemporaryDirectory() as tmp:
            torch.save(model.state_dict(), Path(tmp) / "model.pt")
            r0 = clock()
            api.report(metrics, checkpoint=api.Checkpoint.from_directory(tmp))
            commit_s.append(clock() - r0)
    loop_s = clock() - t0
    Path(config["out_file"]).write_text(
        json.dumps({"loop_s": loop_s, "report_s": report_s, "commit_s": commit_s})
    )


def raw_commit_bound(args: argparse.Namespace, copies: int) -> dict[str, Any]:
    """What persisting one of the loop's checkpoints costs at least: the same ``state_dict``
    file (same model, same width) copied into a new folder of the storage path and made
    durable (``shutil.copyfile``, ``fsync`` of the file, of the new folder and of its parent),
    ``copies`` times; the median."""
    import os
    import shutil

    import torch

    width = args.width
    model = torch.nn.Sequential(
        torch.nn.Linear(width, width),
        torch.nn.ReLU(),
        torch.nn.Linear(width, width),
        torch.nn.ReLU(),
        torch.nn.Linear(width, 1),
    )
    storage = common.scratch_dir("local-bound")
    src = common.scratch_dir("local-bound-src") / "model.pt"
    torch.save(model.state_dict(), src)
    size = src.stat().st_size
    times = []
    try:
        for i in range(copies):
            t0 = time.perf_counter()
            folder = storage / f"checkpoint_{i}"
            folder.mkdir()
            shutil.copyfile(src, folder / "model.pt")
            for path, flags in (
                (folder / "model.pt", os.O_RDONLY),
                (folder, os.O_RDONLY | os.O_DIRECTORY),
                (storage, os.O_RDONLY | os.O_DIRECTORY),
            ):
                fd = os.open(path, flags)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
            times.append(time.perf_counter() - t0)
    finally:
        common.rmtree(storage)
        common.rmtree(src.parent)
    return {
        "copies": copies,
        "bytes": size,
        "median_us": common.median(times) * 1e6,
        "all_us": [t * 1e6 for t in times],
    }


def run_one(variant: str, args: argparse.Namespace) -> dict[str, Any]:
    """One run of ``variant``; returns its timings."""
    storage = common.scratch_dir("local-storage")
    out_dir = common.scratch_dir("local-out")
    config = {
        "variant": variant,
        "steps": args.steps,
        "width": args.width,
        "batch": args.batch,
        "ckpt_every": args.ckpt_every,
        "storage": str(storage),
        "out_file": str(out_dir / "out.json"),
    }
    name = f"local-{variant}-{int(time.time() * 1000)}"
    try:
        t0 = time.perf_counter()
        if variant == "plain":
            local_loop(config)
        elif variant == "ours":
            from trainer_runtime import CheckpointConfig, RunConfig, ScalingConfig
            from trainer_runtime.torch import TorchTrainer

            TorchTrainer(
                local_loop,
                train_loop_config=config,
                scaling_config=ScalingConfig(num_workers=0),
                run_config=RunConfig(
                    name=name,
                    storage_path=str(storage),
                    checkpoint_config=CheckpointConfig(num_to_keep=args.num_to_keep),
                ),
            ).fit()
        else:
            import logging

            import ray.train
            import ray.train.torch

            if not args.ray_train_logs:
                logging.getLogger(RAY_TRAIN_LOCAL_LOGGER).setLevel(logging.WARNING)
            ray.train.torch.TorchTrainer(
                local_loop,
                train_loop_config=config,
                scaling_config=ray.train.ScalingConfig(num_workers=0),
                run_config=ray.train.RunConfig(
                    name=name,
                    storage_path=str(storage),
                    checkpoint_config=ray.train.CheckpointConfig(num_to_keep=args.num_to_keep),
                ),
            ).fit()
        fit_s = time.perf_counter() - t0
        out = json.loads(Path(config["out_file"]).read_text())
        loop_s = float(out["loop_s"])
    finally:
        common.rmtree(storage)
        common.rmtree(out_dir)
    return {
        "variant": variant,
        "fit_s": fit_s,
        "loop_s": loop_s,
        "fixed_s": fit_s - loop_s,
        "per_step_us": loop_s / args.steps * 1e6,
        # Medians of the calls themselves (none for plain's report: it calls nothing).
        "report_us": common.median(out["report_s"]) * 1e6 if out["report_s"] else None,
        "commit_us": common.median(out["commit_s"]) * 1e6 if out["commit_s"] else None,
        "commits": len(out["commit_s"]),
    }


def summarize(runs: list[dict[str, Any]], steps: int) -> list[dict[str, Any]]:
    """Medians per variant, and overheads relative to ``plain``."""
    rows: list[dict[str, Any]] = []
    for v in VARIANTS:
        group = [r for r in runs if r["variant"] == v]
        if not group:
            continue
        row: dict[str, Any] = {"variant": v, "repeats": len(group)}
        for key in ("fit_s", "loop_s", "fixed_s", "per_step_us"):
            row[key] = common.median([r[key] for r in group])
        for key in ("report_us", "commit_us"):
            values = [r[key] for r in group if r.get(key) is not None]
            row[key] = common.median(values) if values else None
        row["fit_s_all"] = [r["fit_s"] for r in group]
        rows.append(row)
    plain = next((r for r in rows if r["variant"] == "plain"), None)
    for row in rows:
        if plain is None:
            continue
        row["overhead_fit"] = row["fit_s"] / plain["fit_s"] - 1
        row["overhead_loop"] = row["loop_s"] / plain["loop_s"] - 1
        row["extra_us_per_step"] = (row["loop_s"] - plain["loop_s"]) / steps * 1e6
    return rows


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps and repeats")
    parser.add_argument("--steps", type=int, help="steps per run (20000; 5000 with --quick)")
    parser.add_argument("--repeats", type=int, help="runs per variant (5; 3 with --quick)")
    parser.add_argument("--width", type=int, default=128, help="MLP width (128)")
    parser.add_argument("--batch", type=int, default=32, help="batch size (32)")
    parser.add_argument("--ckpt-every", type=int, default=1000, help="steps per checkpoint")
    parser.add_argument("--num-to-keep", type=int, default=2)
    parser.add_argument("--no-ray-train", action="store_true", help="skip the Ray Train runs")
    parser.add_argument(
        "--ray-train-logs", action="store_true", help="keep Ray Train's per-report INFO log"
    )
    args = parser.parse_args(argv)
    args.steps = args.steps or (5000 if args.quick else 20000)
    repeats = args.repeats or (3 if args.quick else 5)

    common.setup_paths()
    import torch

    torch.set_num_threads(1)
    skip_ray_train = "skipped (--no-ray-train)" if args.no_ray_train else common.ray_train_status()
    variants = [v for v in VARIANTS if not (v == "ray_train" and skip_ray_train)]
    for v in variants:  # warm-up: imports, allocator, first torch.save
        run_one(v, argparse.Namespace(**{**vars(args), "steps": min(args.steps, 1000)}))
    runs: list[dict[str, Any]] = []
    bounds: list[dict[str, Any]] = []
    for rep in range(repeats):
        order = variants if rep % 2 == 0 else list(reversed(variants))
        bounds.append(raw_commit_bound(args, max(args.steps // args.ckpt_every, 5)))
        for v in order:
            run = run_one(v, args)
            run["repeat"] = rep
            print(
                f"[local] {v:9s} #{rep}: fit {run['fit_s']:.3f} s, loop {run['loop_s']:.3f} s, "
                f"{run['per_step_us']:.1f} us/step, report {common.fmt(run['report_us'], 1)} us, "
                f"checkpoint {common.fmt(run['commit_us'], 0)} us "
                f"(raw copy + fsync {bounds[-1]['median_us']:.0f} us)",
                flush=True,
            )
            runs.append(run)
    bound_us = common.median([b["median_us"] for b in bounds])
    summary = summarize(runs, args.steps)
    for row in summary:
        if row.get("commit_us") is not None:
            row["commit_vs_bound"] = row["commit_us"] / bound_us
    data = {
        "params": {
            "steps": args.steps,
            "repeats": repeats,
            "width": args.width,
            "batch": args.batch,
            "ckpt_every": args.ckpt_every,
            "checkpoints": args.steps // args.ckpt_every,
            "num_to_keep": args.num_to_keep,
            "torch_threads": 1,
            "ray_train_report_log": "on" if args.ray_train_logs else "silenced",
            "quick": args.quick,
        },
        "ray_train": skip_ray_train or "measured",
        "runs": runs,
        "summary": summary,
        # The raw copy + fsync of one checkpoint's files, measured before each repeat.
        "commit_bound": {"median_us": bound_us, "runs": bounds},
    }
    common.write_result(NAME, data)
    return data


if __name__ == "__main__":
    main()
