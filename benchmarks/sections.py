"""Markdown sections and plots of ``docs/benchmarks.md`` for the validation, start-up, local
mode and operator benchmarks (``run_all.py`` renders the report() and checkpoint sections),
plus the table and number formatting every section shares.

Each ``render_*`` function takes a stored result (``benchmarks/results/<name>.json``),
computes its tables and figures, fills them into the section's template
(``benchmarks/narrative/<section>.md``, see :mod:`benchmarks.templates`) and returns
``(markdown, headline rows)``; a headline row is ``[figure, trainer_runtime, Ray Train,
ratio]`` for the summary table at the top of the document. Each ``plot_*`` function writes PNGs
into the image folder.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks import common, templates

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
    text = templates.fill(
        "validation",
        p=p,
        work=work,
        main_table=main_table,
        ratio_table=ratio_table,
        img_rel=img_rel,
        tuned_note=tuned_note,
    )
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
    text = templates.fill(
        "startup",
        p=p,
        main_table=table(["seconds", "trainer_runtime", "Ray Train", "Ray Train / ours"], rows),
        img_rel=img_rel,
    )
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
    second = templates.fill("startup_pods_later_groups", after=after) if ours2 else ""
    columns = ["seconds", "fit", "idle workers", "train function entered", "first step"]
    columns.append("whole fit()")
    text = templates.fill(
        "startup_pods", p=p, env=env, versus=versus, second=second, main_table=table(columns, rows)
    )
    return text, headline


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
        split_txt = templates.fill(
            "local_per_report",
            bound=f(bound, 0),
            split_rows_table=table(
                ["variant", "report() us", "report(checkpoint=) us", "x the bound"], split_rows
            ),
        )
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
    text = templates.fill(
        "local", p=p, log_note=log_note, main_table=main_table, split_txt=split_txt, img_rel=img_rel
    )
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
        bound_txt = templates.fill(
            "operator_bound",
            bound=bound,
            span=f(bound["span_s"], 2),
            creates_per_s=f(bound["creates_per_s"], 0),
            jobs_per_s=f(bound["jobs_per_s"], 1),
            post_ms_p50=f(bound["post_ms_p50"], 1),
            operator_pct=f(100 * (bound.get("operator_ratio") or 0), 0),
        )
    bound_tj = data.get("bound_with_trainjobs")
    if bound and bound_tj:
        bound_txt += templates.fill(
            "operator_bound_with_trainjobs",
            bound_tj=bound_tj,
            span=f(bound_tj["span_s"], 2),
            jobs_per_s=f(bound_tj["jobs_per_s"], 1),
            submit=f(bound_tj["submit_s"], 2),
            operator_pct=f(100 * (bound_tj.get("operator_ratio") or 0), 0),
        )
    bound_ops = data.get("bound_of_the_writes")
    if bound and bound_ops:
        bound_txt += templates.fill(
            "operator_bound_of_the_writes",
            bound_ops=bound_ops,
            span=f(bound_ops["span_s"], 2),
            jobs_per_s=f(bound_ops["jobs_per_s"], 1),
            operator_pct=f(100 * (bound_ops.get("operator_ratio") or 0), 0),
        )
    if write_rows:
        children_pct = f(100 * (children_share or 0), 0)
        n_watches = len(data["children_per_job"]) + 1
        bound_txt += templates.fill(
            "operator_write_costs",
            p=p,
            write_rows_table=table(
                [
                    "write",
                    "kube-apiserver ms",
                    "etcd ms",
                    "per TrainJob",
                    "kube-apiserver ms per TrainJob",
                ],
                write_rows,
            ),
            children_pct=children_pct,
            n_watches=n_watches,
        )
    text = templates.fill(
        "operator",
        k8s_version=p.get("k8s_version", "1.20.2"),
        p=p,
        children=sum(data["children_per_job"].values()),
        kinds=kinds,
        main_table=main_table,
        bound_txt=bound_txt,
        rss_idle=f(data["rss_idle_mib"], 1),
        rss_after_burst=f(data.get("rss_after_burst_mib"), 1),
        rss_at_total=f(data.get("rss_at_total_mib"), 1),
        total=total,
        rss_peak=f(data.get("rss_peak_mib"), 1),
        rss_per_job=f(data.get("rss_per_job_kib"), 0),
        steady=steady_txt or "none",
        expected_timer=expected_timer,
        steady_reconcile_mean=f(mean_rec, 3),
        all_reconcile_mean=f(data.get("all_reconcile_mean_s"), 3),
        running_txt=running_txt,
        cpu_table=table(cpu_header, cpu_rows),
        img_rel=img_rel,
        namespace_pods=rc.get("namespace_pods", "?"),
        cost_table=table(["request", "ms"], cost_rows),
        coalesced=f(coalesced, 0),
        busy_ticks=f(busy_ticks or 0, 0),
        skipped_timer=f(skipped_timer, 0),
        ran=f(ran, 0),
        reconciles_per_job=per_job or "none",
        timer_per_s=total / 60,
        ratio_pct=f(100 * ratio_now, 0),
        verdict_ratio=verdict_ratio,
        p99=f(p99_now, 1),
        verdict_p99=verdict_p99,
    )
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


# -- 7. many ranks ----------------------------------------------------------------------------
#: The configurations of ``bench_scale.py``: (key, column label) in table order.
SCALE_CONFIGS = (
    ("ours", "trainer_runtime"),
    ("ray_default", "Ray Train, poll 2 s (default)"),
    ("ray_tuned", "Ray Train, poll {poll:g} s"),
)


def _scale_runs(data: dict[str, Any]) -> dict[tuple[int, str], dict[str, Any]]:
    """``(ranks, configuration key) -> run`` (keys as in :data:`SCALE_CONFIGS`)."""
    out = {}
    for run in data["runs"]:
        if run["framework"] == "ours":
            key = "ours"
        else:
            key = "ray_default" if run["ray_poll_s"] is None else "ray_tuned"
        out[(run["workers"], key)] = run
    return out


def _scale_verdicts(
    runs: dict[tuple[int, str], dict[str, Any]], sizes: list[int], prestarted: int, poll: float
) -> tuple[list[str], list[str]]:
    """Per figure: does ours lead every Ray Train configuration at every size, and does its
    cost per round / per start grow no faster than the ranks (first size -> last size)?

    ``prestarted``: the Ray worker processes Ray starts with the cluster (its logical CPUs);
    the start-up's growth is taken from the first size above it, whose ranks cannot all
    start in those."""
    figures = (
        ("rounds/s", "rounds_per_s", True),
        ("last report() -> commit p50", "commit_ms_p50", False),
        ("fit() -> first step", "to_first_step_s", False),
    )
    lead, linear = [], []
    for label, key, higher in figures:
        lost = [
            f"{n} ranks vs {dict(SCALE_CONFIGS)[other].format(poll=poll)}"
            for n in sizes
            for other in ("ray_default", "ray_tuned")
            if (n, "ours") in runs
            and (n, other) in runs
            and (
                runs[(n, "ours")][key] < runs[(n, other)][key]
                if higher
                else runs[(n, "ours")][key] > runs[(n, other)][key]
            )
        ]
        lead.append(f"{label}: " + ("**met**" if not lost else f"**not met** ({', '.join(lost)})"))
        base = sizes
        if key == "to_first_step_s":
            base = [n for n in sizes if n > prestarted] or sizes
        first, last = base[0], sizes[-1]
        if first != last and (first, "ours") in runs and (last, "ours") in runs:
            a, b = runs[(first, "ours")][key], runs[(last, "ours")][key]
            growth = a / b if higher else b / a  # how much more time a round/start takes
            allowed = last / first
            verdict = "**met**" if growth <= allowed else "**not met**"
            linear.append(
                f"{label}: {growth:.1f}x from {first} to {last} ranks ({allowed:g}x the ranks): "
                f"{verdict}"
            )
    return lead, linear


def render_scale(data: dict[str, Any], img_rel: str) -> tuple[str, list[list[str]]]:
    """Section 7 (many ranks) and its headline rows."""
    p = data["params"]
    runs = _scale_runs(data)
    sizes = sorted({n for n, _ in runs})
    labels = [label.format(poll=p["ray_poll_s"]) for _, label in SCALE_CONFIGS]
    keys = [k for k, _ in SCALE_CONFIGS]

    def figure_table(fmt: Any, key: str, higher: bool, extra: Any = None) -> str:
        rows = []
        for n in sizes:
            ours = runs.get((n, "ours"))
            row = [str(n)] + [fmt(runs[(n, k)]) if (n, k) in runs else "n/a" for k in keys]
            for other in ("ray_default", "ray_tuned"):
                theirs = runs.get((n, other))
                if ours is None or theirs is None:
                    row.append("n/a")
                elif higher:
                    row.append(ratio(ours[key], theirs[key]))
                else:
                    row.append(ratio(theirs[key], ours[key]))
            if extra is not None:
                row.append(extra(ours) if ours else "n/a")
            rows.append(row)
        header = ["ranks", *labels, f"vs {labels[1]}", f"vs {labels[2]}"]
        if extra is not None:
            header.append("trainer_runtime, per rank")
        return table(header, rows)

    rounds_table = figure_table(
        lambda r: f(r["rounds_per_s"], 1),
        "rounds_per_s",
        True,
        lambda r: f"{f(r['rounds_per_s'] * r['workers'], 0)} reports/s",
    )
    commit_table = figure_table(
        lambda r: f"{f(r['commit_ms_p50'], 1)} ({f(r['commit_ms_max'], 1)})", "commit_ms_p50", False
    )
    start_table = figure_table(
        lambda r: f(r["to_first_step_s"], 2),
        "to_first_step_s",
        False,
        lambda r: f"{f(1000 * r['to_first_step_s'] / r['workers'], 0)} ms per rank",
    )
    memory_rows = [
        [
            str(n),
            *(
                f"{f(runs[(n, k)].get('mem_available_min_gib'), 1)} GiB; "
                f"load {f(runs[(n, k)].get('loadavg_1m_after'), 1)}"
                if (n, k) in runs
                else "n/a"
                for k in keys
            ),
        ]
        for n in sizes
    ]
    lead, linear = _scale_verdicts(runs, sizes, p["ray_num_cpus"], p["ray_poll_s"])
    skipped = "".join(
        f"* {s['framework']}, {s['workers']} ranks: {s['why']}\n" for s in data.get("skipped") or []
    )
    biggest = sizes[-1] if sizes else 0
    headline = []
    for label, key, unit, higher in (
        ("report rounds/s", "rounds_per_s", "", True),
        ("last rank's `report()` -> checkpoint committed, p50", "commit_ms_p50", " ms", False),
        ("`fit()` -> first step", "to_first_step_s", " s", False),
    ):
        ours = runs.get((biggest, "ours"))
        default = runs.get((biggest, "ray_default"))
        tuned = runs.get((biggest, "ray_tuned"))
        if ours is None or default is None:
            continue
        digits = 2 if key == "to_first_step_s" else 1
        theirs = f"{f(default[key], digits)}{unit}"
        ratios = ratio(ours[key], default[key]) if higher else ratio(default[key], ours[key])
        if tuned is not None:
            theirs += f" (poll {p['ray_poll_s']:g} s: {f(tuned[key], digits)}{unit})"
            ratios += (
                f" ({ratio(ours[key], tuned[key]) if higher else ratio(tuned[key], ours[key])})"
            )
        headline.append(
            [
                f"{label}, {biggest} ranks, lightweight workers",
                f"{f(ours[key], digits)}{unit}",
                theirs,
                ratios + (" more" if higher else " faster"),
            ]
        )
    text = templates.fill(
        "scale",
        p=p,
        sizes=", ".join(map(str, sizes)),
        rounds_table=rounds_table,
        commit_table=commit_table,
        start_table=start_table,
        memory_table=table(["ranks", *labels], memory_rows),
        lead="\n".join(f"* {x}" for x in lead),
        linear="\n".join(f"* {x}" for x in linear),
        skipped=skipped or "* none\n",
        img_rel=img_rel,
    )
    return text, headline


def plot_scale(data: dict[str, Any], out: Path) -> None:
    """scale.png: the three figures against the ranks (log-log), one line per configuration."""
    plt = _plt()
    runs = _scale_runs(data)
    sizes = sorted({n for n, _ in runs})
    poll = data["params"]["ray_poll_s"]
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    for ax, (key, title, ylabel) in zip(
        axes,
        (
            ("rounds_per_s", "report rounds per second", "rounds/s (log)"),
            ("commit_ms_p50", "last report() -> commit, p50", "ms (log)"),
            ("to_first_step_s", "fit() -> first step", "seconds (log)"),
        ),
        strict=True,
    ):
        for conf, label in SCALE_CONFIGS:
            xs = [n for n in sizes if (n, conf) in runs]
            ax.plot(
                xs, [runs[(n, conf)][key] for n in xs], marker="o", label=label.format(poll=poll)
            )
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(sizes)
        ax.set_xticklabels([str(n) for n in sizes])
        ax.set_xlabel("ranks")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "scale.png", dpi=110)
    plt.close(fig)
