"""spec.runtimeEnv: accepted forms, the errors Ray would only give at run time, and the same
answers from the model, ``trainjob validate`` and the admission webhook."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from trainjob_operator import cli
from trainjob_operator.admission import review
from trainjob_operator.api import ManifestError, parse_trainjob

QUICKSTART = Path(__file__).resolve().parents[2] / "examples" / "quickstart.yaml"


def _job(runtime_env: dict[str, Any], **spec: Any) -> dict[str, Any]:
    body = yaml.safe_load(QUICKSTART.read_text())
    body["spec"]["runtimeEnv"] = runtime_env
    body["spec"].update(spec)
    return dict(body)


@pytest.mark.parametrize(
    "runtime_env",
    [
        {"workingDir": "gs://my-bucket/code/train-0123abcd.zip"},
        {"workingDir": "s3://my-bucket/code.zip", "excludes": ["data/", "*.ckpt"]},
        {"workingDir": "/workspace/project", "pyModules": ["/opt/libs/mylib"]},
        {"pyModules": ["gs://my-bucket/libs/mylib.zip"], "envVars": {"HF_HOME": "/tmp/hf"}},
        {"pip": ["torchmetrics==1.4.0", "einops"]},
        {"uvPackages": ["einops>=0.8"]},
        {},
    ],
)
def test_accepted_forms(runtime_env: dict[str, Any]) -> None:
    job = parse_trainjob(_job(runtime_env))
    assert job.spec.runtime_env is not None
    assert job.to_dict()["spec"]["runtimeEnv"].get("workingDir") == runtime_env.get("workingDir")


@pytest.mark.parametrize(
    ("runtime_env", "field", "words"),
    [
        ({"workingDir": "."}, "spec.runtimeEnv.workingDir", "trainjob submit --working-dir"),
        ({"workingDir": "gs://my-bucket/code/"}, "spec.runtimeEnv.workingDir", ".zip archive"),
        ({"workingDir": "gs://My_Bucket/c.zip"}, "spec.runtimeEnv.workingDir", "bucket name"),
        (
            {"workingDir": "https://example.com/c.zip"},
            "spec.runtimeEnv.workingDir",
            "gs:// or s3://",
        ),
        ({"workingDir": "file:///code"}, "spec.runtimeEnv.workingDir", "'/code'"),
        ({"workingDir": "/workspace/../etc"}, "spec.runtimeEnv.workingDir", "'..'"),
        ({"pyModules": ["mylib"]}, "spec.runtimeEnv.pyModules[0]", "relative path"),
        ({"pyModules": ["/a", "/a"]}, "spec.runtimeEnv.pyModules[1]", "listed twice"),
        ({"pip": ["a"], "uvPackages": ["b"]}, "spec.runtimeEnv.uvPackages", "not both"),
        ({"pip": ["--index-url x"]}, "spec.runtimeEnv.pip[0]", "PIP_INDEX_URL"),
        ({"pip": [" a "]}, "spec.runtimeEnv.pip[0]", "one requirement per item"),
        ({"excludes": ["*.ckpt"]}, "spec.runtimeEnv.excludes", "neither is set"),
        ({"envVars": {"1X": "a"}}, "spec.runtimeEnv.envVars", "not a valid environment"),
        ({"conda": "env.yaml"}, "spec.runtimeEnv.conda", "valid fields: workingDir"),
    ],
)
def test_refused_with_the_field_and_the_fix(
    runtime_env: dict[str, Any], field: str, words: str
) -> None:
    with pytest.raises(ManifestError) as info:
        parse_trainjob(_job(runtime_env))
    text = str(info.value)
    assert text.startswith(f"{field}: "), text
    assert words in text


def test_an_env_var_in_both_spec_env_and_env_vars_is_refused() -> None:
    with pytest.raises(ManifestError, match=r"spec\.runtimeEnv\.envVars: .*'A' is set in both"):
        parse_trainjob(_job({"envVars": {"A": "1"}}, env=[{"name": "A", "value": "2"}]))


def test_validate_and_the_webhook_give_the_same_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = _job({"workingDir": "src"})
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    assert cli.main(["validate", str(path)]) == 2
    [line] = capsys.readouterr().out.splitlines()
    assert line.startswith(f"{path}: spec.runtimeEnv.workingDir: 'src' is a relative path")
    answer = review(
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {"uid": "u", "operation": "CREATE", "object": bad, "oldObject": None},
        }
    )["response"]
    assert answer["allowed"] is False
    assert answer["status"]["message"] == line.removeprefix(f"{path}: ")
