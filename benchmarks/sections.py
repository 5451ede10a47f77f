"""Markdown sections and plots of ``docs/benchmarks.md`` for the validation, start-up, local
mode and operator benchmarks (``run_all.py`` renders the report() and checkpoint sections),
plus the table and number formatting every section shares.

Each ``render_*`` function takes a stored result (``benchmarks/results/<name>.json``) and
returns ``(markdown, headline rows)``; a headline row is ``[figure, trainer_runtime, Ray Train,
ratio]`` for the summary table at the top of the document. Each ``plot_*`` function writes PNGs
into the image folder.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks import common

LABEL = {"ours": "trainer_runtime", "ray_train": "Ray Train", "plain": "plain Python loop"}


# -- formatting -------------------------------------------------------------------------------
def f(value: float | None, digits: int = 1) -> str:
    """A number for a table ('n/a' for None/nan)."""
    return common.fmt(value, digits)


def ratio(ours: float | None, theirs: float | None, digits: int | None = None) -> str:
    """``ours / theirs`` as ``1.23x`` (3 significant digits unless ``digits`` is given)."""
    if not ours or not theirs:
        return "n/a"
    r = ours / theirs
    if digits is None:
        digits = 0 if r >= 100 else 1 if r >= 10 else 2
    return f"{r:,.{digits}f}x"


def table(header: list[str], rows: list[list[str]]) -> str:
    """A GitHub-flavoured markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


# -- 3. validation ----------------------------------------------------------------------------
def _val_fits(data: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per configuration (median over repeats of the figures)."""
    modes: list[str] = []
    for fit in data["fits"]:
        if fit["mode"] not in modes:
            modes.append(fit["mode"])
    out = []
    keys = (
        "start_latency_first_s",
        "start_latency_p50_s",
        "start_latency_max_s",
        "to_registered_p50_s",
        "registered_to_start_p50_s",
        "report_ms_p50",
        "baseline_steps_per_s",
        "during_validation_steps_per_s",
        "outside_validation_steps_per_s",
        "during_vs_outside",
        "phase_vs_baseline",
        "fit_s",
    )
    for mode in modes:
        group = [x for x in data["fits"] if x["mode"] == mode]
        row: dict[str, Any] = {
            "mode": mode,
            "framework": group[0]["framework"],
            "ray_poll_s": group[0]["ray_poll_s"],
            "validated": sum(x["validated"] for x in group),
            "checkpoints": sum(x["checkpoints"] for x in group),
        }
        for key in keys:
            vals = [x[key] for x in group if x.get(key) is not None]
            row[key] = common.median(vals) if vals else None
        out.append(row)
    return out


def render_validation(data: dict[str, Any], img_rel: str) -> tuple[str, list[list[str]]]:
    """Section 3 and its headline rows."""
    p = data["params"]
    rows = _val_fits(data)
    body = [
        [
            r["mode"],
            f"{r['validated']}/{r['checkpoints']}",
            f(r["start_latency_first_s"], 3),
            f(r["start_latency_p50_s"], 3),
            f(r["start_latency_max_s"], 3),
            f(r["to_registered_p50_s"], 3),
            f(r["registered_to_start_p50_s"], 3),
            f(r["report_ms_p50"], 1),
            f(r["during_validation_steps_per_s"], 2),
            f(r["outside_validation_steps_per_s"], 2),
            f(r["during_vs_outside"], 3),
            f(r["phase_vs_baseline"], 3),
            f(r["fit_s"], 1),
        ]
        for r in rows
    ]
    ours = next((r for r in rows if r["framework"] == "ours"), None)
    ray_default = next(
        (r for r in rows if r["framework"] == "ray_train" and not r["ray_poll_s"]), None
    )
    ray_tuned = next((r for r in rows if r["framework"] == "ray_train" and r["ray_poll_s"]), None)
    ratio_rows = []
    headline: list[list[str]] = []
    for name, theirs in (
        ("Ray Train, default poll (2 s)", ray_default),
        (f"Ray Train, poll {p['ray_poll_s']:g} s", ray_tuned),
    ):
        if ours is None or theirs is None:
            continue
        ratio_rows.append(
            [
                f"vs {name}",
                ratio(theirs["start_latency_p50_s"], ours["start_latency_p50_s"]),
                ratio(theirs["start_latency_first_s"], ours["start_latency_first_s"]),
                ratio(theirs["report_ms_p50"], ours["report_ms_p50"]),
                ratio(ours["during_vs_outside"], theirs["during_vs_outside"], 3),
                ratio(ours["phase_vs_baseline"], theirs["phase_vs_baseline"], 3),
            ]
        )
        headline.append(
            [
                f"`report()` -> validation start, p50 ({name})",
                f"{f(ours['start_latency_p50_s'], 3)} s",
                f"{f(theirs['start_latency_p50_s'], 3)} s",
                ratio(theirs["start_latency_p50_s"], ours["start_latency_p50_s"]) + " faster",
            ]
        )
    if ours is not None and ray_default is not None:
        headline.append(
            [
                "training steps/s while a validation runs, relative to the other steps",
                f(ours["during_vs_outside"], 3),
                f(ray_default["during_vs_outside"], 3),
                ratio(ours["during_vs_outside"], ray_default["during_vs_outside"], 3),
            ]
        )
    tuned_note = ""
    if ray_tuned and (ray_tuned["registered_to_start_p50_s"] or 0) > 0.5:
        tuned_note = (
            f" With a {p['ray_poll_s']:g} s poll Ray Train took the checkpoint in after "
            f"{f(ray_tuned['to_registered_p50_s'], 3)} s (p50), but its validation still "
            f"started {f(ray_tuned['registered_to_start_p50_s'], 2)} s after that; we did not "
            "trace where that time goes."
        )
    work = (
        "waits (`time.sleep`) for the rest of"
        if p["val_work"] == "sleep"
        else "runs matmuls (1 thread) for the rest of"
    )
    main_table = table(
        [
            "configuration",
            "validated",
            "first start s",
            "start p50 s",
            "start max s",
            "registered p50 s",
            "then p50 s",
            "report p50 ms",
            "steps/s during",
            "steps/s outside",
            "during/outside",
            "phase/baseline",
            "fit s",
        ],
        body,
    )
    ratio_table = table(
        [
            "comparison",
            "start latency p50",
            "first start",
            "report p50",
            "during/outside",
            "phase/baseline",
        ],
        ratio_rows,
    )
    text = f"""## 3. Validation during training

`benchmarks/bench_validation.py`: {p["workers"]} Ray workers (`TorchTrainer`, gloo), a Ray
cluster of 4 CPUs and the custom resource `{{"validation": 1}}`. Each step is {p["step_s"]:g} s
of compute ({p["matmul_n"]}x{p["matmul_n"]} matmuls, 1 torch thread, calibrated once); after
{p["baseline_steps"]} baseline steps, every {p["every"]} steps (**{p["interval_s"]:g} s**) rank 0
writes a {p["size_mib"]} MiB checkpoint and reports it with validation ({p["checkpoints"]}
checkpoints per `fit()`, {p["upload_mode"]} upload to local storage, both frameworks' default).
The validation function reads the whole committed checkpoint, then {work} {p["val_s"]:g} s.

* trainer_runtime: `report(..., checkpoint=c, validate_fn=fn, validate_config=cfg)`; the task
  asks for `{{"validation": 1}}` and no CPU (`ValidationConfig` defaults), at most 1 at a time;
* Ray Train 2.60: `TorchTrainer(..., validation_config=ValidationConfig(fn,
  task_config=ValidationTaskConfig(fn_kwargs=cfg), ray_remote_kwargs={{"num_cpus": 0,
  "resources": {{"validation": 1}}}}))` and `ray.train.report(..., checkpoint=c,
  validation=True)`; Ray Train runs at most 1 validation at a time (`MAX_IN_FLIGHT_VALIDATIONS`).
  Its controller starts validations when it polls the workers, every
  `RAY_TRAIN_HEALTH_CHECK_INTERVAL_S` (2 s by default; also run with {p["ray_poll_s"]:g} s).

Columns: **first / p50 / max start s**: from rank 0 calling `report()` to the first line of
the validation function (wall clock, same machine); the first validation of a `fit()` waits
for a new Ray worker process in both frameworks, so it is shown apart and p50/max are over the
others. **registered**: `report()` -> the controller took the checkpoint in (ours: a driver
`Callback.on_checkpoint` after the commit; Ray Train: a `UserCallback.after_report` in its
controller); **then**: -> validation start. **report ms**: time in rank 0's `report()` with a
checkpoint. **steps/s during / outside**: rank 0's steps per second of step time for steps that
ran while a validation ran vs the other steps (after the first validation ended);
**during/outside**: 1.0 means validation costs training nothing. **phase/baseline**: steps per
wall second over the whole checkpoint phase (checkpoint writes and `report()` included) over the
baseline phase's.

{main_table}

Ratios, trainer_runtime over Ray Train, same run (latencies: Ray Train's / ours; higher is
better for trainer_runtime everywhere):

{ratio_table}

![validation start latency]({img_rel}/validation_latency.png)

![training throughput around validations]({img_rel}/validation_throughput.png)

Why: trainer_runtime's controller commits a checkpoint as soon as every rank's report and
files are in, and its dispatcher thread launches the validation task right after the commit.
Ray Train's controller only takes reports in, and starts queued validations, when it polls
the workers (`after_controller_state_update` of its `ValidationManager`), so its latency
follows the poll interval.{tuned_note}
"""
    return text, headline


def plot_validation(data: dict[str, Any], out: Path) -> None:
    """validation_latency.png and validation_throughput.png."""
    plt = _plt()
    rows = _val_fits(data)
    names = [r["mode"].replace(", poll", "\npoll") for r in rows]
    xs = list(range(len(rows)))
    fig, ax = plt.subplots(figsize=(8, 4.5))
    width = 0.38
    first = [r["start_latency_first_s"] or 0.0 for r in rows]
    p50 = [r["start_latency_p50_s"] or 0.0 for r in rows]
    ax.bar([x - width / 2 for x in xs], p50, width, label="p50 (after the first)")
    ax.bar([x + width / 2 for x in xs], first, width, label="first (new worker process)")
    for x, v in zip(xs, p50, strict=True):
        ax.text(x - width / 2, v, f"{v:.3g}", ha="center", va="bottom", fontsize=7)
    for x, v in zip(xs, first, strict=True):
        ax.text(x + width / 2, v, f"{v:.3g}", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(xs)
    ax.set_xticklabels(names, fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("seconds (log)")
    ax.set_title("report() -> validation start")
    ax.grid(True, axis="y", which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "validation_latency.png", dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(8, 4.5))
    width = 0.27
    series = (
        ("baseline phase (wall)", "baseline_steps_per_s"),
        ("steps during a validation", "during_validation_steps_per_s"),
        ("other steps", "outside_validation_steps_per_s"),
    )
    for j, (label, key) in enumerate(series):
        vals = [r[key] or 0.0 for r in rows]
        ax.bar([x + (j - 1) * width for x in xs], vals, width, label=label)
    ax.set_xticks(xs)
    ax.set_xticklabels(names, fontsize=8)
    ax.set_ylabel("training steps per second (rank 0)")
    ax.set_title("Training throughput around validations")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "validation_throughput.png", dpi=110)
    plt.close(fig)


# -- 4. start-up ------------------------------------------------------------------------------
START_KEYS = (
    ("to_entered_s", "fit() -> train function entered"),
    ("to_prepared_s", "-> prepare_model done (DDP)"),
    ("to_first_step_s", "-> first step done"),
    ("to_first_report_s", "-> first report() returned"),
    ("fit_s", "whole fit()"),
    ("teardown_s", "last report() -> fit() returned"),
)


def render_startup(data: dict[str, Any], img_rel: str) -> tuple[str, list[list[str]]]:
    """Section 4 and its headline rows."""
    p = data["params"]
    by_fw = {r["framework"]: r for r in data["summary"]}
    ours, ray = by_fw.get("ours"), by_fw.get("ray_train")
    rows = []
    for key, label in START_KEYS:
        row = [label]
        for r in (ours, ray):
            row.append(
                "n/a"
                if r is None
                else f"{r[key]:.2f} ({r[key + '_min']:.2f}-{r[key + '_max']:.2f})"
            )
        row.append(ratio(ray[key], ours[key]) if ours and ray else "n/a")
        rows.append(row)
    headline = []
    if ours and ray:
        headline.append(
            [
                f"`fit()` -> first training step, {p['workers']} workers (median)",
                f"{ours['to_first_step_s']:.2f} s",
                f"{ray['to_first_step_s']:.2f} s",
                ratio(ray["to_first_step_s"], ours["to_first_step_s"]) + " faster",
            ]
        )
    text = f"""## 4. Start-up: `fit()` to the first step

`benchmarks/bench_startup.py`: the same train function under both `TorchTrainer`s with
{p["workers"]} workers (gloo) on a Ray cluster that is already up (`ray.init(num_cpus=4)` once;
it is the same for both). The function records wall-clock times; the figures are seconds after
`fit()` was called, the latest rank. One untimed `fit()` per framework first, then
{p["repeats"]} timed fits each, alternating; median (min-max).

{table(["seconds", "trainer_runtime", "Ray Train", "Ray Train / ours"], rows)}

![start-up]({img_rel}/startup.png)

Both reserve a placement group, start one actor per worker and set up the gloo process group
before calling the function; Ray Train first starts a controller actor that then drives its
worker group. Ray Train's tear-down (the last row) can include its PlacementGroupCleaner
timing out in this sandbox (see Notes).

{STARTUP_WHERE_THE_TIME_GOES}
"""
    return text, headline


POD_VARIANT_LABEL = {
    "ours": "trainer_runtime, worker pods as rendered (prestarted workers, torch imported)",
    "ours_no_successor": "trainer_runtime, as rendered, but no idle processes asked for the "
    "next worker group (`TRAINJOB_PRESTART_KEEP_ALIVE_S=0`)",
    "ours_no_prestart": "trainer_runtime, worker pods without the prestart settings (before)",
    "ray_train": "Ray Train, worker pods as rendered",
}


def render_startup_pods(data: dict[str, Any], img_rel: str) -> tuple[str, list[list[str]]]:
    """Section 4b (the operator's layout) and its headline rows."""
    del img_rel  # no figure
    p = data["params"]
    by_row = {r.get("row", r.get("variant")): r for r in data["summary"]}
    idle: dict[str, list[int]] = {}
    for run in data["runs"]:
        idle.setdefault(run.get("row", run["variant"]), []).append(run["idle_workers_before_fit"])
    after = p.get("next_fit_after_s")
    rows = []
    kinds = (
        ("", "first", ""),
        ("_second_fit", f"second, {after:.0f} s later", ""),
        ("_restart", "third: its first attempt fails; seconds after the failure", "restart_"),
    )
    for suffix, which, prefix in kinds:
        for name, label in POD_VARIANT_LABEL.items():
            r = by_row.get(name + suffix)
            if r is None:
                continue
            rows.append(
                [label, which, f"{min(idle[name + suffix])}-{max(idle[name + suffix])}"]
                + [
                    f"{r[key]:.2f} ({r[key + '_min']:.2f}-{r[key + '_max']:.2f})"
                    for key in (prefix + "to_entered_s", prefix + "to_first_step_s", "fit_s")
                ]
            )
    ours, before, ray = (by_row.get(n) for n in ("ours", "ours_no_prestart", "ray_train"))
    ours2, no_successor2, ray2 = (
        by_row.get(n)
        for n in ("ours_second_fit", "ours_no_successor_second_fit", "ray_train_second_fit")
    )
    ours3, no_successor3, ray3 = (
        by_row.get(n) for n in ("ours_restart", "ours_no_successor_restart", "ray_train_restart")
    )
    workers = p["workers"]
    headline = [
        [label, f"{a[key]:.2f} s", f"{b[key]:.2f} s", ratio(b[key], a[key]) + " faster"]
        for label, a, b, key in (
            (
                f"`fit()` -> first training step, {workers} workers, the operator's pod layout, "
                "a TrainJob's first fit (median)",
                ours,
                ray,
                "to_first_step_s",
            ),
            (
                f"`fit()` -> first training step, {workers} workers, the operator's pod layout, "
                f"the driver's second fit on the same cluster, {after:.0f} s after the first "
                "(median)",
                ours2,
                ray2,
                "to_first_step_s",
            ),
            (
                f"a worker failure -> the restarted group's first training step, {workers} "
                "workers, the operator's pod layout (median; ours includes "
                "`FailureConfig.restart_backoff_s`, 2 s by default)",
                ours3,
                ray3,
                "restart_to_first_step_s",
            ),
        )
        if a and b
    ]
    env = ", ".join(f"`{k}={v}`" for k, v in sorted(p["worker_node_env"].items()))
    versus = (
        f" Against the same pods without the settings, a first fit's first step comes "
        f"{ratio(before['to_first_step_s'], ours['to_first_step_s'])} sooner."
        if ours and before
        else ""
    )
    if ours2 and no_successor2:
        sooner = ratio(no_successor2["to_first_step_s"], ours2["to_first_step_s"])
        versus += (
            " On the second fit, the idle processes the first fit's worker group asked for"
            f" bring the first step {sooner} sooner than without them."
        )
    if ours3 and no_successor3:
        key = "restart_to_first_step_s"
        versus += (
            f" After a worker failure, the restarted group's first step comes "
            f"{ours3[key]:.2f} s after the failure with them, {no_successor3[key]:.2f} s without"
            " (both include the 2 s restart back-off)."
        )
    second = (
        f"""

Each cluster then runs a second `fit()` of the same driver, {after:.0f} s after the first
returned, and {after:.0f} s later a third, whose first attempt fails on rank 0 after its first
`report()` (`FailureConfig(max_failures=1)`; ours waits `FailureConfig.restart_backoff_s`,
2 s by default, before the new worker group starts). These are a driver's later worker
groups: their actors cannot take the processes the raylets prestarted at their start, as
the first group's actors took those with them. When a worker group shuts down, it asks the
raylet of each node it ran on (Ray's `PrestartWorkers` RPC) for as many idle processes of the
job as it had workers there, kept for `TRAINJOB_PRESTART_KEEP_ALIVE_S` (default 60 s) even
above the pods' soft limit of 1; on these pods they import torch at once, and the next
group's actors start in them (`trainer_runtime/_raylet.py`)."""
        if ours2
        else ""
    )
    columns = ["seconds", "fit", "idle workers", "train function entered", "first step"]
    columns.append("whole fit()")
    text = f"""### 4b. `fit()` on the operator's pod layout: a TrainJob's first fit, and the next

`benchmarks/bench_startup.py --layout pods`: the Ray layout the operator deploys, emulated
with `ray start` on this machine: a head with 0 CPUs, one Ray node of 1 CPU per worker pod
({p["workers"]}), the driver attached. Each row's first fit gets a fresh cluster, idle for
{p["settle_s"]:.0f} s after its nodes joined (worker pods start before the driver reaches
`fit()`), so it is a job's first fit. The worker nodes get the raylet settings the
operator renders into the worker pods of a torch CPU TrainJob ({env}), except in the
"without" row. {p["repeats"]} clusters per variant, alternating; median (min-max), seconds after
`fit()`. "Idle workers" counts the `ray::IDLE` processes on the machine when `fit()` was
called.{versus}{second}

{table(columns, rows)}

The prestarted process becomes the worker actor, so the pod holds no extra process once
training runs; its memory is what the actor would use anyway (torch imported: about
350 MiB). The idle processes asked for the next group exist only between two groups (or for
the keep-alive after the last one, until the job ends): a pod that ran a worker actor has the
memory for them.
"""
    return text, headline


#: Measured by hand (phase timestamps in the driver and the workers), not by the benchmark.
STARTUP_WHERE_THE_TIME_GOES = """\
**Where the time goes** (trainer_runtime, 2 workers; timestamps taken in the driver and in
the workers during 3 fits at a 1-minute load average of 2.2 on the 2 cores, before the changes
below). The placement group is reserved in 5-160 ms. Ray runs the actors' constructors
0.15-0.65 s after they are created (GCS scheduling, the worker lease, loading the actor class
into a prestarted worker process); the rank-assignment round trips take 0.15-0.25 s more.
The process-group set-up is the first to `import torch` in the fresh worker processes:
1.1-1.3 s. Forming the gloo group takes 10-20 ms, or 0.4-0.5 s when a rank other than 0 connected
before rank 0's store listened (torch's TCPStore client then retries after a backoff).
`prepare_model` takes 1.2-1.4 s, nearly all of it `DistributedDataParallel` importing
`torch._dynamo` on its first construction (Ray Train's `prepare_model` pays the same). The
first step and `report()` take about 10 ms. So up to 0.65 s is Ray starting actors and
2.3-2.7 s is importing torch and `torch._dynamo`, CPU-bound work that a loaded machine
stretches. What was changed: the actors are created together with the placement group; the
torch workers import `torch.distributed` in a background thread from the moment their actor
exists, while the controller assigns ranks (the set-up and the train function wait for it,
so no two threads import at once); rank 0 starts the rendezvous store before the other
ranks connect, so none waits out the backoff. `torch._dynamo` is left to `prepare_model`:
importing it earlier could only overlap a few round trips safely and would cost about a
second to train functions that never build DDP. Side by side in one Ray cluster (fits
alternating between the old start-up path, patched back in, and the new one, 6 each after a
warm-up), `fit()` -> first step took 3.24 s before and 2.90 s after (medians; train function
entered 1.98 s / 1.76 s) at a load average of 0.8-1.7, and 8.56 s / 6.89 s with a CI run
loading the 2 cores to 8.6-14.3. What is left is Ray's actor start, `import torch` (1.1 s) and
`import torch._dynamo` in `prepare_model` (1.1 s): the 2.5 s goal is not met on this machine
until those imports get cheaper or move out of the path.

**Moving the imports out of the path: Ray's worker preloading (2026-12-05, measured by hand;
adopted for the operator's worker pods, section 4b).** Ray 2.60 can import modules in every
worker process it starts, before the process takes work (`RAY_preload_python_modules`), and
can start idle workers ahead of demand (on the first driver of a node, or at the raylet's
start with `RAY_enable_worker_prestart=1`).
Three experiments (`trainer_runtime` only, 2 workers, same machine, back to back):

* On the benchmark's cluster above, with
  `RAY_preload_python_modules=torch.distributed,torch._dynamo`, 4 fits each after a warm-up:
  fit() -> first step 3.28-3.51 s without, 3.14-3.34 s with. Each fit gets new worker
  processes, and a new process imports before it takes work: the import moved from
  `prepare_model` (DDP then took 10-30 ms instead of 1.3 s) to before the train function
  (entered at 3.1-3.3 s instead of 2.0-2.2 s).
* A fresh cluster (`ray.init(num_cpus=4)`, then 8 s idle, then one fit), where the driver's
  own node prestarts idle workers for its job: the first fit's first step came 0.49 s after
  `fit()` with the preload, 3.00 s without; the second fit, on new processes again, 2.99 s
  with and 3.10 s without.
* The layout the operator deploys (a head with 0 CPUs that the driver attaches to, and worker
  nodes of 1 CPU each started with `RAY_enable_worker_prestart=1` and the preload): the first
  fit took 3.21 s with and 2.93 s without. Each worker node had prestarted one idle worker
  with torch imported, but Ray placed the placement-group actors in new processes: a plain
  actor on that node ran in the prestarted process (10 s old when asked), an actor in a
  placement-group bundle in a new one (2.3 s old), also after a task had run in the
  prestarted process first. The cause: the idle worker was gone once the placement group
  was ready (listed before `placement_group(...).ready()`, not after). Reserving the node's
  only CPU left the idle worker above the raylet's worker limit, and the raylet stopped it.
  With `RAY_num_workers_soft_limit=2` added to the worker nodes' environment (above their
  1 CPU), the idle worker survived the reservation and the placement-group actor ran in it
  (10 s old). Then, on this layout, the first fit's first step came 0.61 s after `fit()`
  (train function entered at 0.55 s). Without the three variables it came at 3.49 s (same
  layout, back to back). A second fit on the same cluster took 4.80 s and 4.86 s: the first
  fit's actors took the prestarted processes with them, and new ones import first.

So preloading saves the imports only in prestarted processes that Ray hands to the
placement-group actors; in fresh processes it moves the cost. On the operator's layout it
takes three variables on the worker pods, which the operator now renders
(`trainjob_operator/render/ray.py`, `worker_prestart_env`):

* `RAY_enable_worker_prestart=1` and `RAY_num_workers_soft_limit=1` on CPU and GPU worker
  pods. The raylet prestarts one worker per CPU and stops all but one idle worker (soft
  limit 1, whatever the pod's CPU count: a pod of 4 CPUs measured here kept one), which the
  pod's one worker actor then takes.
* `RAY_preload_python_modules=torch.distributed,torch._dynamo` only for torch on CPU, and
  only where `resourcesPerWorker.memory` leaves 512 MiB per CPU (every prestarted worker
  imports before the raylet stops the extras: 602 MiB for two on this machine). Not on GPU
  pods, where an import before Ray assigns the GPUs could fix which devices CUDA sees (not
  testable here), and not for JAX, which reads its platform settings when imported.
* Nothing on TPU hosts: their actors carry per-host variables in a `runtime_env`, and Ray
  starts a new process for a runtime_env. For the same reason the in-pod driver no longer
  passes `spec.env` as `worker_env` (the worker pods carry it already).

The worker group logs how many actors ran in prestarted processes; the real-node tier asserts
that both of the quickstart's did. This cuts a TrainJob's first `fit()` (section 4b). A later
worker group of the same driver (a restart after a failure, or the driver's next `fit()`)
finds no prestarted process: the raylet prestarts only at its start. Since 2026-12-06 a
worker group that shuts down asks the raylets of its nodes for idle processes of the job
(Ray's `PrestartWorkers` RPC; `trainer_runtime/_raylet.py`), which the next group's actors
take: on the operator's layout the second fit's first step came at 0.3 s instead of 2.8 s
(section 4b). The benchmark's cluster above has no preload, so there an idle process saves
only Ray's process start (about 0.4 s), not the imports.

The imports' cost itself is the floor for a new process: in a new Ray actor on the idle
machine (one or two at once, 7 actors) `import torch, torch.distributed` took 1.41-1.52 s
and `import torch._dynamo` 1.31-1.50 s, 2.7-3.0 s together. Each worker pays that on its own
core before its first DDP step, while fit() -> first step took 2.9-3.5 s in the runs above
(the rest is Ray starting the actors and the rendezvous). With a new process per worker,
as both frameworks start them, 2.5 s is below this floor on this machine; a process started
ahead of the request, with the imports done, is the way under it (section 4b).

That needs a process that is idle before `fit()`: where Ray starts with the driver, there is
none to spare. `trainjob run examples/quickstart.yaml` starts a local Ray and then calls
`fit()`; with `RAY_preload_python_modules=torch.distributed,torch._dynamo` exported for the
raylet (2026-12-06, alternating, 2 runs each), its progress line reported the workers running
at 7.1 and 8.3 s instead of 5.5 and 5.4 s: the raylet prestarts idle workers for the job as
the driver connects, and with the preload their imports ran on the 2 cores next to the
driver's own start. So `trainjob run` leaves the preload off."""


def plot_startup(data: dict[str, Any], out: Path) -> None:
    """startup.png: one horizontal stacked bar per framework."""
    plt = _plt()
    rows = list(data["summary"])
    fig, ax = plt.subplots(figsize=(8, 3.2))
    segments = (
        (None, "to_entered_s", "workers up, train function entered"),
        ("to_entered_s", "to_prepared_s", "prepare_model (DDP)"),
        ("to_prepared_s", "to_first_step_s", "first step"),
        ("to_first_report_s", "fit_s", "after the last report: tear-down"),
    )
    for i, r in enumerate(rows):
        for j, (start, end, label) in enumerate(segments):
            left = r[start] if start else 0.0
            ax.barh(
                i,
                max(r[end] - left, 0.0),
                left=left,
                color=f"C{j}",
                label=label if i == 0 else None,
            )
        ax.text(r["fit_s"], i, f" {r['fit_s']:.1f} s", va="center", fontsize=8)
        ax.text(
            r["to_first_step_s"],
            i + 0.3,
            f"first step {r['to_first_step_s']:.2f} s",
            fontsize=7,
        )
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([LABEL[r["framework"]] for r in rows])
    ax.set_xlabel("seconds after fit() was called (median)")
    ax.set_title(f"Start-up with {data['params']['workers']} workers")
    ax.legend(fontsize=7, loc="lower right")
    ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "startup.png", dpi=110)
    plt.close(fig)


# -- 5. local mode ----------------------------------------------------------------------------
def render_local(data: dict[str, Any], img_rel: str) -> tuple[str, list[list[str]]]:
    """Section 5 and its headline rows."""
    p = data["params"]
    rows = data["summary"]
    body = [
        [
            LABEL[r["variant"]] + ("" if r["variant"] == "plain" else ", local mode"),
            f(r["fit_s"], 3),
            f(r["loop_s"], 3),
            f(r["fixed_s"] * 1e3, 1),
            f(r["per_step_us"], 1),
            "-" if r["variant"] == "plain" else f"{r.get('overhead_fit', 0) * 100:+.1f}%",
            "-" if r["variant"] == "plain" else f(r.get("extra_us_per_step"), 1),
        ]
        for r in rows
    ]
    by = {r["variant"]: r for r in rows}
    headline = []
    if "ours" in by and "plain" in by:
        ray = by.get("ray_train")
        headline.append(
            [
                "local mode: extra time per step vs a plain loop (report() every step)",
                f"{by['ours']['extra_us_per_step']:.1f} us ({by['ours']['overhead_fit']:+.1%})",
                "n/a"
                if ray is None
                else f"{ray['extra_us_per_step']:.1f} us ({ray['overhead_fit']:+.1%})",
                "see section 5",
            ]
        )
    bound = (data.get("commit_bound") or {}).get("median_us")
    split_txt = ""
    if "ours" in by and by["ours"].get("report_us") is not None:
        ours, ray = by["ours"], by.get("ray_train") or {}
        headline.append(
            [
                "local mode: one report() call (metrics only)",
                f"{f(ours['report_us'], 1)} us",
                f"{f(ray.get('report_us'), 1)} us",
                (
                    f"{ray['report_us'] / ours['report_us']:.2f}x (goal: >= 1, "
                    "i.e. no slower than Ray Train)"
                    if ray.get("report_us")
                    else "n/a"
                ),
            ]
        )
        if bound:
            headline.append(
                [
                    "local mode: one report(checkpoint=) call vs the raw copy + fsync of the "
                    "same file (same run)",
                    f"{f(ours['commit_us'], 0)} us = {f(ours['commit_us'] / bound, 2)}x "
                    f"the bound ({f(bound, 0)} us)",
                    f"{f(ray.get('commit_us'), 0)} us (persists nothing)",
                    f"{f(ours['commit_us'] / bound, 2)}x the bound (goal: <= 2x)",
                ]
            )
        split_rows = [
            [
                LABEL[r["variant"]],
                f(r.get("report_us"), 1) if r["variant"] != "plain" else "- (no call)",
                f(r.get("commit_us"), 0),
                f(r["commit_us"] / bound, 2) if bound and r.get("commit_us") else "-",
            ]
            for r in rows
        ]
        split_txt = f"""
**Per report and per checkpoint (issue 20).** Inside the same runs, each call is timed on its
own (`time.perf_counter` around it; medians of each run's median): a `report(metrics)` call, and
a `report(metrics, checkpoint=)` call (the plain loop: its `torch.save` into the final folder;
the `torch.save` into the temporary folder is outside the timed call for the other two). **The
bound** for a checkpoint, measured before each repeat in the same process: the same
`state_dict` file copied into a new folder of the storage path and made durable (`copyfile`,
`fsync` of the file, the new folder and its parent), median {f(bound, 0)} us.

{
            table(
                ["variant", "report() us", "report(checkpoint=) us", "x the bound"],
                split_rows,
            )
        }

What a commit does on local storage (`storage/local.py`, `checkpoint_manager.py`,
`_coordinator.py`): the files are copied with `shutil.copyfile` (the kernel's zero-copy path),
listed and stat'ed once to check them against what the ranks stored, the fence (the driver
file's epoch) is read at most once a second, then two small writes each with one `fsync` and
an atomic rename: the commit marker and the manifest (and, when top-k evicts one, its
tombstone before the folder is deleted). There is no per-rank file list file. The call stays
under the raw copy + three fsyncs of the bound because the copied data file itself is not
fsynced (only the marker and manifest are): merging marker and manifest into one write was not
tried, since the manifest lists every kept checkpoint and the marker is what `restore()` trusts
per folder (README, "The commit invariant"). Whether the data files should be fsynced too
(they are durable before the marker only on file systems that order them so) is a question
for that invariant, not for speed: with it the call would be about at the bound.

Where a `report(metrics)` call goes (cProfile, 20,000 calls in local mode): the largest single
cost was parsing the upload mode, a loop over `CheckpointUploadMode`'s members reading each
`.value` through the enum descriptor (0.56 s of 2.13 s profiled); it is a dict lookup since
commit de1e2f1, after these figures were taken. The rest: checking the metrics (0.39 s), the
hand-off to the controller thread (a lock, a deque, a `notify_all`; 0.30 s) and `report()`'s
own bookkeeping.
"""
    log_note = (
        "Ray Train's local mode logs every `report()` at INFO; that logger was set to WARNING "
        "for these runs (it favours Ray Train)."
        if p.get("ray_train_report_log") == "silenced"
        else "Ray Train's per-report INFO log was left on."
    )
    main_table = table(
        ["variant", "fit s", "loop s", "fixed ms", "us/step", "fit vs plain", "extra us/step"],
        body,
    )
    text = f"""## 5. Local mode overhead vs a plain Python loop

`benchmarks/bench_local.py`: one process, no Ray, 1 torch thread. An MLP ({p["width"]} wide,
2 hidden layers, batch {p["batch"]}, SGD) trains {p["steps"]:,} steps; every step reports
`{{"step", "loss"}}` (`loss.item()` in all variants) and every {p["ckpt_every"]:,} steps saves the
`state_dict` as a checkpoint ({p["checkpoints"]} per run, `num_to_keep={p["num_to_keep"]}`).
The plain loop calls the same function directly, with `report()` a no-op and each checkpoint
saved straight into its final folder; trainer_runtime's and Ray Train's local modes
(`ScalingConfig(num_workers=0)`) get each checkpoint from a `TemporaryDirectory` and report it.
trainer_runtime copies it into the run folder, commits it and keeps the manifest and top-k;
**Ray Train's local mode keeps the last metrics and checkpoint object in memory only** (it
persists nothing), so it does less than the other two. {log_note} {p["repeats"]} runs each,
alternating; medians.

{main_table}

**fixed ms**: `fit()` minus the loop (start-up and tear-down); **extra us/step**: (loop -
plain loop) / steps.
{split_txt}
Where trainer_runtime's extra time goes: every `report()` is checked and handed to the local
controller thread, which records it (about 20 us of CPU per report in the call and about as
much in the controller thread on this VM, measured separately with cProfile and
`time.thread_time`), and every checkpoint is copied into the run folder and committed (commit
marker and manifest written with fsync). Ray Train's local mode does none of this.

![local mode]({img_rel}/local_overhead.png)
"""
    return text, headline


def plot_local(data: dict[str, Any], out: Path) -> None:
    """local_overhead.png: time per step by variant."""
    plt = _plt()
    rows = data["summary"]
    fig, ax = plt.subplots(figsize=(7, 4))
    vals = [r["per_step_us"] for r in rows]
    names = [LABEL[r["variant"]] for r in rows]
    ax.bar(names, vals, color=[f"C{i}" for i in range(len(rows))])
    for i, v in enumerate(vals):
        ax.text(i, v, f"{v:.0f} us", ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("microseconds per training step (median run)")
    ax.set_title("Local mode: time per step, report() every step")
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "local_overhead.png", dpi=110)
    plt.close(fig)


# -- 6. operator ------------------------------------------------------------------------------
def render_operator(data: dict[str, Any], img_rel: str) -> tuple[str, list[list[str]]]:
    """Section 6 and its headline rows (trainer_runtime column = the operator; no Ray Train)."""
    p = data["params"]
    phases = {ph["phase"]: ph for ph in data["phases"]}
    body = [
        [
            ph["phase"],
            f"{ph['completed']}/{ph['jobs']}",
            f(ph["p50_s"], 3),
            f(ph["p90_s"], 3),
            f(ph["p99_s"], 3),
            f(ph["max_s"], 3),
            f(ph["status_p50_s"], 3),
            f(ph["jobs_per_s"], 2),
            f(ph.get("submit_s"), 1),
        ]
        for ph in data["phases"]
    ]
    steady = data.get("steady_reconciles_per_s") or {}
    total = data["total_jobs"]
    expected_timer = total / p["timer_interval_s"]
    cpu_windows = [
        ("during the burst", "burst_cpu"),
        ("the bound", "bound_cpu"),
        ("the bound with TrainJobs", "bound_with_trainjobs_cpu"),
        ("the bound of the writes", "bound_of_the_writes_cpu"),
        (f"steady state at {total}", "steady_cpu"),
        ("drivers at work", "running_cpu"),
    ]
    cpu_windows = [(label, key) for label, key in cpu_windows if data.get(key)]
    cpu_rows = [
        [name, *(f((data.get(key) or {}).get(proc), 2) for _, key in cpu_windows)]
        for proc, name in (
            ("operator", "operator (`trainjob operator`)"),
            ("kube_apiserver", "kube-apiserver"),
            ("etcd", "etcd"),
            ("benchmark", "the benchmark (its client and watches)"),
        )
        if any(proc in (data.get(key) or {}) for _, key in cpu_windows)
    ]
    cpu_header = ["process", *(label for label, _ in cpu_windows)]
    running = data.get("running")
    running_txt = ""
    if running:
        per_s = ", ".join(
            f"{k}: {v:.1f}/s" for k, v in sorted(running["reconciles_per_s"].items()) if v
        )
        running_txt = (
            f"Then **drivers at work**: the benchmark stood in for the drivers of "
            f"{running['trainjobs']} of the TrainJobs, patching each one's `status.progress` "
            f"every 2 s as the in-pod driver does while it reports ({running['patches']} patches "
            f"in {running['span_s']:.0f} s): reconciles per second by trigger "
            f"{per_s or 'none'} (last column below).\n"
        )
    write_costs = data.get("write_costs") or {}
    writes_per_job = {"POST TrainJob": 1, "PATCH TrainJob status": 1, "POST Event": 1}
    for kind, n in data["children_per_job"].items():
        writes_per_job[f"POST {kind}"] = n
    write_rows = []
    apiserver_ms = {"children": 0.0, "all": 0.0}
    for what, row in write_costs.items():
        n = writes_per_job.get(what, 0)
        per_job = row["kube_apiserver_ms"] * n
        apiserver_ms["all"] += per_job
        if what.startswith("POST") and what not in ("POST TrainJob", "POST Event"):
            apiserver_ms["children"] += per_job
        write_rows.append(
            [
                what,
                f(row["kube_apiserver_ms"], 2),
                f(row["etcd_ms"], 2),
                str(n),
                f(per_job, 1),
            ]
        )
    if write_rows:
        write_rows.append(
            [
                "**all the writes of one new TrainJob**",
                "",
                "",
                str(sum(writes_per_job.get(w, 0) for w in write_costs)),
                f"**{f(apiserver_ms['all'], 1)}**",
            ]
        )
    children_share = apiserver_ms["children"] / apiserver_ms["all"] if write_rows else None
    rc = data.get("request_costs") or {}
    cost_rows = [
        [
            "LIST pods of one TrainJob (label selector), no `resourceVersion` "
            "(quorum read from etcd)",
            f(rc.get("list_etcd_ms"), 1),
        ],
        [
            "the same with `resourceVersion=0` (apiserver watch cache)",
            f(rc.get("list_cache_ms"), 1),
        ],
        [
            "the LIST the reconciler sends: `KubeClient.list(..., from_cache=True)` "
            "(watch cache, kept-alive connection)",
            f(rc.get("kubeclient_list_ms"), 1),
        ],
        ["GET one namespace, kept-alive connection", f(rc.get("get_keepalive_ms"), 1)],
        ["GET one namespace through `KubeClient`", f(rc.get("kubeclient_get_ms"), 1)],
        [
            "GET one namespace on a new HTTPS connection (TLS handshake each time)",
            f(rc.get("new_connection_get_ms"), 1),
        ],
    ]
    metrics = data.get("metrics") or {}
    skipped_timer = metrics.get(
        'trainjob_reconciles_skipped_total{trigger="timer",why="unchanged"}'
    )
    coalesced = sum(
        v
        for k, v in metrics.items()
        if k.startswith("trainjob_reconciles_skipped_total{") and 'why="coalesced"' in k
    )
    busy_ticks = metrics.get('trainjob_reconciles_skipped_total{trigger="timer",why="busy"}')
    ran = sum(v for k, v in metrics.items() if k.startswith("trainjob_reconciles_total{"))
    by_trigger = {
        k.split('"')[1]: v for k, v in metrics.items() if k.startswith("trainjob_reconciles_total{")
    }
    per_job = ", ".join(f"{k} {v / max(total, 1):.2f}" for k, v in sorted(by_trigger.items()))
    ratio_now = (data.get("bound") or {}).get("operator_ratio") or 0.0
    p99_now = (phases.get("burst") or {}).get("p99_s")
    verdict_ratio = "**met**" if ratio_now >= 0.8 else "**not met**"
    verdict_p99 = "**met**" if p99_now is not None and p99_now <= 2.0 else "**not met**"
    # Issue 20's memory round, A/B on this machine one run after the other (full size; the
    # same benchmark file; raw results not kept: the worktrees' benchmarks/results).
    ab_table = table(
        [
            "run",
            "RSS idle / after burst / at 1,000 MiB",
            "burst TrainJobs/s",
            "burst p50 / p99 s",
            "bound TrainJobs/s",
            "ratio",
            "scale TrainJobs/s",
            "reconciles (timer)",
            "load",
        ],
        [
            [
                "before (2edd00a)",
                "57.6 / 119.8 / 290.2",
                "20.4",
                "3.69 / 7.52",
                "68.9",
                "30%",
                "13.0",
                "3,237 (2,237)",
                "7.9",
            ],
            [
                "one schedule (4, 6)",
                "58.1 / 115.8 / 229.6",
                "20.7",
                "3.81 / 6.38",
                "70.2",
                "29%",
                "15.1",
                "3,018 (2,018)",
                "3.3",
            ],
            [
                "+ pod events on the loop (5)",
                "56.9 / 103.4 / 125.2",
                "18.6",
                "4.28 / 7.21",
                "67.2",
                "28%",
                "13.4",
                "3,050 (2,050)",
                "10.8",
            ],
            [
                "+ 16 handler threads (8), round 1",
                "57.5 / 106.5 / 127.7",
                "21.9",
                "3.05 / 4.71",
                "74.7",
                "29%",
                "14.2",
                "3,001 (2,001)",
                "13.9",
            ],
            [
                "+ 16 handler threads (8), round 2",
                "58.1 / 102.7 / 121.5",
                "21.4",
                "3.22 / 5.10",
                "52.6",
                "41%",
                "11.8",
                "3,010 (2,010)",
                "10.8",
            ],
            [
                "+ timer fingerprint (9) (the run above)",
                "57.7 / 103.9 / 141.5",
                "23.2",
                "3.24 / 5.13",
                "83.2",
                "28%",
                "22.3",
                "1,948 (948)",
                "4.2",
            ],
        ],
    )
    # Issue 20's event-handler round, A/B the same way (worktrees of f0e2222 and c15a599; the
    # figures copied from their result files, kept out of the repository).
    # Issue 20, 2026-12-05: changes 15 and 16, each A/B against the commit before it.
    ab_table_watch = table(
        [
            "run",
            "burst TrainJobs/s",
            "burst p50 / p99 s",
            "bound TrainJobs/s",
            "ratio",
            "bound with TrainJobs, ratio",
            "scale TrainJobs/s",
            "RSS at 400 MiB",
        ],
        [
            row.split("|")
            for row in (
                "before (9278bba), run 1|33.0|1.80 / 3.05|72.7|45%|62.5, 53%|26.8|106.0",
                "before (9278bba), run 2|30.4|1.95 / 3.72|80.5|38%|60.3, 50%|32.3|106.3",
                "pod watch (15), run 1|33.2|1.39 / 2.54|73.1|45%|64.4, 52%|31.5|74.9",
                "pod watch (15), run 2|36.4|1.40 / 2.42|79.2|46%|66.0, 55%|31.5|75.1",
                "8 create threads (6488781), run 1|46.4|0.97 / 1.79|90.0|52%|81.8, 57%|43.6|74.3",
                "8 create threads (6488781), run 2|49.5|1.02 / 1.68|93.4|53%|80.5, 61%|43.2|74.8",
                "16 create threads (16), run 1|46.3|0.29 / 0.61|88.9|52%|74.6, 62%|43.4|73.8",
                "16 create threads (16), run 2|49.1|0.33 / 0.65|92.3|53%|81.6, 60%|46.4|74.9",
            )
        ],
    )
    ab_table_events = table(
        [
            "run",
            "burst TrainJobs/s",
            "burst p50 / p99 s",
            "bound TrainJobs/s",
            "ratio",
            "scale TrainJobs/s",
            "RSS at 1,000 MiB",
            "burst CPU: operator / apiserver / etcd",
        ],
        [
            [
                "before (f0e2222)",
                "18.3",
                "3.96 / 5.43",
                "62.6",
                "29%",
                "11.7",
                "125.8",
                "0.67 / 1.04 / 0.18",
            ],
            [
                "event handlers only (10), run 1",
                "24.5",
                "2.92 / 5.20",
                "50.0",
                "49%",
                "15.9",
                "115.1",
                "n/a",
            ],
            [
                "event handlers only (10), run 2",
                "20.6",
                "3.29 / 5.54",
                "60.0",
                "34%",
                "16.1",
                "117.6",
                "0.67 / 0.97 / 0.19",
            ],
            [
                "event handlers only (10), run 3",
                "21.6",
                "3.01 / 5.57",
                "58.3",
                "37%",
                "16.7",
                "117.9",
                "0.68 / 0.96 / 0.19",
            ],
            [
                "+ no diff-base, quiet kopf log, coalescing (11, 12), run 1",
                "25.3",
                "2.50 / 4.31",
                "60.6",
                "42%",
                "18.7",
                "119.0",
                "0.60 / 1.02 / 0.21",
            ],
            [
                "+ no diff-base, quiet kopf log, coalescing (11, 12), run 2",
                "24.1",
                "2.74 / 4.72",
                "54.3",
                "44%",
                "17.4",
                "116.7",
                "0.62 / 1.00 / 0.20",
            ],
            [
                "+ busy ticks, listing creates (13), run 1",
                "23.6",
                "2.90 / 4.78",
                "60.7",
                "39%",
                "20.3",
                "114.5",
                "0.60 / 1.01 / 0.21",
            ],
            [
                "+ busy ticks, listing creates (13), run 2 (the run above)",
                "23.8",
                "2.75 / 4.70",
                "58.1",
                "41%",
                "20.6",
                "116.3",
                "0.61 / 1.01 / 0.21",
            ],
        ],
    )
    burst = phases.get("burst")
    headline = []
    if burst:
        headline.append(
            [
                f"operator: create -> all children exist, {burst['jobs']} TrainJobs at once",
                f"p50 {burst['p50_s']:.2f} s, p99 {burst['p99_s']:.2f} s, "
                f"{f(burst['jobs_per_s'], 2)} TrainJobs/s",
                "n/a (no operator)",
                "n/a",
            ]
        )
    bound = data.get("bound")
    bound_rows = (
        (
            "bound",
            "operator throughput vs the bound (the same children POSTed by a plain "
            "{concurrency}-thread client, same API server, same run)",
            "of the bound (goal: >= 0.80)",
        ),
        (
            "bound_with_trainjobs",
            "operator throughput vs the bound with the TrainJobs' own creates (the burst's "
            "TrainJob POSTs, each one's children POSTed as soon as it exists by a plain "
            "{concurrency}-thread client: an operator that costs nothing)",
            "of it",
        ),
        (
            "bound_of_the_writes",
            "operator throughput vs the bound of its writes (as the row above, plus each "
            "TrainJob's status patch and Event, and watches standing for the operator's: "
            "an operator that costs nothing and writes what this one writes)",
            "of it",
        ),
    )
    for key, label, of_what in bound_rows:
        measured = data.get(key)
        if not (measured and burst):
            continue
        share = measured.get("operator_ratio")
        headline.append(
            [
                label.format(concurrency=measured["concurrency"]),
                f"{f(burst['jobs_per_s'], 1)} vs {f(measured['jobs_per_s'], 1)} TrainJobs/s = "
                f"**{f(100 * (share or 0), 0)}%** {of_what.split(' (')[0]}",
                "n/a (no operator)",
                f"{f(share, 2)} {of_what}",
            ]
        )
    seq = phases.get("sequential")
    if seq:
        headline.append(
            [
                "operator: create -> all children exist, one TrainJob on an idle operator",
                f"p50 {seq['p50_s']:.3f} s, p99 {seq['p99_s']:.3f} s",
                "n/a (no operator)",
                "n/a",
            ]
        )
    headline.append(
        [
            f"operator RSS at {total} TrainJobs",
            f"{f(data.get('rss_at_total_mib'), 1)} MiB (idle {f(data['rss_idle_mib'], 1)} MiB, "
            f"{f(data.get('rss_per_job_kib'), 0)} KiB per TrainJob)",
            "n/a (no operator)",
            "n/a",
        ]
    )
    kinds = ", ".join(f"{n} {k}" for k, n in data["children_per_job"].items())
    steady_txt = ", ".join(f"{k}: {v:.1f}/s" for k, v in steady.items() if v)
    mean_rec = data.get("steady_reconcile_mean_s")
    main_table = table(
        [
            "phase",
            "TrainJobs",
            "children p50 s",
            "p90 s",
            "p99 s",
            "max s",
            "status p50 s",
            "TrainJobs/s",
            "POSTs took s",
        ],
        body,
    )
    bound_txt = ""
    if bound:
        bound_txt = f"""
**The bound** (issue 20): right after the burst, with the operator idle again, the benchmark
renders the same children for {bound["jobs"]} TrainJobs with the operator's own renderer
(before the clock starts) and POSTs them, {bound["creates"]} creates, into another namespace
with a plain client of {bound["concurrency"]} threads (one kept-alive connection each; every
non-Pod child first, then the Pods): {f(bound["span_s"], 2)} s,
**{f(bound["creates_per_s"], 0)} creates/s = {f(bound["jobs_per_s"], 1)} TrainJobs/s** (median
POST {f(bound["post_ms_p50"], 1)} ms). No reads, status writes, Events, rendering or watches of
its own (the benchmark's watches, which span all namespaces, see these children as they see the
operator's): what the operator does beyond the creates is its cost over this bound. The
operator's burst reached **{f(100 * (bound.get("operator_ratio") or 0), 0)}%** of it.
"""
    bound_tj = data.get("bound_with_trainjobs")
    if bound and bound_tj:
        bound_txt += f"""
That bound leaves out the TrainJobs themselves: during the burst the benchmark's own client
POSTs them to the same API server, one after another, and no operator can create a
TrainJob's children before it exists. **The bound with the TrainJobs' own creates** measures
that: the benchmark POSTs {bound_tj["jobs"]} TrainJobs back to back into the other
namespace, as in the burst, and a plain client of {bound_tj["concurrency"]} threads POSTs each
one's children as soon as its TrainJob exists (an operator that takes no CPU and no time):
{f(bound_tj["span_s"], 2)} s, **{f(bound_tj["jobs_per_s"], 1)} TrainJobs/s** (the TrainJob
POSTs alone {f(bound_tj["submit_s"], 2)} s). The operator's burst reached
**{f(100 * (bound_tj.get("operator_ratio") or 0), 0)}%** of it.
"""
    bound_ops = data.get("bound_of_the_writes")
    if bound and bound_ops:
        bound_txt += f"""
Both leave out what the operator must write besides the children, and the watches it needs.
**The bound of the operator's writes** adds them: as the bound above, and after each
TrainJob's children the status patch and the Event of its first reconcile, as the operator's
own planner makes them (rendered and planned before the clock starts), with two watches in the
namespace standing for the operator's (its TrainJobs, its pods; their events read and dropped
unparsed). {bound_ops["requests_per_job"]} requests per TrainJob by a client that takes no CPU
and no time, the physical bound of this operator's work on this API server:
{f(bound_ops["span_s"], 2)} s, **{f(bound_ops["jobs_per_s"], 1)} TrainJobs/s**. The operator's
burst reached **{f(100 * (bound_ops.get("operator_ratio") or 0), 0)}%** of it.
"""
    if write_rows:
        children_pct = f(100 * (children_share or 0), 0)
        n_watches = len(data["children_per_job"]) + 1
        bound_txt += f"""
Why the bounds differ so much: the writes do not cost the API server alike. After the run
(operator stopped, a namespace no one watches), the writes of {p["jobs"]} TrainJobs again,
one kind at a time by {p["bound_concurrency"]} threads; CPU of the kube-apiserver and etcd per
write (from `/proc`), and per new TrainJob:

{
            table(
                [
                    "write",
                    "kube-apiserver ms",
                    "etcd ms",
                    "per TrainJob",
                    "kube-apiserver ms per TrainJob",
                ],
                write_rows,
            )
        }

The children are {children_pct}% of what a new TrainJob costs the API server. A custom
resource's write costs it several times a core object's, and the status patch, which decodes,
patches, coerces to the CRD's schema and validates the whole stored TrainJob, is the dearest
write of all (a profile is in the latest round below). So the first bound, the children
alone, is out of an operator's reach by construction: with the API server's CPU the limit, an
operator that cost nothing would reach about {children_pct}% of it, before the watches (every
event is encoded and sent to each watcher: the benchmark's own {n_watches} and the
operator's 2).
"""
    text = f"""## 6. Operator: reconcile latency, throughput, memory (issues 6, 20)

`benchmarks/bench_operator.py`: etcd + kube-apiserver {p.get("k8s_version", "1.20.2")} from
`tests.support.EnvTest` (no kube-controller-manager, scheduler or kubelet: pods stay
Pending), the CRD from `crds/`, and the operator as its own process, as deployed: `trainjob
operator --namespace bench` (kopf; the default 5 s timer per TrainJob), with the Kubernetes
client libraries absent as in the operator image (`AS_IN_THE_IMAGE`). TrainJobs are
`{p["manifest"]}` renamed; each gets {sum(data["children_per_job"].values())} children
({kinds}). The benchmark POSTs TrainJobs over a kept-alive HTTPS connection and watches the
children (one watch per kind, across all namespaces, so that every bound below feeds the API
server's watchers as the burst does) and the TrainJobs. **Latency**: from just before a
TrainJob's POST to the moment the watch saw its last child ("children"), or its first status
("status").
Phases on one API server and operator: **sequential** ({p["sequential"]} TrainJobs, each created
when the previous one's children all exist), **burst** ({p["jobs"]} created back to back),
**scale** (a second burst up to {p["total"]} TrainJobs), then {p["settle_s"]:g} s of steady state
(after the operator had no create- or pod-triggered reconcile for 3 s). **TrainJobs/s**: jobs
whose children all exist / (last child seen - first POST). No Ray Train comparison: Ray Train
has no Kubernetes operator (KubeRay is a separate project and is not set up here).

{main_table}
{bound_txt}
Memory of the operator process (VmRSS): **{f(data["rss_idle_mib"], 1)} MiB** idle,
{f(data.get("rss_after_burst_mib"), 1)} MiB right after the burst,
**{f(data.get("rss_at_total_mib"), 1)} MiB at {total} TrainJobs** (median over the steady
state; peak VmHWM {f(data.get("rss_peak_mib"), 1)} MiB), i.e. about
{f(data.get("rss_per_job_kib"), 0)} KiB per TrainJob.

Steady state at {total} TrainJobs: reconciles per second by trigger {steady_txt or "none"}
(the timers alone ask for {expected_timer:.0f}/s), mean reconcile
{f(mean_rec, 3)} s (all reconciles of the run: {f(data.get("all_reconcile_mean_s"), 3)} s).
{running_txt}CPU (cores, 1.0 = one core of the 2):

{table(cpu_header, cpu_rows)}

![operator latency CDF]({img_rel}/operator_latency_cdf.png)

![operator timeline]({img_rel}/operator_timeline.png)

Where the time goes, measured on the same API server after the run (operator stopped,
{rc.get("namespace_pods", "?")} pods in the namespace; median of 10, ms):

{table(["request", "ms"], cost_rows)}

How the operator keeps this cheap (`trainjob_operator/operator_main.py`, `kube.py`,
`reconcile/apply.py`): each reconcile reads the TrainJob, LISTs its 6 child kinds by label
(except the first reconcile of a TrainJob, which has no status and so no children yet),
creates what is missing and patches the status. The LISTs are served from the API server's
watch cache (`resourceVersion=0`): a quorum read decodes every object of the kind in the
namespace, so without it one reconcile costs more the more TrainJobs exist (table above).
`KubeClient` keeps one connection alive per thread instead of a TLS handshake per request. A
trigger (a watch event, a pod event, a timer tick) that arrives while a reconcile of the same
TrainJob waits to start, for a thread or for the TrainJob's lock, is dropped before it takes
a thread (the waiting one reads the newer state): {f(coalesced, 0)} triggers coalesced in
this run. A timer tick does nothing while a reconcile of its TrainJob runs or waits
({f(busy_ticks or 0, 0)} ticks), and otherwise reconciles only when the TrainJob changed since
a reconcile last left it, a deadline, TTL or pool scale-down the last plan asked for is due,
or 60 s passed (resync): {f(skipped_timer, 0)} ticks skipped as unchanged, {f(ran, 0)}
reconciles run in all (per TrainJob: {per_job or "none"}; at {total} TrainJobs the steady
state is the 60 s resync: {total / 60:.1f} reconciles/s). The ticks of all TrainJobs come
from one schedule (a heap of due times on kopf's event loop, fed by the TrainJob watch), not
from a `kopf.timer` per TrainJob; a TrainJob's first tick is 5 s after it was first seen (its
first reconcile ran on that watch event). The reconciles of watch events and the ticks run
on one pool of 16 threads (kopf's default, min(32, cores + 4), was 6 here); pod events are
handled on the event loop, and only those that ask for a reconcile take a thread. Latency
under a burst is queueing behind the other TrainJobs' reconciles; the API server's own CPU is
the other limit on these 2 cores.

The run before the first of these changes (commit 9ff42cc: every LIST a quorum read, a TLS
handshake per request, every timer tick a full reconcile) measured, on the same machine:
sequential p50 0.375 s, burst p50 16.2 s / p99 36.8 s at 4.9 TrainJobs/s, scale p50 90.0 s at
2.1 TrainJobs/s, and the kube-apiserver busy at 1.38 cores in steady state at 500 TrainJobs,
where the timers asked for more reconciles than the operator could run.

**Memory (issue 20).** Profiled in the operator process (`tracemalloc` with 3 to 10 frames, a
census of the live objects by type from `gc.get_objects()`, `sys._debugmallocstats()`, and
`malloc_trim(0)` to see what the C allocator held free), with 150 and 300 TrainJobs created at
once; at 1,000 `tracemalloc` slowed the operator so much on the shared 2 cores (load average
10-30) that the run was stopped after 8 minutes at 112 TrainJobs.

* **Idle**: 49 of the 106 MiB were the `kubernetes` Python client, which kopf imports at start
  when it is installed (for `isinstance` checks of client objects the operator never hands
  it). The operator image has the core install only, without it; this environment has it for
  the tests, and the benchmark ran the operator there as it was. The benchmark now starts it
  with the client libraries absent, as in the image: idle 57 MiB, of which kopf and aiohttp
  are ~32 MiB over a bare interpreter (9 MiB) and pydantic, the API models and the renderer
  ~16 MiB.
* **Per TrainJob, live**: little. At 300 TrainJobs (1,200 pods) the census grew by one kopf
  `ResourceMemory` per TrainJob and per pod (~0.9 KiB each, 1.4 MB in all) and a few hundred
  other objects; tracemalloc's live total grew 11-15 MB, mostly the buffers of kopf's aiohttp
  connections and its per-object queues, which go when idle. kopf's timers (an asyncio task,
  its `Daemon`, loggers and the live body per TrainJob) held ~3 KiB per TrainJob (87.3 vs 86.9
  MB traced at 150 TrainJobs, before vs after the schedule below), but every tick allocated
  anew: kopf's invocation machinery and a log line each (44,110 "Timer succeeded" lines in the
  first 10 minutes of a stopped 1,000-TrainJob profile).
* **What dominated RSS** is what a burst leaves behind: Python's small-object allocator
  (pymalloc) keeps a 1 MiB arena while any object in it lives, so the arenas stay as many as
  the burst's peak of live objects needed. At 300 TrainJobs: 73 arenas (47 idle) with 50 MB
  in live blocks and 25 MB free inside them; `malloc_trim(0)` gave back ~4 MiB (182 -> 178
  MiB) and `MALLOC_ARENA_MAX=2` changed nothing (183 MiB). So the cure is fewer objects alive
  at once during a burst. The largest such pile found: kopf ran the (synchronous) pod handler
  on the handler pool, so each pod's ADDED event waited, with the pod's body and kopf's
  per-event objects, behind the burst's reconciles only to be ignored (inferred from the A/B
  below, not caught in a snapshot at the peak).

Changes (A/B below: the same benchmark file, full size, one run after the other on this
machine; "before" from a worktree of commit 2edd00a, "one schedule" from that worktree with
the changes but the synchronous pod handler). RSS at 1,000 TrainJobs: 290 -> 230 MiB with
the schedule, -> 125 MiB with the pod handler on the event loop:

4. `operator_main.py`: one timer schedule for all TrainJobs instead of a `kopf.timer` each
   (same rules: a tick never overlaps the TrainJob's previous one; kopf's finalizer is kept by
   a no-op `kopf.on.delete`, as the timers kept it); the first tick no longer comes at
   creation, when the create handler reconciles anyway.
5. `operator_main.py`: the pod handler is a coroutine on kopf's event loop; a pod event that
   asks for a reconcile (a change, a deletion, the initial listing) runs it on the pool.
6. `reconcile/apply.py`: a TrainJob without a status (never reconciled) gets no child LISTs:
   it has no children, save those a reconcile cut off before its status write created (an
   operator restart), whose creates answer 409; the next reconcile reads them.
7. `benchmarks/bench_operator.py`: the operator without the Kubernetes client libraries, as in
   the image (idle 106 -> 57 MiB; no change to the operator).
8. `operator_main.py`: 16 handler threads instead of kopf's default 6. With 6, the burst's
   throughput matched the pool (6 threads / ~0.18 s per reconcile, ~1.5 reconciles per
   TrainJob during the burst). With 16 the mean reconcile took 0.45-0.57 s instead (it waits
   longer for the 8 create threads and the API server), burst p99 fell from 6.4-7.2 s to
   4.7-5.1 s and throughput rose a little (21.4-21.9 vs 18.6-20.7 TrainJobs/s).
9. `reconcile/fingerprint.py`, `operator_main.py`: a timer tick compares a fingerprint of
   what a reconcile reads of the TrainJob (generation, labels, annotations but kopf's, status)
   with the TrainJob as the last reconcile's own writes left it, instead of the
   `resourceVersion` seen by the last timer reconcile. Before, every new TrainJob's first tick
   reconciled (its create reconcile's status write and kopf's annotation patch had changed the
   version), and so did the tick after any tick that wrote. Timer reconciles per TrainJob
   2.01 -> 0.95 (the rest are ticks a plan asked for and the resync), steady-state timer
   reconciles at 1,000 TrainJobs 32.7 -> 11.2/s, mean reconcile 0.42 -> 0.13 s; the scale
   phase (780 TrainJobs created while 220 exist) ran at 22.3 instead of 11.8 TrainJobs/s, p99
   21.3 instead of 42.9 s. The burst did not move (its TrainJobs are new: their first ticks
   come after it); RSS at 1,000 TrainJobs read 141.5 MiB in this run (121.5-127.7 before; the
   fingerprints take no more room than the versions did, so most of it is where the
   collector stood when sampled).

{ab_table}

Against the issue's goals: RSS at 1,000 TrainJobs is {f(data.get("rss_at_total_mib"), 1)} MiB
in this run (goal <= 150 MiB; 290 MiB before these changes with the same benchmark, 344 MiB in
the last committed run, which also counted the `kubernetes` client). Throughput is {
        f(100 * ratio_now, 0)
    }% of the bound (goal 80%: {verdict_ratio}) and burst p99 {f(p99_now, 1)} s (goal
2 s: {verdict_p99}) in this run, the one committed; in the runs of this round both were not met
(the bound's own figure moves a lot with the machine's load: 52.6-83.2 TrainJobs/s across these
runs). Changes 4-6 did not move the burst (18.6-20.7 vs 20.4 TrainJobs/s, run one after the
other: within what the shared machine varies); change 8 cut its p99 by about a third but raised
its throughput a little only: 21.4-21.9 TrainJobs/s against a bound of 52.6-74.7 (the bound
moves with the other engineers' load), 29-41%; change 9 doubled the scale phase's throughput,
not the burst's (23.2 TrainJobs/s). The latest round is at the end of this section.

**Where the burst's time went (issue 20, an earlier round).** py-spy (`py-spy record -r 50 -f
raw`, 25 s of the scale phase, all threads, after change 1 below) on the operator: of the 487
samples in reconciles, 253 were the 6 child LISTs of `read_children` and 136 the creates and
writes of `execute_plan`, almost all of it waiting for the API server's answer
(`SSLSocket.read`); kopf's own processing of events (diff-base annotation, `deepcopy` of
bodies, its PATCHes) was about 155 of the process's 1,257 samples. The reconciles themselves
were the waste: a new TrainJob cost **6.4 reconciles** (1 create, 3 from its own Pods being
ADDED echoing back through the pod watch, 2.4 timer ticks), each a GET and 6 LISTs. Changes,
A/B on the same machine (200-TrainJob burst then 400 TrainJobs; the baseline run from a
worktree of the commit before, the same benchmark file; two rounds, run one after the other):

| run | burst TrainJobs/s | burst p50 / p99 s | bound TrainJobs/s | ratio | reconciles/TrainJob |
|---|---|---|---|---|---|
| before, round 1 | 9.4 | 9.44 / 14.8 | 46.0 | 20% | 6.4 (pod 3.1) |
| before, round 2 | 8.7 | 9.10 / 18.5 | 24.8 | 35% | 6.3 (pod 2.9) |
| concurrent creates only | 8.7 | 9.35 / 18.4 | 61.7 | 14% | 5.4 (pod 2.3) |
| + pod ADDED not a trigger | 13.7 | 5.86 / 11.1 | 56.5 | 24% | 3.0 (pod 0) |

1. `reconcile/apply.py`: a reconcile sent its ten creates one after another (ten round trips
   of an etcd write each). They now go in two concurrent waves (every non-Pod child, then the
   Pods, which name their ServiceAccount) on 8 shared threads with kept-alive connections. One
   TrainJob on an idle operator: p50 0.094-0.075 s vs 0.117-0.112 s. **Alone it did not raise
   the burst's throughput** (8.7 vs 8.7-9.4 TrainJobs/s): the creates were not what limited
   it, the number of reconciles was.
2. `operator_main.py`: a managed Pod being ADDED no longer triggers a reconcile (only the
   operator creates these Pods; the reconcile that created one already planned with it;
   changes, deletions and kopf's initial listing after a restart still trigger): pod-triggered
   reconciles 1,222 -> 0 for 400 TrainJobs, burst throughput +50%, p50 -37%.
3. `reconcile/apply.py`: the 6 child LISTs of a reconcile go concurrently on the same threads
   (one round trip instead of six); its effect could not be separated from the noise of the
   loaded machine.

With ~3 reconciles per new TrainJob, each a GET, 6 LISTs, the creates, a status PATCH and 2
Events, plus kopf's finalizer and diff-base PATCHes, the operator sends about 3x the requests
of the bound's plain client and shares the 2 cores with the API server. Done since: the
handler pool size (change 8) and the timer reconcile after the operator's own writes (change
9). Not done: the 6 LISTs of every later reconcile (one informer cache per kind would
replace them, but needs `watch` on the 6 kinds in the chart's RBAC, and the cache's bodies
would cost memory: ~4,000 pods here) and the 2 Events per create (kopf's 2 PATCHes per
TrainJob went with change 10 below). The
bound itself moves by 2.5x between runs (24.8-68.9 TrainJobs/s) with the other engineers' work
on the same 2 cores, so the ratio is noisy.

**The event-handler round (issue 20, the latest).** py-spy on the operator during a burst
(`py-spy record -r 250 --threads -f raw`, 40 s; waits for a lock, a queue or the network left
out) before changes 11-13: 59% of the busy samples were kopf's event loop, one thread that
every watch event of every TrainJob and pod goes through; 17% of all busy samples were
kopf building a "diff-base essence" of each event's object (`deepcopy` of the whole body,
pods included) to compare it for change handlers this operator does not have, and 5% its
"Handler ... succeeded." INFO line for every event, formatted as JSON on the loop. Changes:

10. `operator_main.py` (the commit before this round): TrainJobs are handled by kopf's
    low-level event handler only; kopf's change handlers had added a finalizer and a
    diff-base annotation to every TrainJob (two PATCHes, two more watch events, and the create
    handler ran only once the finalizer's PATCH had echoed back). A TrainJob's first reconcile
    plans from its watch event (no GET), and the Events go out alongside the status write.
11. `operator_main.py`: a diff-base storage that builds and keeps nothing (`NoDiffBase`), and
    kopf's per-object logger at WARNING unless `--verbose`.
12. `operator_main.py`: triggers are coalesced on the event loop, before they take a thread
    (`Operator.enqueue`): during a burst a TrainJob's pod events and timer tick no longer queue
    reconciles of their own behind the one still waiting; the waiting one plans from the
    newest watch body.
13. `operator_main.py`, `reconcile/fingerprint.py`: a timer tick while a reconcile of its
    TrainJob runs does nothing (its outcome decides the next tick); the fingerprint a tick
    compares with is the TrainJob as the reconcile's writes left it only when nothing but
    the operator's own keys changed since its read (otherwise the read's, so someone else's
    change that landed in between, such as the driver's status update, gets its reconcile at
    the next tick instead of at the 60 s resync); a TrainJob without a status found by the
    listing at start-up is counted as a create.

{ab_table_events}

The burst's throughput rose by about a third over f0e2222 (18.3 -> 23.6-25.3 TrainJobs/s), p99
fell from 5.4-5.6 to 4.3-4.8 s, and the scale phase (780 TrainJobs created while 220 exist)
from 11.7 to 20.3-20.6 TrainJobs/s; RSS at 1,000 TrainJobs stayed at 115-119 MiB (goal
<= 150 MiB). After the changes, py-spy with `--gil` (the thread holding the GIL, 12 s of the
burst) found the GIL held in 49% of the samples: the process is not GIL-bound any more. Of
those samples 54% were the event loop (15% parsing the watch streams' JSON, the rest kopf's
per-event machinery and the handlers), 18% planning and rendering, 26% the HTTP client. The
limit is the 2 cores: during the burst the kube-apiserver used 1.0 core, etcd 0.2 and the
operator 0.6, next to the benchmark's own client. Two figures bound what is left to gain
here: the operator sends 12 requests per new TrainJob (10 children, its status, one Event;
13 before change 14 below) where the bound's client sends the 10 children only, so even an
operator that cost no CPU would reach 10/12 = 83% of this bound; and the bound's client takes
the whole API server, while the operator shares the cores with it. In this run (after
changes 15-18 below): {f(100 * ratio_now, 0)}% of the bound (goal 80%: {verdict_ratio})
and burst p99 {f(p99_now, 1)} s (goal 2 s: {verdict_p99}).

14. `reconcile/plan.py` (2026-12-05): a new TrainJob's first phase goes into its Created Event
    (`TrainJob accepted; Starting: waiting for pods: 0/2 workers ready`) instead of an Event
    of its own: one Event per create instead of two. A/B against ee6b260 (the commit before,
    worktree on `PYTHONPATH`), alternating, 2 runs each, on a day the bound itself measured
    78-89 TrainJobs/s: burst 35.0 / 32.7 TrainJobs/s before, 33.2 / 31.5 after (ratio
    0.41 / 0.42 before, 0.38 / 0.36 after); scale phase 26.0 / 26.9 before, 28.2 / 27.7 after;
    RSS at 1,000 TrainJobs 125-128 MiB in all four. One write in thirteen is below this
    machine's run-to-run noise in the burst; the scale phase gained about 5%.

15. `pod_watch.py`, `operator_main.py` (2026-12-05): the managed pods are watched with a plain
    asyncio watch instead of kopf's. A pod's `ADDED` line (the echo of the operator's own
    creates: 4 per new TrainJob, most of the pod events of a burst) is skipped before it is
    parsed, its `resourceVersion` read off the bytes; `MODIFIED` and `DELETED` reconcile the
    pod's TrainJob as before. LIST from the watch cache, WATCH with bookmarks, resume from
    the last version, LIST again on 410 Gone (then every TrainJob's next tick reconciles it).
16. `reconcile/apply.py` (2026-12-05): 16 threads for the creates, child LISTs and Events
    instead of 8: the 16 handler threads' reconciles queued for them.

A/B, each against the commit before it (a worktree of it with the same benchmark file),
alternating, 2 runs each, 200-TrainJob burst then 400 in all (for change 15 the bound was
still measured right after the create reconciles, overlapping the burst's first timer
ticks; for change 16 once no reconcile of any kind ran for 3 s):

{ab_table_watch}

The pod watch cut the burst's latency by about a quarter and the operator's RSS at 400
TrainJobs from 106 to 75 MiB (kopf kept a worker task, a queue and a memory record per pod);
16 create threads cut it by another two thirds (p99 1.7-1.8 -> 0.6-0.65 s) at the same
throughput. In these runs the operator used about 0.5 core during the burst (0.6 before
change 15 in the runs above), the kube-apiserver 1.1 and etcd 0.24. py-spy on the operator
during a burst (200 samples/s, 8 s, after change 15): of its samples, most were its threads
waiting for the API server's answers (`SSLSocket.read`, 46%) and for work (`Condition.wait`,
`select`, 27%); rendering, planning and the API models about 6%, JSON 3%, kopf 2%, the pod
watch 0.1%.

What is left of the throughput goal is the API server's CPU, on the 2 cores it shares with
etcd, the operator and the benchmark's own client. The operator now keeps up with the
TrainJobs as they are created: during the burst the benchmark's own POSTs of the 200
TrainJobs took 3.5-4.1 s (1.9-2.1 s with nothing else running), and the last TrainJob's
children existed 0.2-0.5 s after its POST. The second bound says how far an operator could
go here: the TrainJobs' own creates plus their children, by a client that costs nothing,
reached 75-82 TrainJobs/s in these runs, 84-91% of the first bound; an operator that also
writes each TrainJob's status and one Event sends 12 requests where that client sends 10,
13 with the TrainJob's own POST against 11. Counting every request alike, such an operator,
costing nothing itself, would reach 11/13 of the second bound, 71-77% of the first: 80% of
the first bound is out of reach on this machine for an operator that writes a status.
Against the second, the operator reached 60-62% in these runs.

17. `reconcile/fingerprint.py`, `api/status.py` (2026-12-05): every new TrainJob's first timer
    tick reconciled it again (timer reconciles equal to the TrainJob count in every run so
    far). The API server adds the CRD's status defaults to the first status write
    (`workerFailures: 0`, a key the driver owns), so the comparison of what the reconcile
    read with what its write answered took that for someone else's change. Status keys now
    read the same absent and at their default. A/B against 7f56878, alternating, 2 runs each
    (400 TrainJobs): timer reconciles 400 -> 0; in the 5 s of steady state the operator used
    0.018-0.022 instead of 0.11-0.14 core and the kube-apiserver 0.03 instead of 0.15-0.21;
    burst 54.6 / 54.7 vs 57.1 / 51.1 TrainJobs/s, scale 51.3 / 54.2 vs 51.9 / 50.4 (within
    the noise: those ticks came 5 s after each TrainJob, mostly after its phase).
18. `kube.py`, `reconcile/apply.py` (2026-12-05): the reconciler's creates and Events no
    longer parse the API server's answer (`KubeClient.ensure`: created or 409, the object
    not read back). py-spy with `--gil` during a 600-TrainJob burst had found the operator
    holding the GIL in 36% of the samples, 13% of those in `json.loads` and three quarters of
    that parsing the created objects (a Pod's answer is larger than the Pod sent).
    A/B against eaad4c7, alternating, 2 runs each (400 TrainJobs): operator CPU during the
    burst 0.47 / 0.48 core instead of 0.53 / 0.51 at 45.1 / 44.5 instead of 42.7 /
    44.9 TrainJobs/s, i.e. 10.3-10.8 instead of 11.4-12.3 ms of CPU per TrainJob (-10%);
    the burst's throughput and the ratios to the bounds moved within the noise (0.59 / 0.49
    vs 0.52 / 0.54 of the first bound, 0.67 / 0.64 vs 0.64 / 0.62 of the second).
19. `api/manifest.py` (2026-12-06): `parse_trainjob` JSON-encodes the TrainJob as it is (a
    `default` hook turns a Mapping view, such as a kopf body, into a dict) instead of
    deep-copying it into plain dicts in Python first: 70 -> 51 us per parse of the
    quickstart TrainJob (warm, `timeit`). py-spy with `--gil` (100 samples/s, 6 s of a
    400-TrainJob burst on 036913e) had caught the operator holding the GIL in 144 samples
    (about a quarter of the window): parsing the TrainJob 12% (the copy 8%), rendering 12%
    (the pod spec hashes 4%), the HTTP client 24%, kopf's event processing and watch streams
    17%, JSON decoding 7%. One eighth of a quarter of a core is below the run-to-run noise of
    the burst, so it was not A/B'd there.

Tried on 2026-12-06 and not kept: the Events off the reconcile's path (Kubernetes' own
controllers post theirs asynchronously, through client-go's event broadcaster). Its upper
bound, measured with the Events switched off altogether (a local patch, 400 TrainJobs,
alternating, 2 runs each): the burst at 65.7 / 68.4 TrainJobs/s without Events, 64.8 / 65.7
with them, against first bounds of 113.8-121.8. About 3%, within the noise, for Events that
would then arrive after the state they describe.

**Where the API server's time goes (issue 20, 2026-12-06, the latest round).** The benchmark
now samples its own CPU too, and per phase: during the burst the kube-apiserver used 1.16-1.18
cores and during the first bound 1.12-1.17, the same share of the 2 cores; the operator took
0.50-0.51 core in the burst, where in the bound the benchmark's process (the bound's client and
the benchmark's watches) took 0.47-0.50 (its watches alone 0.10-0.11 in the burst). So the
operator does not starve the API server: the burst is slower because each of its TrainJobs
costs the API server more work, 38-40 ms of its CPU against 23-25 ms for a TrainJob's children
alone (cores over TrainJobs/s). The per-write table above says what that work is: the
TrainJob's own POST (3.6-6.0 ms in this round's runs) and its status patch (5.0-8.8 ms) are
custom-resource writes, each costing the API server what 3-6 core objects do, and the Event
adds 1.1-2.6 ms. A CPU profile of the kube-apiserver under status patches (`go tool pprof`, 8
s, 8 threads patching; a local run with `--profiling=true`, not in the repository) had 60% of
its samples in the update path: decoding the stored TrainJob and the patch 29%, applying the
JSON merge patch 19% (marshal and unmarshal of the whole object), coercing it to the CRD's
schema 18%, reading the managed fields 13%, validating the update 10% (the figures overlap),
and the garbage collector another 10%. A JSON patch or a PUT of the status instead of the merge
patch cost the same (5.8-6.5 ms, 300 each, measured by hand), and so did a patch of the phase
alone: the cost is the object's, not the patch's. None of it is the operator's to cut: a status
costs one write, the fewest there can be.

So the benchmark measures a third bound, **the bound of the operator's writes** (above): every
request this operator makes the API server serve for a new TrainJob (13: the TrainJob, its 10
children, its status patch, its Event, as the operator's own planner makes them), and watches
standing for the operator's, by a client that costs nothing. Against it the operator reached
87-94% in the four runs of this round (100, 200 and twice 400 TrainJobs; 87% in the committed
run, the one of 200), against 51-68% of the first bound in the same runs. The first bound, the
issue's own, stays the goal's measure above: 80% of it is out of reach for any operator that
writes a status and an Event, since those and the TrainJob's own POST are about 30% of the API
server's work for a new TrainJob.

The benchmark's own watches spanned only the burst's namespace until this round, so the first
two bounds ran with no watcher of their children while the burst fed 8 of them. They span all
namespaces now. 400 TrainJobs, alternating, 2 runs each: the first bound at 53.9 and 72.3
TrainJobs/s with the watches in one namespace, 51.6 and 51.7 with them across all; the bound
with the TrainJobs 50.8 / 59.1 vs 40.9 / 44.7. The direction is the expected one (every event
is encoded and sent to every watcher) and the size within the noise of these runs.

**Running TrainJobs (change 20, 2026-12-06).** The benchmark has a last phase, drivers at work:
it stands in for the drivers of 100 TrainJobs, patching each one's `status.progress` every 2 s
as the in-pod driver's status publisher does while `report()` is called, for 20-30 s. Until now
every such update made the TrainJob's next timer tick reconcile it (a GET, 6 child LISTs),
though no plan reads the driver's progress or checkpoints: one reconcile per running TrainJob
every 5 s, about 200 reconciles/s at 1,000 running TrainJobs, which no benchmark phase had run
(its pods stay Pending). `reconcile/plan.py` now names the status keys no plan reads
(`UNPLANNED_STATUS_KEYS`: `progress`, `latestCheckpoint`, `bestCheckpoint`, `workerFailures`;
`tests/reconcile/test_plan.py` checks in seven states that changing them changes no plan, and
that the driver's `validations`, which sizes the pool, does), and the timer's fingerprint
leaves them out. A/B against 743b269 (a worktree of it with the same benchmark file),
alternating, 2 runs each, 300 TrainJobs, 100 of them with a driver at work for 20 s (1,000
patches): timer reconciles 18.8 / 19.4 per second before, 0 after; the operator's CPU 0.29 /
0.29 core before, 0.09 / 0.09 after; the kube-apiserver's 0.78 / 0.75 before, 0.51 / 0.50 after
(what is left is the patches themselves and their watch events). The committed run above
predates the phase, so its tables have no column for it.
"""
    return text, headline


def plot_operator(data: dict[str, Any], out: Path) -> None:
    """operator_latency_cdf.png and operator_timeline.png."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for ph in data["phases"]:
        cdf = ph.get("cdf_s") or []
        if len(cdf) < 2:
            continue
        ys = [i / (len(cdf) - 1) for i in range(len(cdf))]
        ax.plot(cdf, ys, label=f"{ph['phase']} ({ph['jobs']} TrainJobs)")
    ax.set_xscale("log")
    ax.set_xlabel("create -> all children exist, seconds (log)")
    ax.set_ylabel("fraction of TrainJobs")
    ax.set_title("Operator reconcile latency (CDF)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "operator_latency_cdf.png", dpi=110)
    plt.close(fig)

    samples = data.get("samples") or []
    if not samples:
        return
    t0 = samples[0]["t"]
    ts = [s["t"] - t0 for s in samples]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.plot(ts, [s["created"] for s in samples], label="TrainJobs created")
    ax.plot(ts, [s["done"] for s in samples], label="TrainJobs with all children")
    ax.set_xlabel("seconds")
    ax.set_ylabel("TrainJobs")
    ax2 = ax.twinx()
    ax2.plot(ts, [s["rss_mib"] for s in samples], color="tab:red", label="operator RSS")
    ax2.set_ylabel("operator RSS, MiB", color="tab:red")
    lines = ax.get_legend_handles_labels()
    lines2 = ax2.get_legend_handles_labels()
    ax.legend(lines[0] + lines2[0], lines[1] + lines2[1], fontsize=8, loc="upper left")
    ax.set_title("Operator: TrainJobs over time and memory")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "operator_timeline.png", dpi=110)
    plt.close(fig)
