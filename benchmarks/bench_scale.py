"""Many ranks: report rounds/s, the last report() -> commit, fit() -> first step; ours vs Ray Train.

The same train function runs under ``trainer_runtime.DataParallelTrainer`` and Ray Train
2.60's ``DataParallelTrainer`` (V2) at 2, 8, 32 and 64 ranks. The workers are lightweight:
no torch, no compute, each asks for ``--cpu-per-worker`` (0.01) logical CPUs, so 64 actors
fit on the one Ray node (``ray.init(num_cpus=4)``) of this 2-core machine. Each rank:

1. records when it entered the train function (``fit()`` -> first step: the function does no
   compute, so its first step is its start);
2. one untimed metrics-only ``report()``, then ``rounds`` timed metrics-only ``report()``
   calls (phase ``rounds``);
3. ``checkpoints`` reports, each with a small checkpoint (one ``--ckpt-kib`` KiB file per
   rank, ``shard_<rank>.bin``, in one ``checkpoint_dir_name`` per round), ``--gap-s`` apart,
   recording when it called ``report()`` (phase ``commit``).

A ``UserCallback`` (both frameworks have Ray Train's ``after_report``: ours runs it in the
driver, Ray Train in its controller actor) appends each completed round's time and whether
it carried a checkpoint to a file. Figures per fit:

* ``to_first_step_s``: the latest rank's entry into the train function - the ``fit()`` call;
* ``rounds_per_s``: timed rounds / (the controller completed the last one - the earliest
  rank's loop start): the rate at which whole rounds (every rank's report) are taken in;
* ``commit_ms``: per checkpoint round, its ``after_report`` (committed) - the latest rank's
  ``report()`` call; p50 and max over the rounds.

Ray Train's controller polls its workers every ``RAY_TRAIN_HEALTH_CHECK_INTERVAL_S`` (2 s by
default), so it is run with the default and with ``--ray-poll-s`` (0.01 s). Its preemption
watcher is off (``RAY_TRAIN_ENABLE_PREEMPTION_WATCHER=0``: one more actor polling the GCS, as
tests/compat does); ours asks for no idle processes for a next group
(``TRAINJOB_PRESTART_KEEP_ALIVE_S=0``), so no fit starts in processes a previous one left.

Usage::

    python benchmarks/bench_scale.py [--quick] [--sizes 2,8,32,64] [--no-ray-train]
    python benchmarks/bench_scale.py --sizes 64 --merge  # one size, into the stored result
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import common

NAME = "scale"
POLL_ENV = "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"
#: What the runs set for their whole duration (see the module docstring).
BENCH_ENV = {"RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0", "TRAINJOB_PRESTART_KEEP_ALIVE_S": "0"}


def scale_loop(config: dict[str, Any]) -> None:
    """The measured train function (every rank, either framework)."""
    entered = time.time()
    if config["framework"] == "ours":
        import trainer_runtime as api
    else:
        import ray.train as api  # type: ignore[no-redef]

    rank = api.get_context().get_world_rank()
    api.report({"phase": "warmup", "i": -1})
    started = time.time()
    for i in range(config["rounds"]):
        api.report({"phase": "rounds", "i": i})
    loop_end = time.time()
    calls = []
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
        payload = os.urandom(config["ckpt_bytes"])
        for i in range(config["checkpoints"]):
            time.sleep(config["gap_s"])
            folder = Path(tmp, f"c{i}")
            folder.mkdir()
            (folder / f"shard_{rank}.bin").write_bytes(payload)
            calls.append(time.time())
            api.report(
                {"phase": "commit", "i": i},
                checkpoint=api.Checkpoint.from_directory(str(folder)),
                checkpoint_dir_name=f"ckpt_{i:04d}",
            )
    out = {
        "rank": rank,
        "entered": entered,
        "started": started,
        "loop_end": loop_end,
        "calls": calls,
    }
    Path(config["out_dir"], f"rank_{rank}.json").write_text(json.dumps(out))


def _callback(framework: str, path: str) -> Any:
    """A ``UserCallback`` appending ``<time> <phase> <has checkpoint>`` per round to ``path``."""
    if framework == "ours":
        from trainer_runtime import UserCallback
    else:
        from ray.train import UserCallback  # type: ignore[assignment]

    class _Rounds(UserCallback):
        def after_report(self, run_context: Any, metrics: Any, checkpoint: Any) -> None:
            now = time.time()
            with open(path, "a") as f:
                f.write(f"{now!r} {metrics[0]['phase']} {int(checkpoint is not None)}\n")

    return _Rounds()


def _trainer(framework: str, workers: int, config: dict[str, Any], callback: Any) -> Any:
    name = f"scale-{framework}-{workers}w-{int(time.time() * 1000)}"
    resources = {"CPU": config["cpu_per_worker"]}
    if framework == "ours":
        from trainer_runtime import DataParallelTrainer, RunConfig, ScalingConfig

        return DataParallelTrainer(
            scale_loop,
            train_loop_config=config,
            scaling_config=ScalingConfig(num_workers=workers, resources_per_worker=resources),
            run_config=RunConfig(name=name, storage_path=config["storage"], callbacks=[callback]),
        )
    import ray.train
    from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer as RayDPTrainer

    return RayDPTrainer(
        scale_loop,
        train_loop_config=config,
        scaling_config=ray.train.ScalingConfig(num_workers=workers, resources_per_worker=resources),
        run_config=ray.train.RunConfig(
            name=name, storage_path=config["storage"], callbacks=[callback]
        ),
    )


def run_one(
    framework: str,
    workers: int,
    rounds: int,
    checkpoints: int,
    *,
    ckpt_kib: int,
    gap_s: float,
    cpu_per_worker: float,
    ray_poll_s: float | None = None,
) -> dict[str, Any]:
    """One ``fit()`` under ``framework`` with ``workers`` ranks; its figures."""
    out_dir = common.scratch_dir("scale-out")
    storage = common.scratch_dir("scale-storage")
    rounds_file = out_dir / "rounds.txt"
    config = {
        "framework": framework,
        "rounds": rounds,
        "checkpoints": checkpoints,
        "ckpt_bytes": ckpt_kib * 1024,
        "gap_s": gap_s,
        "cpu_per_worker": cpu_per_worker,
        "out_dir": str(out_dir),
        "storage": str(storage),
    }
    old_poll = os.environ.pop(POLL_ENV, None)
    if ray_poll_s is not None:
        os.environ[POLL_ENV] = repr(ray_poll_s)
    memory = _MemoryWatch()
    try:
        trainer = _trainer(framework, workers, config, _callback(framework, str(rounds_file)))
        fit_start = time.time()
        trainer.fit()
        fit_s = time.time() - fit_start
        ranks = [json.loads(p.read_text()) for p in sorted(out_dir.glob("rank_*.json"))]
        done = [line.split() for line in rounds_file.read_text().splitlines()]
    finally:
        memory.stop()
        os.environ.pop(POLL_ENV, None)
        if old_poll is not None:
            os.environ[POLL_ENV] = old_poll
        common.rmtree(out_dir)
        common.rmtree(storage)
    if len(ranks) != workers:
        raise RuntimeError(f"{framework}: expected {workers} rank files, got {len(ranks)}")
    timed = [float(t) for t, phase, _ in done if phase == "rounds"]
    commits = [float(t) for t, phase, ckpt in done if phase == "commit" and ckpt == "1"]
    if len(timed) != rounds or len(commits) != checkpoints:
        raise RuntimeError(
            f"{framework}: {len(timed)}/{rounds} rounds and {len(commits)}/{checkpoints} "
            "commits seen by the callback"
        )
    loop_start = min(r["started"] for r in ranks)
    last_calls = [max(r["calls"][i] for r in ranks) for i in range(checkpoints)]
    commit_ms = [1000 * (c - call) for c, call in zip(commits, last_calls, strict=True)]
    mode = f"{workers} ranks"
    if framework == "ray_train":
        mode += f", poll {ray_poll_s:g} s" if ray_poll_s is not None else ", poll 2 s (default)"
    return {
        "framework": framework,
        "workers": workers,
        "ray_poll_s": ray_poll_s,
        "mode": mode,
        "rounds": rounds,
        "checkpoints": checkpoints,
        "to_first_step_s": max(r["entered"] for r in ranks) - fit_start,
        "rounds_per_s": rounds / (max(timed) - loop_start),
        "commit_ms": commit_ms,
        "commit_ms_p50": common.median(commit_ms),
        "commit_ms_max": max(commit_ms),
        "fit_s": fit_s,
        "mem_available_min_gib": memory.lowest,
    }


def _parse_sizes(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    parser.add_argument("--sizes", type=_parse_sizes, default=[2, 8, 32, 64])
    parser.add_argument("--rounds", type=int, help="timed rounds, ours (500; 200)")
    parser.add_argument(
        "--ray-rounds", type=int, help="timed rounds, Ray Train, default poll (5; 3)"
    )
    parser.add_argument(
        "--ray-tuned-rounds", type=int, help="timed rounds, Ray Train, --ray-poll-s (100; 50)"
    )
    parser.add_argument("--checkpoints", type=int, default=5, help="checkpoint rounds per fit")
    parser.add_argument("--ckpt-kib", type=int, default=4, help="KiB each rank stores per round")
    parser.add_argument("--gap-s", type=float, default=0.25, help="pause before each checkpoint")
    parser.add_argument("--cpu-per-worker", type=float, default=0.01)
    parser.add_argument("--num-cpus", type=int, default=4, help="the Ray node's logical CPUs")
    parser.add_argument(
        "--ray-poll-s",
        type=float,
        default=0.01,
        help="the tuned RAY_TRAIN_HEALTH_CHECK_INTERVAL_S (0 disables the tuned runs)",
    )
    parser.add_argument(
        "--min-available-gib",
        type=float,
        default=4.0,
        help="skip a fit when the machine has less memory available than this",
    )
    parser.add_argument(
        "--merge",
        action="store_true",
        help="keep the stored result's runs of other sizes (measure the sizes one at a time)",
    )
    parser.add_argument("--no-ray-train", action="store_true", help="skip the Ray Train runs")
    parser.add_argument(
        "--frameworks", default="ours,ray_train,ray_train_tuned", help="which configurations"
    )
    args = parser.parse_args(argv)
    rounds = args.rounds or (200 if args.quick else 500)
    ray_rounds = args.ray_rounds or (3 if args.quick else 5)
    ray_tuned_rounds = args.ray_tuned_rounds or (50 if args.quick else 100)
    common.setup_paths()
    os.environ.update(BENCH_ENV)
    skip_ray_train = "skipped (--no-ray-train)" if args.no_ray_train else common.ray_train_status()
    wanted = set(args.frameworks.split(","))
    # (framework, poll, rounds)
    configs: list[tuple[str, float | None, int]] = []
    if "ours" in wanted:
        configs.append(("ours", None, rounds))
    if skip_ray_train is None:
        if "ray_train" in wanted:
            configs.append(("ray_train", None, ray_rounds))
        if "ray_train_tuned" in wanted and args.ray_poll_s > 0:
            configs.append(("ray_train", args.ray_poll_s, ray_tuned_rounds))
    common.start_ray(num_cpus=args.num_cpus)
    runs: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []
    try:
        for workers in args.sizes:
            for framework, poll, n in configs:
                print(f"[scale] {framework} ranks={workers} rounds={n} poll={poll}", flush=True)
                available = _mem_available_gib()
                if available is not None and available < args.min_available_gib:
                    why = (
                        f"skipped: {available} GiB available before the fit, under "
                        f"--min-available-gib {args.min_available_gib:g}"
                    )
                    print(f"  {why}", flush=True)
                    skipped.append({"framework": framework, "workers": workers, "why": why})
                    continue
                run = run_one(
                    framework,
                    workers,
                    n,
                    args.checkpoints,
                    ckpt_kib=args.ckpt_kib,
                    gap_s=args.gap_s,
                    cpu_per_worker=args.cpu_per_worker,
                    ray_poll_s=poll,
                )
                run["loadavg_1m_after"] = round(os.getloadavg()[0], 2)
                run["mem_available_gib_after"] = _mem_available_gib()
                print(
                    f"  first step {run['to_first_step_s']:.2f} s  "
                    f"{run['rounds_per_s']:,.1f} rounds/s  commit p50 "
                    f"{run['commit_ms_p50']:.1f} ms max {run['commit_ms_max']:.1f} ms  "
                    f"fit {run['fit_s']:.1f} s  load {run['loadavg_1m_after']}  "
                    f"available {run['mem_available_gib_after']} GiB "
                    f"(lowest during the fit {run['mem_available_min_gib']} GiB)",
                    flush=True,
                )
                runs.append(run)
    finally:
        common.stop_ray()
    extra: dict[str, Any] = {}
    if args.merge:
        # Keep the stored runs of the sizes not measured now (one size per invocation).
        stored = common.read_result(NAME) or {}
        if stored.get("command"):  # every invocation that measured the stored runs
            this = " ".join(["python", *sys.argv])
            extra["command"] = f"{stored['command']}; {this}"
        runs = [r for r in stored.get("runs", []) if r["workers"] not in args.sizes] + runs
        skipped = [s for s in stored.get("skipped", []) if s["workers"] not in args.sizes] + skipped
        runs.sort(key=lambda r: (r["workers"], r["framework"] != "ours", r["ray_poll_s"] or 0))
    data = {
        "params": {
            "sizes": sorted({r["workers"] for r in runs}),
            "rounds_ours": rounds,
            "rounds_ray_train_default_poll": ray_rounds,
            "rounds_ray_train_tuned_poll": ray_tuned_rounds,
            "ray_poll_s": args.ray_poll_s,
            "checkpoints": args.checkpoints,
            "ckpt_kib": args.ckpt_kib,
            "gap_s": args.gap_s,
            "cpu_per_worker": args.cpu_per_worker,
            "ray_num_cpus": args.num_cpus,
            "env": BENCH_ENV,
            "min_available_gib": args.min_available_gib,
            "quick": args.quick,
        },
        "ray_train": skip_ray_train or "measured",
        "runs": runs,
        "skipped": skipped,
        **extra,
    }
    common.write_result(NAME, data)
    return data


class _MemoryWatch:
    """The machine's lowest ``MemAvailable`` (GiB) while a fit runs, sampled every 0.5 s."""

    def __init__(self) -> None:
        self.lowest: float | None = _mem_available_gib()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="memory-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            now = _mem_available_gib()
            if now is not None and (self.lowest is None or now < self.lowest):
                self.lowest = now

    def stop(self) -> None:
        """Stop sampling."""
        self._stop.set()
        self._thread.join()


def _mem_available_gib() -> float | None:
    """``MemAvailable`` of /proc/meminfo in GiB (the machine's headroom after a fit)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except (OSError, ValueError, IndexError):
        return None
    return None


if __name__ == "__main__":
    main()
