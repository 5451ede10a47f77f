"""The webhook's answer to an AdmissionReview, offline: the same lines as ``trainjob validate``,
and which updates are checked (spec changes) and which are not (metadata, deletions)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from trainjob_operator import cli
from trainjob_operator.admission import review
from trainjob_operator.api.manifest import load_documents

QUICKSTART = Path(__file__).resolve().parents[2] / "examples" / "quickstart.yaml"


def _job(**spec: Any) -> dict[str, Any]:
    body = yaml.safe_load(QUICKSTART.read_text())
    body["spec"].update(spec)
    return dict(body)


def _request(operation: str, obj: dict[str, Any], old: dict[str, Any] | None = None) -> Any:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {"uid": "u-1", "operation": operation, "object": obj, "oldObject": old},
    }


def test_a_valid_create_is_allowed() -> None:
    answer = review(_request("CREATE", _job()))
    assert answer == {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {"uid": "u-1", "allowed": True},
    }


def test_an_invalid_create_is_denied_with_the_lines_of_trainjob_validate() -> None:
    bad = _job(image="Not An Image", scaling={"tpu": {"acceleratorType": "v6e", "topology": "4x2"}})
    [doc] = load_documents(yaml.safe_dump(bad))
    lines = [e.format() for e in doc.errors]
    assert len(lines) == 2
    answer = review(_request("CREATE", bad))["response"]
    assert answer["allowed"] is False
    assert answer["status"] == {"message": "; ".join(lines), "code": 422}


def test_updates_are_checked_only_when_the_spec_changes() -> None:
    bad = _job(scaling={"tpu": {"acceleratorType": "v6e", "topology": "4x2"}})
    relabelled = copy.deepcopy(bad)
    relabelled["metadata"]["labels"] = {"team": "a"}
    # A job admitted before the webhook existed can still get labels, finalizers removed...
    assert review(_request("UPDATE", relabelled, bad))["response"]["allowed"] is True
    deleting = copy.deepcopy(bad)
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    deleting["spec"]["suspend"] = True
    assert review(_request("UPDATE", deleting, bad))["response"]["allowed"] is True
    # ...but a spec change must be valid.
    assert review(_request("UPDATE", bad, _job()))["response"]["allowed"] is False


def test_pod_template_problems_are_denied_and_printed_by_validate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The renderer's podTemplate check (else an InvalidSpec failure later) runs in both."""
    bad = _job(podTemplate={"volumes": [{"name": "root", "hostPath": {"path": "/"}}]})
    answer = review(_request("CREATE", bad))["response"]
    message = answer["status"]["message"]
    assert message.startswith(
        "spec.podTemplate.volumes[0].hostPath: this volume type is not allowed; allowed: "
    )
    assert message.endswith(
        "(hint: a cluster admin can widen the list with the chart value "
        "podSecurity.allowedVolumeTypes)"
    )
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(bad))
    assert cli.main(["validate", str(path)]) == 2
    assert capsys.readouterr().out == f"{path}: {message}\n"
    widened = frozenset({"hostPath", "emptyDir"})  # podSecurity.allowedVolumeTypes
    assert review(_request("CREATE", bad), widened)["response"]["allowed"] is True


def test_trainjobs_of_namespaces_the_operator_does_not_watch_are_admitted_unchecked() -> None:
    """Before Kubernetes 1.21 the chart's webhook has no namespaceSelector, so the API server
    asks about every namespace: an operator watching some namespaces only checks theirs."""
    bad = _job(image="Not An Image")
    watched = frozenset({"team-a"})

    def answer(namespace: str, operation: str = "CREATE") -> Any:
        request = _request(operation, bad, _job() if operation == "UPDATE" else None)
        request["request"]["namespace"] = namespace
        return review(request, namespaces=watched)["response"]

    assert answer("team-a")["allowed"] is False
    assert answer("team-a", "UPDATE")["allowed"] is False
    assert answer("team-b") == {"uid": "u-1", "allowed": True}
    assert answer("team-b", "UPDATE") == {"uid": "u-1", "allowed": True}
    # Without namespaces (a cluster-wide operator), every namespace is checked.
    request = _request("CREATE", bad)
    request["request"]["namespace"] = "team-b"
    assert review(request)["response"]["allowed"] is False
