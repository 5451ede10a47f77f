"""Ray Data ingestion to 2 workers: rows per second and the step time while streaming, ours vs
Ray Train 2.60, side by side in one run.

The same train function runs under ``trainer_runtime.DataParallelTrainer`` and under Ray
Train's ``DataParallelTrainer`` (only the import differs), both given
``datasets={"train": ds}`` with Ray's default ``DataConfig`` (every dataset split, equally,
by ``streaming_split``). ``ds`` is a Ray Data pipeline: ``ray.data.range(rows)`` then a
``map_batches`` that makes each row a float32 feature vector of ``--dim`` values and a label
(the preprocessing runs as Ray Data tasks on the cluster's CPUs while the workers consume).

Each worker reads its shard with ``get_dataset_shard("train").iter_batches(batch_size=B,
batch_format="numpy")`` for ``--epochs`` epochs (Ray Data executes the pipeline again each
epoch, in both) and takes a simulated accelerator step of ``--step-ms`` per batch
(``time.sleep``: the accelerator computes, the host CPU is free for the data pipeline). What
is timed, per worker and epoch:

* ``rows_per_s``: rows the workers consumed in the epoch over the slowest worker's epoch time
  (the first epoch, which also starts the pipeline, is reported apart);
* ``step_ms``: the time between two batches arriving at the train loop (the step plus any wait
  for data), p50 and p99 over every step of the later epochs: a step time above ``--step-ms``
  is the data pipeline stalling the accelerator;
* ``fit_s``: the whole ``fit()``.

The Ray cluster has 4 logical CPUs (2 taken by the workers, the rest for Ray Data's tasks).
Each framework first runs ``--warmup-fits`` untimed fits (the cluster's first Ray Data
pipeline, worker processes, imports), then the timed ones alternate between repeats so that
the machine's drift hits both frameworks.

Usage::

    python benchmarks/bench_data.py [--quick] [--rows N] [--epochs N] [--repeats R]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import common

NAME = "data"


def ingest_loop(config: dict[str, Any]) -> None:
    """The measured train function (runs in each worker, for either framework)."""
    if config["framework"] == "ours":
        import trainer_runtime as api
    else:
        import ray.train as api  # type: ignore[no-redef]

    rank = api.get_context().get_world_rank()
    shard = api.get_dataset_shard("train")
    step_s = config["step_ms"] / 1000
    perf = time.perf_counter
    epochs = []
    for epoch in range(config["epochs"]):
        rows = 0
        steps: list[float] = []
        started = last = perf()
        for batch in shard.iter_batches(batch_size=config["batch_size"], batch_format="numpy"):
            rows += len(batch["y"])
            time.sleep(step_s)  # the accelerator's step
            now = perf()
            steps.append(now - last)
            last = now
        epochs.append({"rows": rows, "seconds": perf() - started, "steps": steps})
        api.report({"epoch": epoch, "rows": rows})
    Path(config["out_dir"], f"rank_{rank}.json").write_text(json.dumps(epochs))


def _featurize(batch: dict[str, Any], dim: int) -> dict[str, Any]:
    import numpy as np

    ids = batch["id"]
    x = (ids[:, None] * np.arange(1, dim + 1, dtype=np.float32)[None, :]) % 7.0
    return {"x": x.astype(np.float32), "y": (ids % 2).astype(np.int64)}


def dataset(rows: int, dim: int, blocks: int) -> Any:
    """The pipeline both frameworks read: ``range`` -> a float32 feature vector per row."""
    import ray.data

    return ray.data.range(rows, override_num_blocks=blocks).map_batches(
        _featurize, fn_kwargs={"dim": dim}, batch_format="numpy"
    )


def _trainer(framework: str, config: dict[str, Any], ds: Any, storage: Path) -> Any:
    name = f"{framework}-{int(time.time() * 1000)}"
    if framework == "ours":
        import trainer_runtime as train
        from trainer_runtime import DataParallelTrainer
    else:
        import ray.train as train  # type: ignore[no-redef]
        from ray.train.v2.api.data_parallel_trainer import (  # type: ignore[no-redef]
            DataParallelTrainer,
        )
    return DataParallelTrainer(
        ingest_loop,
        train_loop_config=config,
        scaling_config=train.ScalingConfig(num_workers=config["workers"]),
        run_config=train.RunConfig(name=name, storage_path=str(storage)),
        datasets={"train": ds},
    )


def run_one(framework: str, params: dict[str, Any]) -> dict[str, Any]:
    """One ``fit()`` of ``framework`` and its figures."""
    out_dir = common.scratch_dir("data-out")
    storage = common.scratch_dir("data-storage")
    config = {"framework": framework, "out_dir": str(out_dir), **params}
    try:
        ds = dataset(params["rows"], params["dim"], params["blocks"])
        trainer = _trainer(framework, config, ds, storage)
        fit_start = time.monotonic()
        trainer.fit()
        fit_s = time.monotonic() - fit_start
        ranks = [json.loads(p.read_text()) for p in sorted(out_dir.glob("rank_*.json"))]
    finally:
        common.rmtree(out_dir)
        common.rmtree(storage)
    if len(ranks) != params["workers"]:
        raise RuntimeError(f"{framework}: expected {params['workers']} rank files, got {ranks}")

    def epoch_rate(epoch: int) -> float:
        rows = sum(r[epoch]["rows"] for r in ranks)
        return rows / max(r[epoch]["seconds"] for r in ranks)

    rows_per_epoch = [sum(r[e]["rows"] for r in ranks) for e in range(params["epochs"])]
    later = range(1, params["epochs"])
    steps_ms = [s * 1000 for r in ranks for e in later for s in r[e]["steps"]]
    stats = common.summarize(steps_ms)
    return {
        "framework": framework,
        "rows_per_epoch": rows_per_epoch,
        "first_epoch_rows_per_s": epoch_rate(0),
        "rows_per_s": common.median([epoch_rate(e) for e in later]),
        "step_ms_p50": stats["p50"],
        "step_ms_p99": stats["p99"],
        "step_ms_max": stats["max"],
        "fit_s": fit_s,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer rows and repeats")
    parser.add_argument("--rows", type=int, help="rows in the dataset (400000; 100000)")
    parser.add_argument("--dim", type=int, default=64, help="float32 features per row")
    parser.add_argument("--blocks", type=int, default=16, help="Ray Data blocks")
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--step-ms", type=float, default=2.0, help="the simulated step")
    parser.add_argument("--epochs", type=int, help="epochs (4; 3)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, help="fits per framework (3; 2)")
    parser.add_argument(
        "--warmup-fits",
        type=int,
        default=1,
        help="untimed fits per framework first (the first use of Ray Data in a cluster)",
    )
    parser.add_argument("--no-ray-train", action="store_true", help="skip the Ray Train runs")
    args = parser.parse_args(argv)
    params = {
        "rows": args.rows or (100_000 if args.quick else 400_000),
        "dim": args.dim,
        "blocks": args.blocks,
        "batch_size": args.batch_size,
        "step_ms": args.step_ms,
        "epochs": args.epochs or (3 if args.quick else 4),
        "workers": args.workers,
    }
    repeats = args.repeats or (2 if args.quick else 3)

    common.setup_paths()
    skip_ray_train = "skipped (--no-ray-train)" if args.no_ray_train else common.ray_train_status()
    frameworks = ["ours"] + (["ray_train"] if skip_ray_train is None else [])
    common.start_ray(num_cpus=4)
    runs: list[dict[str, Any]] = []
    try:
        for _ in range(args.warmup_fits):
            for framework in frameworks:
                print(f"[data] {framework} warm-up fit (not counted)", flush=True)
                run_one(framework, params)
        for rep in range(repeats):
            for framework in frameworks if rep % 2 == 0 else list(reversed(frameworks)):
                print(f"[data] {framework} repeat={rep}", flush=True)
                run = run_one(framework, params)
                run["repeat"] = rep
                print(
                    f"  {run['rows_per_s']:,.0f} rows/s (first epoch "
                    f"{run['first_epoch_rows_per_s']:,.0f})  step p50 "
                    f"{run['step_ms_p50']:.2f} ms p99 {run['step_ms_p99']:.2f} ms  "
                    f"fit {run['fit_s']:.1f} s",
                    flush=True,
                )
                runs.append(run)
    finally:
        common.stop_ray()
    data = {
        "params": {
            **params,
            "repeats": repeats,
            "warmup_fits": args.warmup_fits,
            "quick": args.quick,
            "ray_num_cpus": 4,
        },
        "ray_train": skip_ray_train or "measured",
        "runs": runs,
        "summary": summarize_runs(runs),
    }
    common.write_result(NAME, data)
    return data


def summarize_runs(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The median of each figure over the repeats, per framework (ours first)."""
    out = []
    for framework in ("ours", "ray_train"):
        mine = [r for r in runs if r["framework"] == framework]
        if not mine:
            continue
        row: dict[str, Any] = {"framework": framework, "fits": len(mine)}
        for key in (
            "rows_per_s",
            "first_epoch_rows_per_s",
            "step_ms_p50",
            "step_ms_p99",
            "step_ms_max",
            "fit_s",
        ):
            row[key] = common.median([r[key] for r in mine])
        out.append(row)
    return out


if __name__ == "__main__":
    main()
