"""What the docs tests share: the reference generator (``scripts/gen_reference.py``, a script,
not a package module, loaded from its file) and the fenced blocks of the hand-written pages."""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"


def load_generator() -> ModuleType:
    """The reference generator, loaded from its file."""
    path = REPO / "scripts" / "gen_reference.py"
    spec = importlib.util.spec_from_file_location("gen_reference", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


#: pages generated from the code (tests/docs/test_reference.py, benchmarks/run_all.py)
GENERATED = {
    "benchmarks.md",
    "concepts/state-machine.md",
    "reference/cli.md",
    "reference/conditions-events.md",
    "reference/helm-values.md",
    "reference/metrics.md",
    "reference/trainjob-api.md",
}
FENCE = re.compile(r"^```[ ]?(\{[^}]*\}|[a-z]*)\s*$")


def blocks() -> Iterator[tuple[str, int, str, list[str]]]:
    """(page, line, language, lines) of every fenced block of the hand-written pages."""
    for path in [REPO / "README.md", *sorted(DOCS.rglob("*.md"))]:
        page = str(path.relative_to(DOCS)) if path.is_relative_to(DOCS) else "../README.md"
        if page in GENERATED or page.startswith("snippets/"):
            continue
        lines = path.read_text(encoding="utf-8").splitlines()
        index = 0
        while index < len(lines):
            match = FENCE.match(lines[index].strip())
            if match and match.group(1):
                start, language = index, match.group(1).strip("{} .")
                index += 1
                body = []
                while lines[index].strip() != "```":
                    body.append(lines[index])
                    index += 1
                yield page, start + 1, language, body
            index += 1
