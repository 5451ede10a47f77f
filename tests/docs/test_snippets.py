"""The code blocks of the docs run, or come from files that are checked here.

Guides include their code from ``docs/snippets/`` (``--8<-- "file"``). This module runs the
Python snippets (in local mode, ``num_workers=0``, except the validation fan-out, which runs on
the session's Ray cluster and its CPU-less validation node), validates the manifests, compares the
captured ``trainjob validate`` and admission outputs with what the code prints now, and checks
every other fenced block of the hand-written pages without running it: a ``bash`` block's
``trainjob`` commands must parse, its ``helm --set`` keys must exist in the chart and the
repository files it names must exist; a ``text`` or ``python`` block must be an include. The
``bash`` blocks' commands run in ``tests/k8s/test_docs_commands.py`` (k8s tier)."""

from __future__ import annotations

import importlib.util
import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import yaml

from tests.docs._commands import NOT_RUN, RUN, commands, listed_as, not_run, parts
from tests.docs._gen import DOCS, REPO, blocks

SNIPPETS = DOCS / "snippets"


@pytest.fixture(autouse=True)
def _keep_sigterm() -> Iterator[None]:
    """A local-mode ``fit()`` turns this process's first SIGTERM into a preemption notice; put
    the handler back so that the rest of the session stops on SIGTERM as before."""
    import signal

    from trainer_runtime import preemption

    handler = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, handler)
    preemption.clear()


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"snippet_{name}", SNIPPETS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --------------------------------------------------------------------------- Python snippets


def test_torch_trainer_snippet_trains_and_keeps_the_best(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    result = _load("torch_trainer").main(num_workers=0, storage_path=str(tmp_path))
    assert result.error is None
    assert result.metrics is not None and result.metrics["step"] == 19
    assert "val_loss" in result.metrics  # the validation ran and merged its metrics
    assert len(result.best_checkpoints) == 2  # CheckpointConfig(num_to_keep=2)


def test_preemption_snippet_runs_and_resumes(tmp_path: Path) -> None:
    from trainer_runtime import DataParallelTrainer, RunConfig, ScalingConfig

    train_func = _load("preemption").train_func

    def fit(steps: int) -> object:
        return DataParallelTrainer(
            train_func,
            train_loop_config={"steps": steps},
            scaling_config=ScalingConfig(num_workers=0),
            run_config=RunConfig(name="preempt", storage_path=str(tmp_path)),
        ).fit()

    first = fit(3)
    # No notice: nothing was checkpointed, every step reported (local mode's Result.metrics
    # is the last report's, as in Ray Train's local mode).
    assert first.checkpoint is None
    assert first.metrics == {"step": 2}
    assert fit(4).error is None


def test_validate_shards_snippet_fans_out_on_a_node_without_cpus(
    tmp_path: Path, ray_validation_node: str
) -> None:
    """The fan-out runs as the guide shows it, from a validation on a node that advertises no
    CPUs (``ray_validation_node``, as a TrainJob's validation pod): pinned there, shards that
    asked for a CPU would never start and the validation would time out."""
    from trainer_runtime import CheckpointStatus

    result = _load("validate_shards").main(storage_path=str(tmp_path), shards=3)
    assert result.error is None
    assert [c.status for c in result.checkpoints] == [CheckpointStatus.VALIDATED] * 2
    # weight w (the step) scored on shards 0, 1, 2: (|w| + |w-1| + |w-2|) / 3
    assert [c.all_metrics["val_loss"] for c in result.checkpoints] == [1.0, 2 / 3]


# --------------------------------------------------------------------------- manifests, outputs


def test_snippet_manifests() -> None:
    from trainjob_operator.api import load_trainjobs

    [job] = load_trainjobs(SNIPPETS / "failure-rules.yaml")
    assert job.spec.failure.max_restarts == 3
    assert [rule.action for rule in job.spec.failure.rules] == ["FailJob", "Count"]
    [job] = load_trainjobs(SNIPPETS / "datasets.yaml")
    assert job.spec.data is not None and job.spec.data.datasets_to_split == ["train"]
    assert job.spec.data.pool.replicas == 2 and job.spec.data.pool.cpus_per_pod() == 4
    [job] = load_trainjobs(SNIPPETS / "elastic.yaml")
    assert (job.spec.scaling.num_workers, job.spec.scaling.elastic_min_workers) == (4, 2)


def test_validate_outputs_are_what_trainjob_validate_prints(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from trainjob_operator.cli import main

    monkeypatch.chdir(REPO)
    examples = sorted(str(p.relative_to(REPO)) for p in (REPO / "examples").glob("*.yaml"))
    assert main(["validate", *examples]) == 0
    assert capsys.readouterr().out == (SNIPPETS / "validate-examples.txt").read_text()
    monkeypatch.chdir(SNIPPETS)
    assert main(["validate", "bad-trainjob.yaml"]) == 2
    assert capsys.readouterr().out == (SNIPPETS / "validate-bad.txt").read_text()


def test_admission_output_is_what_the_webhook_says() -> None:
    from trainjob_operator.admission import review

    body = yaml.safe_load((SNIPPETS / "bad-topology.yaml").read_text())
    request = {"request": {"uid": "1", "operation": "CREATE", "object": body}}
    message = review(request)["response"]["status"]["message"]
    shown = (SNIPPETS / "admission-denied.txt").read_text().rstrip("\n")
    assert shown.endswith(f"denied the request: {message}")


README_CAPTURES = ("make-demo.txt", "submit-follow.txt")
"""The README's ``text`` blocks, each a real capture: ``make demo`` (written by its own run) and
``trainjob submit --follow`` (tests/k8s/test_sdk_terminal.py compares and rewrites it)."""


@pytest.mark.parametrize("name", README_CAPTURES)
def test_the_readmes_captures_are_the_snippets(name: str) -> None:
    capture = (SNIPPETS / name).read_text()
    assert capture in (REPO / "README.md").read_text(encoding="utf-8")


def test_the_layout_names_what_is_there() -> None:
    """Every file or folder the layout (``docs/snippets/layout.txt``) names at the start of a
    line exists, a nested one (indented) in the folder above it."""
    parent = ""
    named = 0
    for line in (SNIPPETS / "layout.txt").read_text().splitlines():
        match = re.match(r"^( *)(\S+)(?:\s{2,}|$)", line)
        if not match or len(match[1]) > 2:  # a continuation of the previous description
            continue
        path = match[2] if not match[1] else parent + match[2]
        if not match[1]:
            parent = path
        assert (REPO / path).exists(), f"docs/snippets/layout.txt names {path}: not there"
        named += 1
    assert named > 20


# --------------------------------------------------------------------------- every other block


def _included(body: list[str]) -> bool:
    return len(body) == 1 and body[0].strip().startswith('--8<-- "')


def _values_keys() -> set[str]:
    values = yaml.safe_load((REPO / "charts/trainjob-operator/values.yaml").read_text())

    def walk(node: object, prefix: str) -> Iterator[str]:
        yield prefix.rstrip(".")
        if isinstance(node, dict):
            for key, value in node.items():
                yield from walk(value, f"{prefix}{key}.")

    return set(walk(values, ""))


def test_every_code_block_is_included_or_checked() -> None:
    """Without a cluster: includes exist, a ``bash`` block's ``trainjob`` commands parse, its
    ``helm --set`` keys are in values.yaml and the repository files it applies exist."""
    from trainjob_operator.cli import build_parser

    parser = build_parser()
    values = _values_keys()
    fenced = list(blocks())
    assert len(fenced) > 10
    for page, line, language, body in fenced:
        where = f"docs/{page}:{line}"
        if _included(body):
            target = body[0].strip().removeprefix('--8<-- "').split('"')[0].split(":")[0]
            assert (SNIPPETS / target).is_file() or (REPO / target).is_file(), where
            continue
        if language == "mermaid":  # a diagram
            continue
        if page == "../README.md" and language == "text":  # README_CAPTURES
            captures = [(SNIPPETS / name).read_text() for name in README_CAPTURES]
            assert "\n".join(body) + "\n" in captures, where
            continue
        assert language == "bash", f"{where}: a {language} block must be included from a file"
    for command in commands():
        text = re.sub(r"\[[^]]*\]", "", command.text.split(">")[0])  # usage: [--flag VALUE]
        for argv in parts(text):
            if argv[0] == "trainjob":
                try:
                    parser.parse_args(argv[1:])
                except SystemExit:
                    pytest.fail(f"{command.where}: not a valid trainjob command")
            if argv[:2] in (["helm", "install"], ["helm", "upgrade"]):
                for index, arg in enumerate(argv):
                    if arg == "--set":
                        key = argv[index + 1].split("=", 1)[0]
                        assert key in values, f"{command.where}: --set {key}: not in values.yaml"
            if argv[:2] == ["kubectl", "apply"] and "-f" in argv:
                path = argv[argv.index("-f") + 1]
                if path.split("/")[0] in ("examples", "crds", "charts"):
                    assert (REPO / path).exists(), f"{command.where}: {path} does not exist"


def test_every_command_is_run_or_listed() -> None:
    """Every command of the guides' ``bash`` blocks runs in ``tests/k8s/test_docs_commands.py``
    unless ``tests/docs/_commands.py``'s ``NOT_RUN`` says why not; an entry no command uses
    goes."""
    listed = list(commands())
    assert len(listed) > 20
    used = set()
    for command in listed:
        used |= {listed_as(argv) for argv in parts(command.text)} - {None}
        try:
            not_run(command)
        except ValueError as error:
            pytest.fail(str(error))
    assert set(NOT_RUN) == used, f"stale NOT_RUN entries: {set(NOT_RUN) - used}"
    run = [c for c in listed if not_run(c) is None]
    assert {shlex.split(c.text)[0] for c in run} == set(RUN)  # kubectl and helm among them


def test_readme_links_into_the_docs_exist() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    links = re.findall(r"\]\((docs/[^)#]+)", readme)
    assert len(links) > 10
    for link in links:
        assert (REPO / link).is_file(), f"README.md links to {link}, which does not exist"
    assert readme.count("<!-- ci-figures:start -->") == 1
    assert readme.count("<!-- ci-figures:end -->") == 1
