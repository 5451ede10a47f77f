"""The restore section of ``docs/benchmarks.md`` (``benchmarks/results/restore.json``).

Rendered as the sections of :mod:`benchmarks.sections`: :func:`render_restore` computes the
tables from the stored result, fills ``benchmarks/narrative/restore.md`` and returns
``(markdown, headline rows)``.
"""

from __future__ import annotations

from typing import Any

from benchmarks import templates
from benchmarks.sections import LABEL, f, ratio, table

#: The share of the raw bound a restore must reach.
GOAL_SHARE_OF_BOUND = 0.90

BOUND_LABEL = {
    "local_read_mib_s": "`open` + `read` of the files in place",
    "local_copyfile_mib_s": "`shutil.copyfile` of the files, then reading the copies",
    "gcs_download_to_filename_mib_s": "`Blob.download_to_filename` (a thread per object), "
    "then reading the files",
    "gcs_chunks_concurrently_mib_s": "`transfer_manager.download_chunks_concurrently` (8 "
    "threads, 32 MiB pieces), then reading the files",
    "gcs_fresh_process_mib_s": "`Blob.download_to_filename` as above in a new process, from "
    "its start (Python, importing google-cloud-storage, a client)",
}


def bound_label(key: str) -> str:
    """What a bound key measured."""
    if key.endswith("_nice0_mib_s"):
        return BOUND_LABEL[key.replace("_nice0", "")] + "; in the benchmark's process (nice 0)"
    return BOUND_LABEL.get(key, key) + "; in a Ray task (nice 15, as the train functions)"


def held_bound(storage: str, bound: dict[str, float]) -> tuple[str, float]:
    """``(key, MiB/s)`` of the bound a case is held to: reading in place for local storage
    (neither framework copies a local checkpoint), the faster download for GCS."""
    if storage == "local":
        return "local_read_mib_s", bound["local_read_mib_s"]
    keys = [k for k in bound if k.startswith("gcs_") and "fresh" not in k and "nice0" not in k]
    key = max(keys, key=bound.__getitem__)
    return key, bound[key]


def _row(summary: list[dict[str, Any]], storage: str, workers: int, fw: str) -> dict[str, Any]:
    return next(
        r for r in summary if (r["storage"], r["workers"], r["framework"]) == (storage, workers, fw)
    )


def _spread(r: dict[str, Any], key: str, digits: int = 2) -> str:
    return f"{f(r[key], digits)} ({f(r[key + '_min'], digits)}-{f(r[key + '_max'], digits)})"


def render_restore(data: dict[str, Any], img_rel: str) -> tuple[str, list[list[str]]]:
    """The restore section and its headline rows."""
    del img_rel  # no plot
    p = data["params"]
    summary = data["summary"]
    cases = list(dict.fromkeys((r["storage"], r["workers"]) for r in summary))
    main_rows, ratio_rows, bound_rows, headline = [], [], [], []
    shard = p["size_mib"]
    for storage, workers in cases:
        per_rank = f"{shard // workers} MiB" if workers > 1 else f"{shard} MiB"
        case = f"{storage}, {workers} rank{'s' if workers > 1 else ''} x {per_rank}"
        rows = {
            r["framework"]: r for r in summary if (r["storage"], r["workers"]) == (storage, workers)
        }
        bound = next(iter(rows.values()))["bound"]
        key, bound_mib_s = held_bound(storage, bound)
        for fw, r in rows.items():
            main_rows.append(
                [
                    case,
                    LABEL[fw],
                    _spread(r, "to_first_step_s"),
                    f(r["driver_setup_s"], 2),
                    f(r["fit_to_entered_s"], 2),
                    _spread(r, "restore_s"),
                    f(r["restore_mib_s"], 0),
                    f"{r['restore_mib_s'] / bound_mib_s:.0%}",
                ]
            )
        for bkey, value in bound.items():
            bound_rows.append(
                [case, bound_label(bkey), f(value, 0), "held to" if bkey == key else ""]
            )
        ours, ray = rows.get("ours"), rows.get("ray_train")
        if ours is None:
            continue
        share = ours["restore_mib_s"] / bound_mib_s
        met = share >= GOAL_SHARE_OF_BOUND and (
            ray is None or ours["to_first_step_s"] < ray["to_first_step_s"]
        )
        ratio_rows.append(
            [
                case,
                f"{share:.0%}",
                ratio(ray["to_first_step_s"], ours["to_first_step_s"]) if ray else "n/a",
                ratio(ray["restore_s"], ours["restore_s"]) if ray else "n/a",
                "**met**" if met else "**not met**",
            ]
        )
        if ray is not None:
            headline.append(
                [
                    f"new driver -> first step, resuming a {shard} MiB checkpoint ({case}; median)",
                    f"{ours['to_first_step_s']:.2f} s ({share:.0%} of the bound)",
                    f"{ray['to_first_step_s']:.2f} s",
                    ratio(ray["to_first_step_s"], ours["to_first_step_s"]) + " faster",
                ]
            )
    cpus = p.get("emulator_cpus")
    emulator_where = (
        f"its threads pinned to CPU {', '.join(map(str, cpus))}" if cpus else "not pinned"
    )
    text = templates.fill(
        "restore",
        p=p,
        emulator_where=emulator_where,
        main_table=table(
            [
                "case",
                "framework",
                "driver start -> first step, s",
                "-> `fit()`",
                "`fit()` -> train fn",
                "restore, s",
                "MiB/s",
                "of the bound",
            ],
            main_rows,
        ),
        ratio_table=table(
            [
                "case",
                "ours / bound (MiB/s)",
                "first step: Ray Train / ours",
                "restore: Ray Train / ours",
                f">= {GOAL_SHARE_OF_BOUND:.0%} of the bound and ahead of Ray Train",
            ],
            ratio_rows,
        ),
        bound_table=table(["case", "the library alone", "MiB/s (median)", ""], bound_rows),
    )
    return text, headline
