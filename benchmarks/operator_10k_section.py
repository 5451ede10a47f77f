"""The operator at 10,000 TrainJobs, beside the 1,000 of section 5 (issue 40):
``benchmarks/results/operator_10k.json`` (``bench_operator.py --total 10000 --name
operator_10k``) and ``operator.json``. :func:`render_operator_10k` fills
``benchmarks/narrative/operator_10k.md`` and returns ``(markdown, headline rows)``."""

from __future__ import annotations

from typing import Any

from benchmarks import common, templates
from benchmarks.sections import f, table

#: The issue's goal for the operator's memory at 10,000 TrainJobs.
GOAL_RSS_MIB = 200.0


def _probe(data: dict[str, Any] | None) -> dict[str, Any] | None:
    """The phase of TrainJobs created one at a time once ``--total`` existed."""
    if data is None:
        return None
    return next((p for p in data["phases"] if p["phase"].startswith("one at a time at")), None)


def _phase(data: dict[str, Any] | None, name: str) -> dict[str, Any] | None:
    if data is None:
        return None
    return next((p for p in data["phases"] if p["phase"] == name), None)


def _ms(phase: dict[str, Any] | None, key: str) -> str:
    return "n/a" if phase is None or phase.get(key) is None else f(phase[key] * 1000, 0)


def _reconciles(data: dict[str, Any] | None) -> str:
    if data is None:
        return "n/a"
    return f(sum(v or 0.0 for v in data["steady_reconciles_per_s"].values()), 1)


def _cores(data: dict[str, Any] | None, who: str) -> str:
    if data is None:
        return "n/a"
    return f(data["steady_cpu"].get(who), 2)


def render_operator_10k(data: dict[str, Any], img_rel: str) -> tuple[str, list[list[str]]]:
    """The section: 1,000 and 10,000 TrainJobs side by side, and its headline row."""
    del img_rel  # no plot
    small = common.read_result("operator")
    columns = [(small, "operator.json"), (data, "operator_10k.json")]
    header = ["figure"] + [
        f"{d['total_jobs']:,} TrainJobs" if d else f"({name}: not run)" for d, name in columns
    ]
    rows = [
        ["operator RSS at the total, MiB"]
        + [f(d["rss_at_total_mib"], 1) if d else "n/a" for d, _ in columns],
        ["operator RSS peak, MiB"] + [f(d["rss_peak_mib"], 1) if d else "n/a" for d, _ in columns],
        ["a new TrainJob's children, p50 ms (one at a time, the others there)"]
        + [_ms(_probe(d), "p50_s") for d, _ in columns],
        ["the same, p99 ms"] + [_ms(_probe(d), "p99_s") for d, _ in columns],
        ["the same on an idle operator (phase 1), p50 / p99 ms"]
        + [
            f"{_ms(_phase(d, 'sequential'), 'p50_s')} / {_ms(_phase(d, 'sequential'), 'p99_s')}"
            for d, _ in columns
        ],
        ["TrainJobs created in the scale phase per second"]
        + [f(p["jobs_per_s"], 1) if (p := _phase(d, "scale")) else "n/a" for d, _ in columns],
        ["reconciles/s in steady state (nothing changing)"] + [_reconciles(d) for d, _ in columns],
        ["cores in steady state: operator"] + [_cores(d, "operator") for d, _ in columns],
        ["cores in steady state: kube-apiserver"]
        + [_cores(d, "kube_apiserver") for d, _ in columns],
        ["cores in steady state: etcd"] + [_cores(d, "etcd") for d, _ in columns],
    ]
    rss = data["rss_at_total_mib"]
    rss_ok = rss is not None and rss <= GOAL_RSS_MIB
    probe_small, probe_large = _probe(small), _probe(data)
    if small is not None and probe_small and probe_large:
        p99_text = (
            f"{probe_large['p99_s'] * 1000:.0f} ms at {data['total_jobs']:,} against "
            f"{probe_small['p99_s'] * 1000:.0f} ms at {small['total_jobs']:,}"
        )
    else:
        p99_text = "n/a (run both with the probe phase)"
    text = templates.fill(
        "operator_10k",
        p=data["params"],
        table=table(header, rows),
        rss_verdict=(
            f"{f(rss, 1)} MiB, {'within' if rss_ok else '**over**'} the goal of "
            f"{GOAL_RSS_MIB:.0f} MiB"
        ),
        p99_text=p99_text,
    )
    headline = [
        [
            f"operator RSS at {data['total_jobs']:,} TrainJobs",
            f"{f(rss, 1)} MiB",
            "n/a (no operator)",
            "n/a",
        ]
    ]
    return text, headline
