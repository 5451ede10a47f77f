"""The reference pages generated from the code (``scripts/gen_reference.py``) are committed and
must match what the code generates now: a field, flag, Helm value, metric or reason added,
removed or re-described without regenerating fails here."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.docs._gen import DOCS, load_generator

REGENERATE = "run `python scripts/gen_reference.py` to regenerate it"


def test_generated_pages_match_the_code(tmp_path: Path) -> None:
    gen = load_generator()
    assert gen.main(["--out", str(tmp_path)]) == 0
    for name in gen.PAGES:
        committed = DOCS / name
        assert committed.is_file(), f"docs/{name} is missing; {REGENERATE}"
        assert committed.read_text(encoding="utf-8") == (tmp_path / name).read_text(
            encoding="utf-8"
        ), f"docs/{name} differs from the code; {REGENERATE}"


def test_check_mode_reports_drift(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    gen = load_generator()
    assert gen.main(["--out", str(tmp_path), "--check"]) == 1  # nothing written yet
    assert gen.main(["--out", str(tmp_path)]) == 0
    assert gen.main(["--out", str(tmp_path), "--check"]) == 0
    page = tmp_path / "reference" / "cli.md"
    page.write_text(page.read_text(encoding="utf-8") + "stale\n", encoding="utf-8")
    capsys.readouterr()
    assert gen.main(["--out", str(tmp_path), "--check"]) == 1
    assert "reference/cli.md" in capsys.readouterr().err


def test_every_spec_field_has_a_sample_change() -> None:
    """The "on change" column renders a sample TrainJob before and after changing each spec
    field; a new field without a sample change (or a sample of a removed field) fails."""
    gen = load_generator()
    text = gen.api_page()
    assert "| `image` | string |" in text
    # the column is computed, not written: an image change replaces every pod, a TTL none
    image_row = next(line for line in text.splitlines() if line.startswith("| `image` |"))
    assert image_row.endswith("| head, workers, validation, data pool, driver |")
    ttl_row = next(
        line for line in text.splitlines() if line.startswith("| `ttlSecondsAfterFinished` |")
    )
    assert ttl_row.endswith("| none |")


def test_every_reason_and_metric_is_listed() -> None:
    from trainjob_operator.api.status import ConditionType, Phase, Reason

    gen = load_generator()
    conditions = gen.conditions_page()
    for enum in (Phase, ConditionType, Reason):
        for member in enum:
            assert f"| `{member.value}` |" in conditions
    # the kstatus conditions name the phases they are True in (the code's sets, not prose)
    from trainjob_operator.api.status import READY_PHASES

    ready = next(line for line in conditions.splitlines() if line.startswith("| `Ready` |"))
    assert ready.endswith(
        " | " + ", ".join(f"`{p.value}`" for p in Phase if p in READY_PHASES) + " |"
    )
    assert "| `Stalled` |" in conditions and conditions.count("kstatus (abnormal-true)") == 2
    metrics = gen.metrics_page()
    for name in ("trainjob_reconciles_total", "trainjob_jobs", "trainjob_pod_watch_events_total"):
        assert f"`{name}`" in metrics


def test_every_helm_value_is_listed() -> None:
    import yaml

    gen = load_generator()
    page = gen.helm_page()
    values = yaml.safe_load((gen.REPO / "charts/trainjob-operator/values.yaml").read_text())

    def keys(node: object, prefix: str = "") -> list[str]:
        if not isinstance(node, dict) or not node:
            return [prefix]
        return [k for key, value in node.items() for k in keys(value, f"{prefix}{key}.")]

    for key in keys(values):
        assert f"| `{key.rstrip('.')}` |" in page, key
