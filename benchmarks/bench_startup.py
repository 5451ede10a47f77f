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

``--layout pods`` measures the first ``fit()`` of a TrainJob on the Ray layout the operator
deploys, emulated with ``ray start`` on this machine: a head with 0 CPUs, one Ray node of
1 CPU per worker (a worker pod), the driver attached. A fresh cluster per fit, left idle for
``--settle`` seconds after its nodes joined (pods start before the driver's ``fit()``).
Variants, alternating: ``ours`` with the worker pods' raylet settings the operator renders
for a torch CPU TrainJob (``trainjob_operator.render.ray.worker_prestart_env``: prestarted
workers with torch imported), ``ours_no_prestart`` (without them: the layout before),
``ours_no_successor`` (the settings, but the driver asks the raylets for no idle processes
for its next worker group: ``TRAINJOB_PRESTART_KEEP_ALIVE_S=0``),
``ray_train`` (Ray Train on the same nodes, same settings). Each cluster then runs a second
``fit()`` of the same driver ``--next-fit-after`` seconds after the first returned (rows
``<variant>_second_fit``), and a third whose first attempt fails after its first report
(``FailureConfig(max_failures=1)``; rows ``<variant>_restart``, figures ``restart_to_*``
after the failure): the driver's later worker groups, whose actors cannot take the
processes the raylets prestarted at their start. Result ``startup_pods``.

Usage::

    python benchmarks/bench_startup.py [--quick] [--repeats N] [--workers 2]
    python benchmarks/bench_startup.py --layout pods [--quick] [--repeats N] [--settle 10]
        [--next-fit-after 5]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import common

NAME = "startup"
PODS_NAME = "startup_pods"
FRAMEWORKS = ("ours", "ray_train")
#: ``--layout pods`` variants: (name, framework, the worker nodes get the rendered settings,
#: the driver's environment for the fits).
POD_VARIANTS: tuple[tuple[str, str, bool, dict[str, str]], ...] = (
    ("ours", "ours", True, {}),
    ("ours_no_successor", "ours", True, {"TRAINJOB_PRESTART_KEEP_ALIVE_S": "0"}),
    ("ours_no_prestart", "ours", False, {}),
    ("ray_train", "ray_train", True, {}),
)
POD_GCS_PORT = 6391


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
    marker = Path(config["out_dir"], "failed_at") if config.get("fail_once") else None
    restarted = marker is None or marker.exists()  # checked before DDP syncs the ranks
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
    if not restarted:  # the first attempt: rank 0 fails after its first report
        if rank == 0:
            assert marker is not None
            marker.write_text(json.dumps(time.time()))
            raise RuntimeError("bench_startup: the planned failure of the first attempt")
        return
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
    failures = 1 if config.get("fail_once") else 0
    if framework == "ours":
        from trainer_runtime import FailureConfig, RunConfig, ScalingConfig
        from trainer_runtime.torch import TorchTrainer

        return TorchTrainer(
            startup_loop,
            train_loop_config=config,
            scaling_config=ScalingConfig(num_workers=workers),
            run_config=RunConfig(
                name=name,
                storage_path=str(storage),
                failure_config=FailureConfig(max_failures=failures),
            ),
        )
    import ray.train
    import ray.train.torch

    return ray.train.torch.TorchTrainer(
        startup_loop,
        train_loop_config=config,
        scaling_config=ray.train.ScalingConfig(num_workers=workers),
        run_config=ray.train.RunConfig(
            name=name,
            storage_path=str(storage),
            failure_config=ray.train.FailureConfig(max_failures=failures),
        ),
    )


def worker_pod_env(workers: int) -> dict[str, str]:
    """The raylet settings the operator renders into the worker pods of a torch CPU TrainJob
    with ``workers`` workers of 1 CPU (the prestart variables only)."""
    from trainjob_operator.api import parse_trainjob
    from trainjob_operator.render import render_worker_pods
    from trainjob_operator.render.ray import WORKER_PRESTART_ENV_NAMES

    job = parse_trainjob(
        {
            "apiVersion": "trainjob.dev/v1alpha1",
            "kind": "TrainJob",
            "metadata": {"name": "bench", "namespace": "default"},
            "spec": {
                "framework": "torch",
                "entrypoint": "bench:train",
                "scaling": {"numWorkers": workers, "resourcesPerWorker": {"cpu": 1}},
            },
        }
    )
    [container] = render_worker_pods(job, uid="bench")[0]["spec"]["containers"]
    return {
        e["name"]: e["value"] for e in container["env"] if e["name"] in WORKER_PRESTART_ENV_NAMES
    }


def _ray_cli(*args: str, env: dict[str, str] | None = None) -> None:
    ray_bin = Path(sys.executable).with_name("ray")
    subprocess.run([str(ray_bin), *args], check=True, capture_output=True, env=env)


def _idle_workers() -> int:
    """Ray worker processes waiting for work on this machine (process title ``ray::IDLE``)."""
    from trainjob_operator.launcher.ray_node import cmdline

    return sum(
        1
        for entry in os.scandir("/proc")
        if entry.name.isdigit() and " ".join(cmdline(int(entry.name))).startswith("ray::IDLE")
    )


def start_pod_layout(workers: int, env: dict[str, str], settle_s: float) -> int:
    """A fresh emulated operator layout (head 0 CPU, ``workers`` nodes of 1 CPU with ``env``),
    this process attached as the driver; returns the idle Ray workers after ``settle_s``."""
    import ray

    common.setup_paths()
    _ray_cli("stop", "--force")
    head = f"127.0.0.1:{POD_GCS_PORT}"
    _ray_cli(
        "start", "--head", "--num-cpus=0", f"--port={POD_GCS_PORT}",
        "--include-dashboard=false", "--disable-usage-stats",
    )  # fmt: skip
    node_env = {**os.environ, **env}
    for _ in range(workers):
        _ray_cli(
            "start", f"--address={head}", "--num-cpus=1", "--disable-usage-stats", env=node_env
        )
    ray.init(address=head, log_to_driver=False, configure_logging=False)
    deadline = time.monotonic() + 60
    while sum(1 for n in ray.nodes() if n["Alive"]) < workers + 1:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{workers} worker nodes did not join within 60 s")
        time.sleep(0.2)
    time.sleep(settle_s)
    return _idle_workers()


def stop_pod_layout() -> None:
    """Detach and stop every Ray process of the emulated layout."""
    import ray

    if ray.is_initialized():
        ray.shutdown()
    _ray_cli("stop", "--force")


def run_one(framework: str, workers: int, fail_once: bool = False) -> dict[str, Any]:
    """One ``fit()`` under ``framework``; times relative to the ``fit()`` call. ``fail_once``:
    rank 0 fails after the first attempt's first report (``FailureConfig(max_failures=1)``),
    and the figures ``restart_to_*`` are the second attempt's, after that failure."""
    out_dir = common.scratch_dir("startup-out")
    storage = common.scratch_dir("startup-storage")
    failed_at = None
    try:
        config = {"framework": framework, "out_dir": str(out_dir), "fail_once": fail_once}
        trainer = _trainer(framework, workers, config, storage)
        fit_start = time.time()
        trainer.fit()
        fit_end = time.time()
        ranks = [json.loads(p.read_text()) for p in sorted(out_dir.glob("rank_*.json"))]
        if fail_once:
            failed_at = json.loads((out_dir / "failed_at").read_text())
    finally:
        common.rmtree(out_dir)
        common.rmtree(storage)
    if len(ranks) != workers:
        raise RuntimeError(f"{framework}: expected {workers} rank files, got {len(ranks)}")

    def latest(key: str) -> float:
        return max(r[key] for r in ranks) - fit_start

    restart = {}
    if failed_at is not None:
        restart = {
            f"restart_{key}": max(r[name] for r in ranks) - failed_at
            for key, name in (("to_entered_s", "entered"), ("to_first_step_s", "first_step"))
        }
    return {
        **restart,
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


#: Figures of a ``fail_once`` fit: seconds after the first attempt's failure.
RESTART_KEYS = ("restart_to_entered_s", "restart_to_first_step_s")


def summarize(runs: list[dict[str, Any]], by: str = "framework") -> list[dict[str, Any]]:
    """Median, min and max of every figure per framework (or per ``by``: ``variant``)."""
    out = []
    for name in dict.fromkeys(r[by] for r in runs):
        group = [r for r in runs if r[by] == name]
        row: dict[str, Any] = {by: name, "framework": group[0]["framework"], "repeats": len(group)}
        restart = [k for k in RESTART_KEYS if all(k in r for r in group)]
        for key in (*KEYS, *restart):
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
    parser.add_argument(
        "--layout",
        choices=("local", "pods"),
        default="local",
        help="local: one local Ray cluster for every fit (default); pods: the operator's "
        "layout, a fresh cluster per fit",
    )
    parser.add_argument(
        "--settle", type=float, default=10.0, help="pods: idle seconds before each fit (10)"
    )
    parser.add_argument(
        "--next-fit-after",
        type=float,
        default=5.0,
        help="pods: seconds between a cluster's first fit's return and its second fit (5)",
    )
    args = parser.parse_args(argv)
    repeats = args.repeats or (3 if args.quick else 7)
    if args.layout == "pods":
        return main_pods(args, repeats)

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


def main_pods(args: argparse.Namespace, repeats: int) -> dict[str, Any]:
    """``--layout pods``: the first fit of a fresh emulated operator layout, per variant."""
    common.setup_paths()
    skip_ray_train = "skipped (--no-ray-train)" if args.no_ray_train else common.ray_train_status()
    variants = [v for v in POD_VARIANTS if not (skip_ray_train and v[1] == "ray_train")]
    rendered = worker_pod_env(args.workers)
    runs: list[dict[str, Any]] = []
    try:
        for rep in range(repeats):
            order = variants if rep % 2 == 0 else list(reversed(variants))
            for variant, framework, prestart, driver_env in order:
                idle = start_pod_layout(args.workers, rendered if prestart else {}, args.settle)
                fits = []
                idles = [idle]
                try:
                    with mock.patch.dict(os.environ, driver_env):
                        fits.append(run_one(framework, args.workers))
                        for fail_once in (False, True):  # the next fit, then one that restarts
                            time.sleep(args.next_fit_after)
                            idles.append(_idle_workers())
                            fits.append(run_one(framework, args.workers, fail_once=fail_once))
                finally:
                    stop_pod_layout()
                suffixes = ("", "_second_fit", "_restart")
                for index, (run, idle_now) in enumerate(zip(fits, idles, strict=True), start=1):
                    run.update(
                        variant=variant,
                        fit=index,
                        row=variant + suffixes[index - 1],
                        repeat=rep,
                        idle_workers_before_fit=idle_now,
                    )
                    after_failure = (
                        f", after the failure: first step {run['restart_to_first_step_s']:.2f} s"
                        if "restart_to_first_step_s" in run
                        else ""
                    )
                    print(
                        f"[startup pods] {variant} #{rep} fit {index}: {idle_now} idle workers, "
                        f"entered {run['to_entered_s']:.2f} s, first step "
                        f"{run['to_first_step_s']:.2f} s, fit {run['fit_s']:.2f} s{after_failure}",
                        flush=True,
                    )
                    runs.append(run)
    finally:
        stop_pod_layout()
    data = {
        "params": {
            "workers": args.workers,
            "repeats": repeats,
            "quick": args.quick,
            "settle_s": args.settle,
            "next_fit_after_s": args.next_fit_after,
            "worker_node_env": rendered,
        },
        "ray_train": skip_ray_train or "measured",
        "runs": runs,
        "summary": summarize(runs, by="row"),
    }
    common.write_result(PODS_NAME, data)
    return data


if __name__ == "__main__":
    main()
