"""Start-up: time from ``fit()`` to the first training step, 2 workers, ours vs Ray Train.

The same train function runs under ``trainer_runtime.torch.TorchTrainer`` and
``ray.train.torch.TorchTrainer`` (2 workers, gloo process group) on a Ray cluster that is
already running (``ray.init`` is not counted: both frameworks need it). Each rank records
wall-clock times (``time.time()``, the driver and the workers are on the same machine):

* ``entered``: the train function started (worker processes up, process group formed);
* ``prepared``: ``prepare_model(Linear(64, 64))`` returned (DDP wrapped, parameters synced);
* ``first_step``: one forward/backward/optimizer step done (the first DDP all-reduce);
* ``first_report``: the first metrics-only ``report()`` returned.

Figures per ``fit()`` (max over ranks, seconds after ``fit()`` was called): ``to_entered``,
``to_first_step`` (the headline: fit() to the first step), ``to_first_report``; ``fit_s`` (the
whole call) and ``teardown_s`` (``fit()`` returned this long after the last rank's last
report). Fits alternate between the frameworks so drift on the shared machine hits both.

Usage::

    python benchmarks/bench_startup.py [--quick] [--repeats N] [--workers 2]
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

NAME = "startup"
FRAMEWORKS = ("ours", "ray_train")


def startup_loop(config: dict[str, Any]) -> None:
    """The measured train function (every rank, either framework)."""
    entered = time.time()
    import torch

    if config["framework"] == "ours":
        import trainer_runtime as api
        from trainer_runtime.torch import prepare_model
    else:
        import ray.train as api  # type: ignore[no-redef]
        from ray.train.torch import prepare_model

    torch.set_num_threads(1)
    rank = api.get_context().get_world_rank()
    model = prepare_model(torch.nn.Linear(64, 64))
    prepared = time.time()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss = model(torch.randn(32, 64)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    value = float(loss.item())
    first_step = time.time()
    api.report({"step": 0, "loss": value})
    first_report = time.time()
    out = {
        "rank": rank,
        "entered": entered,
        "prepared": prepared,
        "first_step": first_step,
        "first_report": first_report,
    }
    Path(config["out_dir"], f"rank_{rank}.json").write_text(json.dumps(out))


def _trainer(framework: str, workers: int, config: dict[str, Any], storage: Path) -> Any:
    name = f"startup-{framework}-{int(time.time() * 1000)}"
    if framework == "ours":
        from trainer_runtime import RunConfig, ScalingConfig
        from trainer_runtime.torch import TorchTrainer

        return TorchTrainer(
            startup_loop,
            train_loop_config=config,
            scaling_config=ScalingConfig(num_workers=workers),
            run_config=RunConfig(name=name, storage_path=str(storage)),
        )
    import ray.train
    import ray.train.torch

    return ray.train.torch.TorchTrainer(
        startup_loop,
        train_loop_config=config,
        scaling_config=ray.train.ScalingConfig(num_workers=workers),
        run_config=ray.train.RunConfig(name=name, storage_path=str(storage)),
    )


def run_one(framework: str, workers: int) -> dict[str, Any]:
    """One ``fit()`` under ``framework``; times relative to the ``fit()`` call."""
    out_dir = common.scratch_dir("startup-out")
    storage = common.scratch_dir("startup-storage")
    try:
        trainer = _trainer(
            framework, workers, {"framework": framework, "out_dir": str(out_dir)}, storage
        )
        fit_start = time.time()
        trainer.fit()
        fit_end = time.time()
        ranks = [json.loads(p.read_text()) for p in sorted(out_dir.glob("rank_*.json"))]
    finally:
        common.rmtree(out_dir)
        common.rmtree(storage)
    if len(ranks) != workers:
        raise RuntimeError(f"{framework}: expected {workers} rank files, got {len(ranks)}")

    def latest(key: str) -> float:
        return max(r[key] for r in ranks) - fit_start

    return {
        "framework": framework,
        "workers": workers,
        "to_entered_s": latest("entered"),
        "to_prepared_s": latest("prepared"),
        "to_first_step_s": latest("first_step"),
        "to_first_report_s": latest("first_report"),
        "fit_s": fit_end - fit_start,
        "teardown_s": fit_end - max(r["first_report"] for r in ranks),
        "loadavg_1m_after": common.loadavg_1m(),
    }


KEYS = (
    "to_entered_s",
    "to_prepared_s",
    "to_first_step_s",
    "to_first_report_s",
    "fit_s",
    "teardown_s",
)


def summarize(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Median, min and max of every figure per framework."""
    out = []
    for fw in FRAMEWORKS:
        group = [r for r in runs if r["framework"] == fw]
        if not group:
            continue
        row: dict[str, Any] = {"framework": fw, "repeats": len(group)}
        for key in KEYS:
            vals = [r[key] for r in group]
            row[key] = common.median(vals)
            row[f"{key}_min"] = min(vals)
            row[f"{key}_max"] = max(vals)
        out.append(row)
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats (3)")
    parser.add_argument("--repeats", type=int, help="fits per framework (7; 3 with --quick)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--no-ray-train", action="store_true", help="skip the Ray Train runs")
    args = parser.parse_args(argv)
    repeats = args.repeats or (3 if args.quick else 7)

    common.setup_paths()
    skip_ray_train = "skipped (--no-ray-train)" if args.no_ray_train else common.ray_train_status()
    frameworks = ["ours"] if skip_ray_train else list(FRAMEWORKS)
    common.start_ray(num_cpus=4)
    runs: list[dict[str, Any]] = []
    try:
        # One untimed fit per framework first: Ray's worker pool, imports and file caches warm
        # up the same way for both.
        for fw in frameworks:
            print(f"[startup] warm-up {fw}", flush=True)
            run_one(fw, args.workers)
        for rep in range(repeats):
            order = frameworks if rep % 2 == 0 else list(reversed(frameworks))
            for fw in order:
                run = run_one(fw, args.workers)
                run["repeat"] = rep
                print(
                    f"[startup] {fw} #{rep}: entered {run['to_entered_s']:.2f} s, first step "
                    f"{run['to_first_step_s']:.2f} s, first report {run['to_first_report_s']:.2f}"
                    f" s, fit {run['fit_s']:.2f} s",
                    flush=True,
                )
                runs.append(run)
    finally:
        common.stop_ray()
    data = {
        "params": {
            "workers": args.workers,
            "repeats": repeats,
            "quick": args.quick,
            "ray_num_cpus": 4,
        },
        "ray_train": skip_ray_train or "measured",
        "runs": runs,
        "summary": summarize(runs),
    }
    common.write_result(NAME, data)
    return data


if __name__ == "__main__":
    main()
