"""One vocabulary: the operator spells its API names, keys and time format only in constants.py,
and parses Kubernetes quantities only in api/quantity.py (issue 15, item 5)."""

from __future__ import annotations

import ast
import datetime as dt
from pathlib import Path

import pytest

from trainjob_operator import constants
from trainjob_operator.api import TrainJob
from trainjob_operator.api.quantity import parse_quantity

REPO = Path(__file__).resolve().parents[1]
HOMES = {"trainjob_operator/constants.py", "trainjob_operator/api/quantity.py"}
# String constants that have one home; the pydantic model's ``Literal[...]`` fields must spell
# the apiVersion and kind out (checked against the constants below).
SPELLED_ONCE = (
    constants.LABEL_PREFIX,
    constants.TIMESTAMP_FORMAT,
    constants.PLURAL,
    constants.VERSION,
)


def string_literals(tree: ast.AST) -> list[ast.Constant]:
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    in_literal_fields = {  # ``x: Literal["..."] = Field(default="...")``: spelled out for typing
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.AnnAssign) and ast.unparse(node.annotation).startswith("Literal[")
        for inner in ast.walk(node)
    }
    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
        if id(node) not in docstrings | in_literal_fields
    ]


def test_names_and_keys_are_spelled_only_in_constants() -> None:
    found = []
    for path in sorted((REPO / "trainjob_operator").rglob("*.py")):
        rel = str(path.relative_to(REPO))
        if rel in HOMES:
            continue
        for node in string_literals(ast.parse(path.read_text(), rel)):
            for word in SPELLED_ONCE:
                if node.value == word or (word.endswith("/") and word in node.value):
                    found.append(f"{rel}:{node.lineno}: {node.value!r}")
    assert not found, found


def test_the_models_literals_are_the_constants() -> None:
    job = TrainJob.model_validate(
        {"metadata": {"name": "a"}, "spec": {"entrypoint": "m:f", "scaling": {"numWorkers": 1}}}
    )
    assert job.api_version == constants.API_VERSION
    assert job.kind == constants.KIND


def test_times_round_trip() -> None:
    moment = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    assert constants.format_time(moment) == "2026-01-02T03:04:05Z"
    assert constants.parse_time("2026-01-02T03:04:05Z") == moment
    assert constants.parse_time(constants.now()) <= dt.datetime.now(dt.UTC)


@pytest.mark.parametrize(
    ("value", "number"),
    [
        (4, 4.0),
        ("2", 2.0),
        ("500m", 0.5),
        ("1.5", 1.5),
        ("+.5", 0.5),
        ("1k", 1000.0),
        ("1Gi", 2.0**30),
        ("256Mi", 256 * 2.0**20),
        ("1e3", 1000.0),
        (" 250m ", 0.25),
    ],
)
def test_parse_quantity(value: int | str, number: float) -> None:
    assert parse_quantity(value) == pytest.approx(number)


@pytest.mark.parametrize("value", ["", "-1", "1GB", "one", "1.5x"])
def test_parse_quantity_rejects_non_quantities(value: str) -> None:
    with pytest.raises(ValueError, match="not a Kubernetes quantity"):
        parse_quantity(value)
