"""Import ``scripts/gen_reference.py`` (a script, not a package module) for the docs tests."""

from __future__ import annotations

import importlib.util
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
