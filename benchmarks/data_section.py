"""The Ray Data ingestion section of ``docs/benchmarks.md`` (``benchmarks/results/data.json``,
written by ``benchmarks/bench_data.py``): :func:`render_data` computes its table, fills
``benchmarks/narrative/data.md`` and returns ``(markdown, headline rows)``."""

from __future__ import annotations

from typing import Any

from benchmarks import templates
from benchmarks.sections import f, ratio, table

NAMES = {"ours": "trainer_runtime", "ray_train": "Ray Train 2.60"}


def render_data(data: dict[str, Any], img_rel: str) -> tuple[str, list[list[str]]]:
    """The section and its headline row: rows per second to 2 workers, ours vs Ray Train."""
    del img_rel  # no plot
    summary = {row["framework"]: row for row in data["summary"]}
    rows = [
        [
            NAMES[name],
            f"{row['rows_per_s']:,.0f}",
            f"{row['first_epoch_rows_per_s']:,.0f}",
            f(row["step_ms_p50"], 2),
            f(row["step_ms_p99"], 2),
            f(row["step_ms_max"], 1),
            f(row["fit_s"], 1),
        ]
        for name, row in summary.items()
    ]
    each_fit = [
        [
            NAMES[r["framework"]],
            str(r["repeat"]),
            f"{r['rows_per_s']:,.0f}",
            f(r["step_ms_p50"], 2),
            f(r["step_ms_p99"], 2),
            f(r["fit_s"], 1),
        ]
        for r in data["runs"]
    ]
    ours, theirs = summary.get("ours"), summary.get("ray_train")
    verdict = "n/a (Ray Train not measured)"
    headline: list[list[str]] = []
    if ours is not None and theirs is not None:
        faster = ours["rows_per_s"] >= theirs["rows_per_s"]
        verdict = (
            f"{ratio(ours['rows_per_s'], theirs['rows_per_s'])} Ray Train's rows per second "
            f"({'not slower' if faster else '**slower**'}); step p50 "
            f"{ratio(theirs['step_ms_p50'], ours['step_ms_p50'])} of Ray Train's (above 1: shorter)"
        )
        headline.append(
            [
                f"Ray Data ingestion to {data['params']['workers']} workers, rows/s "
                "(streaming split, later epochs)",
                f"{ours['rows_per_s']:,.0f}",
                f"{theirs['rows_per_s']:,.0f}",
                ratio(ours["rows_per_s"], theirs["rows_per_s"]),
            ]
        )
    text = templates.fill(
        "data",
        p=data["params"],
        main_table=table(
            [
                "framework",
                "rows/s (later epochs)",
                "rows/s (first epoch)",
                "step p50 ms",
                "step p99 ms",
                "step max ms",
                "fit s",
            ],
            rows,
        ),
        fits_table=table(
            ["framework", "repeat", "rows/s", "step p50 ms", "step p99 ms", "fit s"], each_fit
        ),
        verdict=verdict,
    )
    return text, headline
