"""The ``trainjob`` CLI: validate, crd, and the lazily imported run/operator subcommands."""

from __future__ import annotations

import argparse
import io
import sys
import types
from pathlib import Path

import pytest
import yaml

from trainjob_operator import cli
from trainjob_operator.api.crd import render_crd_yaml

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"

GOOD = """\
apiVersion: trainjob.dev/v1alpha1
kind: TrainJob
metadata:
  name: {name}
spec:
  entrypoint: pkg.mod:train
"""


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_validate_examples(capsys: pytest.CaptureFixture[str]) -> None:
    paths = [str(EXAMPLES / n) for n in ("quickstart.yaml", "jax.yaml", "tpu-v6e-4x4.yaml")]
    assert cli.main(["validate", *paths]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [
        f"OK {paths[0]} (TrainJob/quickstart)",
        f"OK {paths[1]} (TrainJob/jax-quickstart)",
        f"OK {paths[2]} (TrainJob/llm-v6e-4x4)",
    ]


def test_validate_quiet(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["validate", "-q", str(EXAMPLES / "quickstart.yaml")]) == 0
    assert capsys.readouterr().out == ""


def test_validate_bad_topology(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = GOOD.format(name="t") + "  scaling:\n    tpu: {acceleratorType: v6e, topology: 4x2}\n"
    path = write(tmp_path, "tpu.yaml", text)
    assert cli.main(["validate", path]) == 2
    [line] = capsys.readouterr().out.splitlines()
    assert line.startswith(f"{path}: spec.scaling.tpu.topology: topology '4x2' is not a valid ")
    assert "1x1, 2x2, 2x4, 4x4, 4x8, 8x8, 8x16, 16x16" in line
    assert line.endswith("(hint: 8 chips: use 2x4)")


def test_validate_one_line_per_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = GOOD.format(name="t") + (
        "  framwork: torch\n"  # unknown field
        "  suspend: sometimes\n"  # wrong type
        "  scaling:\n"
        "    numWorkers: [1]\n"  # wrong type
        "    resourcesPerWorker: {memory: 4GB}\n"  # bad quantity
        "  storage: {path: 'hdfs://bucket/x'}\n"  # unsupported scheme
    )
    path = write(tmp_path, "bad.yaml", text)
    assert cli.main(["validate", path]) == 2
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 5
    assert all(line.startswith(f"{path}: spec.") for line in lines)
    by_field = {line.split(": ")[1]: line for line in lines}
    assert set(by_field) == {
        "spec.framwork",
        "spec.suspend",
        "spec.scaling.numWorkers",
        "spec.scaling.resourcesPerWorker.memory",
        "spec.storage.path",
    }
    assert "unknown field 'framwork' (hint: did you mean 'framework'?" in by_field["spec.framwork"]
    assert (
        "(hint: write '4Gi' (binary) or '4G' (decimal))"
        in by_field["spec.scaling.resourcesPerWorker.memory"]
    )
    assert "(hint: use gs://bucket/prefix" in by_field["spec.storage.path"]


def test_validate_syntax_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, "broken.yaml", "spec:\n  a: 1\n   b: 2\n")
    assert cli.main(["validate", path]) == 2
    [line] = capsys.readouterr().out.splitlines()
    assert line.startswith(f"{path}: line 3, column 5: YAML syntax error: ")


def test_validate_multi_document(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = GOOD.format(name="b").replace("pkg.mod:train", "pkg.mod.train")
    path = write(tmp_path, "multi.yaml", GOOD.format(name="a") + "---\n" + bad)
    assert cli.main(["validate", path]) == 2
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"OK {path}#1 (TrainJob/a)"
    assert lines[1].startswith(f"{path}#2: spec.entrypoint: must look like")
    assert lines[1].endswith("(hint: separate the function with a colon: 'pkg.mod:train')")
    assert len(lines) == 2


def test_validate_mixed_files_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = write(tmp_path, "good.yaml", GOOD.format(name="a"))
    missing = str(tmp_path / "missing.yaml")
    empty = write(tmp_path, "empty.yaml", "# nothing here\n")
    assert cli.main(["validate", good, missing, empty]) == 2
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        f"OK {good} (TrainJob/a)",
        f"{missing}: cannot read: No such file or directory",
        f"{empty}: no TrainJob document found",
    ]


def test_validate_stdin(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO(GOOD.format(name="piped")))
    assert cli.main(["validate", "-"]) == 0
    assert capsys.readouterr().out == "OK - (TrainJob/piped)\n"


def test_crd_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["crd"]) == 0
    out = capsys.readouterr().out
    assert out == render_crd_yaml()
    assert yaml.safe_load(out)["metadata"]["name"] == "trainjobs.trainjob.dev"


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--help"], "validate"),
        (["validate", "--help"], "Exit status 2"),
        (["crd", "--help"], "kubectl apply"),
        (["run", "--help"], "--num-workers"),
        (["operator", "--help"], "--namespace"),
    ],
)
def test_help(argv: list[str], expected: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(argv) == 0
    assert expected in capsys.readouterr().out


def test_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([]) == 2
    assert cli.main(["validate"]) == 2
    assert cli.main(["frobnicate"]) == 2
    assert "usage: trainjob" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("command", "module", "func"),
    [
        ("run", "trainjob_operator.launcher.local", "run_command"),
        ("operator", "trainjob_operator.operator_main", "operator_command"),
    ],
)
def test_lazy_subcommands_delegate(
    command: str, module: str, func: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[argparse.Namespace] = []

    def implementation(args: argparse.Namespace) -> int:
        seen.append(args)
        return 7

    fake = types.ModuleType(module)
    setattr(fake, func, implementation)
    monkeypatch.setitem(sys.modules, module, fake)
    argv = [command, "job.yaml", "--num-workers", "0"] if command == "run" else [command, "-n", "a"]
    assert cli.main(argv) == 7
    [args] = seen
    if command == "run":
        assert (args.manifest, args.num_workers, args.storage_path) == ("job.yaml", 0, None)
    else:
        assert args.namespace == ["a"] and args.metrics_port == 9090


@pytest.mark.parametrize(
    ("argv", "module"),
    [
        (["run", "job.yaml"], "trainjob_operator.launcher.local"),
        (["operator"], "trainjob_operator.operator_main"),
    ],
)
def test_lazy_subcommands_missing_implementation(
    argv: list[str],
    module: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # makes the import raise ImportError
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith(f"trainjob {argv[0]}: not available (")
    assert "install" not in err[0]


def test_lazy_subcommand_missing_dependency(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def fail(name: str) -> None:
        raise ModuleNotFoundError("No module named 'ray'", name="ray")

    monkeypatch.setattr(cli.importlib, "import_module", fail)
    assert cli.main(["run", "job.yaml"]) == 2
    err = capsys.readouterr().err
    assert "No module named 'ray'" in err and "trainjob-operator[runtime]" in err


def test_lazy_subcommand_missing_function(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(
        sys.modules,
        "trainjob_operator.launcher.local",
        types.ModuleType("trainjob_operator.launcher.local"),
    )
    assert cli.main(["run", "job.yaml"]) == 2
    assert "trainjob_operator.launcher.local:run_command is missing" in capsys.readouterr().err
