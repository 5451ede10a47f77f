"""The soak's section of ``docs/benchmarks.md`` (``benchmarks/results/soak.json``, written by
``benchmarks/soak.py``): :func:`render_soak` computes its tables, fills
``benchmarks/narrative/soak.md`` and returns ``(markdown, headline rows)``."""

from __future__ import annotations

from typing import Any

from benchmarks import templates
from benchmarks.sections import f, table


def render_soak(data: dict[str, Any], img_rel: str) -> tuple[str, list[list[str]]]:
    """The soak section and its headline row (no Ray Train comparison: it has no operator)."""
    del img_rel  # no plot
    fault_rows = [
        [
            f"{r['at_s'] / 60:.1f}",
            r["fault"],
            "n/a" if r.get("step") is None else str(r["step"]),
            r.get("error") or r.get("what", ""),
            "n/a" if r.get("next_step_s") is None else f(r["next_step_s"], 0),
        ]
        for r in data["faults"]
    ]
    history_rows = [
        [h.get("reason", ""), str(h.get("counted", "")), h.get("message", "")[:160]]
        for h in data["restart_history"]
    ]
    goodput = data.get("goodput")
    invariant = "holds" if data["invariant_holds"] else "**broken**"
    text = templates.fill(
        "soak",
        d=data,
        p=data["params"],
        goodput="n/a" if goodput is None else f"{goodput:.1%}",
        invariant=invariant,
        rate="n/a"
        if data["failure_free_steps_per_s"] is None
        else f(data["failure_free_steps_per_s"] * 60, 2),
        fault_table=table(
            ["minute", "fault", "at step", "what was done", "s to the next step"], fault_rows
        ),
        history_table=table(["reason", "counted", "message"], history_rows)
        if history_rows
        else "(none)",
    )
    headline = [
        [
            f"soak: {len(data['faults'])} faults in {data['minutes']:.0f} min on the real node",
            f"goodput {'n/a' if goodput is None else f'{goodput:.1%}'}; "
            f"{data['checkpoints_committed']} checkpoints, the commit invariant {invariant}",
            "n/a (no operator)",
            "n/a",
        ]
    ]
    return text, headline
