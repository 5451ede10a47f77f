"""Metrics-only ``report()`` overhead: ours vs Ray Train, 2 Ray workers, plus local mode.

The same train loop runs under ``trainer_runtime.torch.TorchTrainer`` and under
``ray.train.torch.TorchTrainer``: ``warmup`` untimed calls, then ``calls`` timed calls of
``report({"step": i, "loss": ...})`` (no checkpoint). Each worker times every call with
``time.perf_counter()`` and writes its samples to a file; the driver pools them.

Figures per configuration:

* ``calls_per_s``: timed calls / the slowest rank's loop time (what one worker can do);
* ``p50_us`` / ``p99_us`` / ``max_us``: latency of one ``report()`` call, all ranks pooled;
* ``ingest_calls_per_s``: timed calls / (the controller took in rank 0's last report - the
  loop started), measured with a driver-side Callback (ours) or a UserCallback in Ray Train's
  controller actor; it shows whether the controller keeps up with the workers;
* ``fit_s``: the whole ``fit()`` (worker start-up included).

Usage::

    python benchmarks/bench_report.py [--quick] [--calls N] [--ray-calls N] [--repeats R]

Ray Train V2's controller polls its workers every ``RAY_TRAIN_HEALTH_CHECK_INTERVAL_S`` (2 s
by default) and each worker's result queue holds one report, so a metrics-only
``ray.train.report()`` blocks until the next poll. It is measured with the default and with
``--ray-poll-s`` (0.01 s). Ray Train's local mode (``num_workers=0``) only stores the metrics
in memory (no controller, no persistence): that row is not like-for-like.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import common

NAME = "report"


def report_loop(config: dict[str, Any]) -> None:
    """The measured train function (runs in each worker, for either framework)."""
    if config["framework"] == "ours":
        import trainer_runtime as api
    else:
        import ray.train as api  # type: ignore[no-redef]

    report = api.report
    rank = api.get_context().get_world_rank()
    for i in range(config["warmup"]):
        report({"step": -1 - i, "loss": 0.0})
    samples = []
    perf = time.perf_counter
    started_at = time.time()
    loop_start = perf()
    for i in range(config["calls"]):
        t0 = perf()
        report({"step": i, "loss": 1.0 / (i + 1)})
        samples.append(perf() - t0)
    loop_s = perf() - loop_start
    out = {"rank": rank, "started_at": started_at, "loop_s": loop_s, "samples": samples}
    Path(config["out_dir"], f"rank_{rank}.json").write_text(json.dumps(out))


class _OursLastReport:
    """A trainer_runtime Callback (runs in the driver) remembering when rank 0's report landed."""

    def __init__(self) -> None:
        from trainer_runtime import Callback

        class _Cb(Callback):
            def __init__(self) -> None:
                self.last = 0.0

            def on_report(self, round_index: int, metrics: dict[str, Any]) -> None:
                self.last = time.time()

        self.callback = _Cb()

    def last(self) -> float:
        return float(self.callback.last)


def _ray_last_report_callback(path: str) -> Any:
    """A Ray Train UserCallback (runs in the controller actor) writing the time to ``path``."""
    from ray.train import UserCallback

    class _Cb(UserCallback):
        def after_report(self, run_context: Any, metrics: Any, checkpoint: Any) -> None:
            Path(path).write_text(repr(time.time()))

    return _Cb()


def _trainer(
    framework: str, num_workers: int, config: dict[str, Any], storage: Path, callback: Any
) -> Any:
    name = f"{framework}-{num_workers}w-{int(time.time() * 1000)}"
    if framework == "ours":
        from trainer_runtime import RunConfig, ScalingConfig
        from trainer_runtime.torch import TorchTrainer

        return TorchTrainer(
            report_loop,
            train_loop_config=config,
            scaling_config=ScalingConfig(num_workers=num_workers),
            run_config=RunConfig(name=name, storage_path=str(storage), callbacks=[callback]),
        )
    import ray.train
    import ray.train.torch

    return ray.train.torch.TorchTrainer(
        report_loop,
        train_loop_config=config,
        scaling_config=ray.train.ScalingConfig(num_workers=num_workers),
        run_config=ray.train.RunConfig(
            name=name,
            storage_path=str(storage),
            callbacks=[callback] if callback is not None else None,
        ),
    )


POLL_ENV = "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"


def run_one(
    framework: str,
    num_workers: int,
    calls: int,
    warmup: int,
    ray_poll_s: float | None = None,
) -> dict[str, Any]:
    """Run the loop once under ``framework`` and summarise it.

    ``ray_poll_s``: Ray Train's controller poll interval (``RAY_TRAIN_HEALTH_CHECK_INTERVAL_S``,
    propagated by Ray Train from the driver to its controller); None keeps Ray's default (2 s).
    """
    out_dir = common.scratch_dir("report-out")
    storage = common.scratch_dir("report-storage")
    config = {
        "framework": framework,
        "calls": calls,
        "warmup": warmup,
        "out_dir": str(out_dir),
    }
    last_file = out_dir / "last_report_time"
    ours_cb = _OursLastReport() if framework == "ours" else None
    if framework == "ours":
        callback: Any = ours_cb.callback if ours_cb else None
    elif num_workers > 0:
        callback = _ray_last_report_callback(str(last_file))
    else:
        callback = None  # Ray Train's local mode runs no controller callbacks
    old_poll = os.environ.pop(POLL_ENV, None)
    if ray_poll_s is not None:
        os.environ[POLL_ENV] = repr(ray_poll_s)
    try:
        trainer = _trainer(framework, num_workers, config, storage, callback)
        fit_start = time.time()
        trainer.fit()
        fit_end = time.time()
        ranks = [json.loads(p.read_text()) for p in sorted(out_dir.glob("rank_*.json"))]
        if ours_cb is not None:
            last_seen: float | None = ours_cb.last()
        elif last_file.exists():
            last_seen = float(last_file.read_text())
        else:
            last_seen = None
    finally:
        os.environ.pop(POLL_ENV, None)
        if old_poll is not None:
            os.environ[POLL_ENV] = old_poll
        common.rmtree(out_dir)
        common.rmtree(storage)
    if len(ranks) != max(num_workers, 1):
        raise RuntimeError(f"{framework}: expected {max(num_workers, 1)} rank files, got {ranks}")
    samples_us = [s * 1e6 for r in ranks for s in r["samples"]]
    slowest = max(r["loop_s"] for r in ranks)
    stats = common.summarize(samples_us)
    loop_start = min(r["started_at"] for r in ranks)
    mode = "local" if num_workers == 0 else f"{num_workers} Ray workers"
    if framework == "ray_train" and num_workers > 0:
        mode += f", poll {ray_poll_s:g} s" if ray_poll_s is not None else ", poll 2 s (default)"
    return {
        "framework": framework,
        "mode": mode,
        "num_workers": num_workers,
        "ray_poll_s": ray_poll_s,
        "calls": calls,
        "warmup": warmup,
        "calls_per_s": calls / slowest,
        "p50_us": stats["p50"],
        "p90_us": stats["p90"],
        "p99_us": stats["p99"],
        "max_us": stats["max"],
        "mean_us": stats["mean"],
        # Until the controller had taken in rank 0's last report (None: not observable).
        "ingest_calls_per_s": (
            calls / (last_seen - loop_start) if last_seen and last_seen > loop_start else None
        ),
        "fit_s": fit_end - fit_start,
        "cdf_us": common.quantile_curve(samples_us),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer calls")
    parser.add_argument("--calls", type=int, help="timed calls per worker, ours (20000; 5000)")
    parser.add_argument(
        "--ray-calls", type=int, help="timed calls per worker, Ray Train, default poll (20; 10)"
    )
    parser.add_argument(
        "--ray-tuned-calls",
        type=int,
        help="timed calls per worker, Ray Train with --ray-poll-s (500; 200)",
    )
    parser.add_argument(
        "--ray-poll-s",
        type=float,
        default=0.01,
        help="the tuned RAY_TRAIN_HEALTH_CHECK_INTERVAL_S (0 disables the tuned run)",
    )
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=1, help="runs per configuration")
    parser.add_argument("--no-ray-train", action="store_true", help="skip the Ray Train runs")
    args = parser.parse_args(argv)
    calls = args.calls or (5000 if args.quick else 20000)
    ray_calls = args.ray_calls or (10 if args.quick else 20)
    ray_tuned_calls = args.ray_tuned_calls or (200 if args.quick else 500)

    common.setup_paths()
    skip_ray_train = "skipped (--no-ray-train)" if args.no_ray_train else common.ray_train_status()
    common.start_ray(num_cpus=4)
    # (framework, workers, calls, Ray Train poll interval)
    configs: list[tuple[str, int, int, float | None]] = [
        ("ours", 0, calls, None),
        ("ours", args.workers, calls, None),
    ]
    if skip_ray_train is None:
        configs += [
            ("ray_train", 0, calls, None),
            ("ray_train", args.workers, ray_calls, None),
        ]
        if args.ray_poll_s > 0:
            configs.append(("ray_train", args.workers, ray_tuned_calls, args.ray_poll_s))
    runs: list[dict[str, Any]] = []
    try:
        for rep in range(args.repeats):
            # Alternate the order between repeats so drift on the shared machine hits both.
            order = configs if rep % 2 == 0 else list(reversed(configs))
            for framework, workers, n, poll in order:
                print(
                    f"[report] {framework} workers={workers} calls={n} poll={poll} repeat={rep}",
                    flush=True,
                )
                run = run_one(framework, workers, n, args.warmup, poll)
                run["repeat"] = rep
                run["loadavg_1m_after"] = round(os.getloadavg()[0], 2)
                ingest = run["ingest_calls_per_s"]
                print(
                    f"  {run['calls_per_s']:,.1f} calls/s  p50 {run['p50_us']:.1f} us  "
                    f"p99 {run['p99_us']:.1f} us  ingest "
                    f"{'n/a' if ingest is None else f'{ingest:,.1f}/s'}  fit {run['fit_s']:.1f} s",
                    flush=True,
                )
                runs.append(run)
    finally:
        common.stop_ray()
    data = {
        "params": {
            "calls_ours": calls,
            "calls_ray_train_default_poll": ray_calls,
            "calls_ray_train_tuned_poll": ray_tuned_calls,
            "ray_poll_s": args.ray_poll_s,
            "warmup": args.warmup,
            "workers": args.workers,
            "repeats": args.repeats,
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
    """Median over repeats of each (framework, workers) configuration."""
    keys = sorted({(r["framework"], r["num_workers"], r["mode"]) for r in runs})
    keys.sort(key=lambda k: (k[1], k[0] != "ours", k[2]))
    out = []
    for framework, workers, mode in keys:
        group = [
            r
            for r in runs
            if r["framework"] == framework and r["num_workers"] == workers and r["mode"] == mode
        ]
        row: dict[str, Any] = {
            "framework": framework,
            "num_workers": workers,
            "mode": group[0]["mode"],
            "repeats": len(group),
            "calls": group[0]["calls"],
        }
        for key in ("calls_per_s", "p50_us", "p99_us", "max_us", "fit_s"):
            row[key] = common.median([r[key] for r in group])
        ingest = [r["ingest_calls_per_s"] for r in group if r["ingest_calls_per_s"] is not None]
        row["ingest_calls_per_s"] = common.median(ingest) if ingest else None
        row["cdf_us"] = group[0]["cdf_us"]
        out.append(row)
    return out


if __name__ == "__main__":
    main()
