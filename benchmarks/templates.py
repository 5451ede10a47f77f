"""The prose of ``docs/benchmarks.md``: markdown templates in ``benchmarks/narrative/``.

Each ``<name>.md`` there is one part of the document (a section, the notes, the document's
frame) in Python's format syntax: ``{name}`` or ``{params[key]:.1f}`` is a figure or a table
the render code computes from ``benchmarks/results/*.json``; ``{{`` and ``}}`` are literal
braces. An HTML comment on lines of its own (``<!-- ... -->``) is a note for whoever edits the
template (where a hand-typed figure comes from) and is left out of the document.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

NARRATIVE_DIR = Path(__file__).resolve().parent / "narrative"

_NOTE = re.compile(r"^<!--.*?-->\n", re.DOTALL | re.MULTILINE)


def read(name: str) -> str:
    """The text of ``narrative/<name>.md`` without its editor's notes."""
    return _NOTE.sub("", (NARRATIVE_DIR / f"{name}.md").read_text())


def fill(name: str, **values: Any) -> str:
    """``narrative/<name>.md`` with its fields filled from ``values``."""
    return read(name).format_map(values)
