"""The shell commands of the guides: every command line of the ``bash`` blocks of the README and
the hand-written pages, and which of them ``tests/k8s/test_docs_commands.py`` runs.

A command runs there when all its programs are in :data:`RUN`; otherwise each of its simple
commands that does not run must be in :data:`NOT_RUN`, with the reason and where what it does is
tested instead (``test_snippets.py::test_every_command_is_run_or_listed`` keeps that table
complete and without stale entries, in the quick tier).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass

from tests.docs._gen import blocks

NOT_RUN: dict[str, str] = {
    "make demo": "trains the quickstart on Ray (trainjob run examples/quickstart.yaml): "
    "tests/test_cli_run.py runs it; test_snippets.py checks the capture shown",
    "make test": "the whole suite, which this test is part of",
    "make test-quick": "the quick tier, which the docs' checks that need no cluster are part of",
    "make docs": "tests/docs/test_site.py builds the site as it does (mkdocs build --strict)",
    "make soak": "a job of about 25 minutes on the real node (benchmarks/soak.py): the node tier "
    "runs the same faults (tests/cluster/test_real_node.py); its rendering is tested in "
    "tests/docs/test_benchmarks_page.py",
    ".venv/bin/python -m tests.suite": "runs tiers of the suite, which this test is part of",
    ".venv/bin/python -m pytest": "runs the real-node tier's tests",
    "trainjob run": "trains on Ray: tests/test_cli_run.py runs it (test_snippets.py parses the "
    "flags of this usage line)",
    "docker build": "builds an image (minutes, gigabytes): the node tier builds the same targets "
    "(scripts/build-images.sh) and runs them (tests/cluster/test_real_node.py); "
    "tests/chart/test_dockerfile.py checks the targets and the JAX build argument",
    "docker push": "needs a registry",
    "gcloud": "GKE only: node pools and IAM bindings of a Google Cloud project",
    "kubectl logs": "envtest runs no pod (no kubelet): the real-node tier reads the driver's log "
    "(tests/cluster/test_real_node.py)",
    "kubectl -n trainjob-system rollout status": "envtest runs no pod: the real-node tier waits "
    "for the operator's rollout after installing the chart (tests/cluster/test_real_node.py)",
    "trainjob submit": "needs pods that train (envtest runs none): tests/k8s/test_sdk_cli.py "
    "runs submit (with --working-dir, the refusals) and tests/k8s/test_sdk_terminal.py "
    "submit --follow in a terminal (the operator running, the kubelet and driver played) on "
    "the k8s tier's kube-apiserver; the real-node tier trains a submitted working dir",
    "trainjob list": "reads the TrainJobs a submit (not run here) created: "
    "tests/k8s/test_sdk_cli.py runs it",
    "trainjob status": "needs a TrainJob (submit is not run here): tests/k8s/test_sdk_cli.py",
    "trainjob logs": "envtest runs no pod: tests/k8s/test_sdk_cli.py checks the refusal, the "
    "real-node tier streams a driver",
    "trainjob checkpoints": "needs a trained run in storage: the real-node tier",
    "trainjob suspend": "needs a TrainJob (submit is not run here): tests/k8s/test_sdk_cli.py",
    "trainjob resume": "needs a TrainJob (submit is not run here): tests/k8s/test_sdk_cli.py",
    "trainjob delete": "needs a TrainJob (submit is not run here): tests/k8s/test_sdk_cli.py",
    "kubectl trainjob": "the kubectl plugin (kubectl-trainjob, the same entry point as "
    "trainjob): the real-node tier runs it through kubectl",
}
"""Commands not run (matched by their first words): why, and where they are tested."""

RUN = ("kubectl", "helm", "trainjob", "sed")
"""The programs whose commands run; any other command must be in :data:`NOT_RUN`."""


@dataclass
class Command:
    page: str
    line: int
    text: str  # as written, continuation lines joined, without its comment

    @property
    def where(self) -> str:
        return f"docs/{self.page}:{self.line}: {self.text}"


def parts(text: str) -> list[list[str]]:
    """The simple commands of a line (split at ``&&``, ``;``, ``|``), as argument lists."""
    return [shlex.split(part) for part in re.split(r"&&|;|\|", text) if part.strip()]


def commands() -> Iterator[Command]:
    """Every command line of the ``bash`` blocks, in the order of the pages."""
    for page, line, language, body in blocks():
        if language != "bash":
            continue
        start, text = 0, ""
        for index, row in enumerate(body):
            start = start if text else index
            text += row
            if text.endswith("\\"):
                text = text[:-1]
                continue
            text = re.split(r"(?:^|\s)#\s", text)[0].strip()  # its comment, if any
            if text:
                yield Command(page, line + 1 + start, re.sub(r"\s+", " ", text))
            text = ""


def listed_as(argv: list[str]) -> str | None:
    """The :data:`NOT_RUN` entry of a simple command, if any."""
    return next((key for key in NOT_RUN if argv[: len(key.split())] == key.split()), None)


def not_run(command: Command) -> str | None:
    """Why ``command`` is not run (:data:`NOT_RUN`), or None when it runs.

    Raises:
        ValueError: a simple command of it neither runs nor is listed.
    """
    reasons = []
    for argv in parts(command.text):
        key = listed_as(argv)
        if key is not None:
            reasons.append(NOT_RUN[key])
        elif argv[0] not in RUN:
            raise ValueError(f"{command.where}: {argv[0]} neither runs nor is in NOT_RUN")
    return "; ".join(reasons) or None
