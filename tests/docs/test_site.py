"""The docs site builds with warnings as errors: a broken link or anchor, a missing snippet or a
page left out of the navigation fails (``mkdocs build --strict``, as ``make docs`` runs it)."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs._gen import REPO

MISSING = importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None


@pytest.mark.skipif(MISSING, reason="mkdocs is not installed: pip install -e '.[docs]'")
def test_site_builds_strictly(tmp_path: Path) -> None:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "-d", str(tmp_path)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "reference" / "trainjob-api.html").is_file()
    api = (tmp_path / "reference" / "python-api.html").read_text(encoding="utf-8")
    assert "get_checkpoint" in api  # mkdocstrings rendered the runtime's docstrings
    # Sphinx roles (:class:`X`) of the docstrings became links or code (scripts/
    # griffe_sphinx_roles.py), none is shown literally
    assert re.search(r":(class|func|meth|attr|data|mod|exc|obj):", api) is None
    assert "::</p>" not in api  # nor reStructuredText's literal-block marker
    assert (
        '<a class="autorefs autorefs-internal" title="PreemptionError '
        '(trainer_runtime.errors.PreemptionError)" href="#trainer_runtime.errors.PreemptionError">'
        "<code>PreemptionError</code></a>"
    ) in api
