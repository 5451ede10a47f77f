"""The generated TrainJob CRD, applied to a real kube-apiserver 1.20.

The examples must be accepted without losing fields to pruning, invalid TrainJobs must be
rejected by the API server itself (422, naming the field), and the printer columns must be served.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support import EnvTest

pytestmark = pytest.mark.k8s

ROOT = Path(__file__).resolve().parents[2]
CRD_PATH = ROOT / "crds" / "trainjob.dev_trainjobs.yaml"
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))

if not CRD_PATH.is_file():
    pytest.skip(f"{CRD_PATH} not generated", allow_module_level=True)

CRD: dict[str, Any] = yaml.safe_load(CRD_PATH.read_text())
GROUP = CRD["spec"]["group"]
VERSION = next(v["name"] for v in CRD["spec"]["versions"] if v.get("storage"))
PLURAL = CRD["spec"]["names"]["plural"]
API_VERSION = f"{GROUP}/{VERSION}"
PRINTER_COLUMNS = ["Phase", "Workers", "Step", "Best", "Age"]  # DESIGN.md


def example_trainjobs() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for path in EXAMPLES:
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and doc.get("kind") == "TrainJob":
                found.append((f"{path.name}:{doc['metadata']['name']}", doc))
    return found


def leaves(value: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted path, value) of every leaf of a manifest."""
    if isinstance(value, dict) and value:
        for key, item in value.items():
            yield from leaves(item, f"{prefix}.{key}" if prefix else key)
    elif isinstance(value, list) and value:
        for i, item in enumerate(value):
            yield from leaves(item, f"{prefix}[{i}]")
    else:
        yield prefix, value


def lookup(obj: Any, dotted: str) -> Any:
    for part in dotted.replace("[", ".[").split("."):
        if part.startswith("["):
            obj = obj[int(part[1:-1])]
        elif isinstance(obj, dict) and part in obj:
            obj = obj[part]
        else:
            raise KeyError(dotted)
    return obj


def items_path(namespace: str, name: str = "") -> str:
    path = f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}"
    return f"{path}/{name}" if name else path


@pytest.fixture(scope="module")
def trainjob_crd(envtest: EnvTest) -> Iterator[dict[str, Any]]:
    stored = envtest.apply_crd(CRD_PATH)
    try:
        yield stored
    finally:
        envtest.delete_crd(CRD["metadata"]["name"])


def test_crd_is_accepted_as_structural(trainjob_crd: dict[str, Any]) -> None:
    conditions = {c["type"]: c for c in trainjob_crd["status"]["conditions"]}
    assert conditions["Established"]["status"] == "True"
    assert conditions["NamesAccepted"]["status"] == "True"
    assert "NonStructuralSchema" not in conditions, conditions.get("NonStructuralSchema")
    version = next(v for v in trainjob_crd["spec"]["versions"] if v["name"] == VERSION)
    assert version["subresources"]["status"] == {}
    assert "tj" in trainjob_crd["status"]["acceptedNames"]["shortNames"]


def test_printer_columns_are_stored_and_served(
    envtest: EnvTest, trainjob_crd: dict[str, Any], k8s_namespace: str
) -> None:
    version = next(v for v in trainjob_crd["spec"]["versions"] if v["name"] == VERSION)
    stored_columns = [c["name"] for c in version["additionalPrinterColumns"]]
    assert stored_columns == PRINTER_COLUMNS
    file_version = next(v for v in CRD["spec"]["versions"] if v["name"] == VERSION)
    assert version["additionalPrinterColumns"] == file_version["additionalPrinterColumns"]

    # What `kubectl get trainjobs` shows: the server renders the columns as a Table.
    job = {
        "apiVersion": API_VERSION,
        "kind": "TrainJob",
        "metadata": {"name": "columns"},
        "spec": {"entrypoint": "pkg.train:main"},
    }
    status, body = envtest.request("POST", items_path(k8s_namespace), job)
    assert status == 201, body
    status, body = envtest.request(
        "PATCH",
        items_path(k8s_namespace, "columns") + "/status",
        {"status": {"phase": "Running", "workers": {"ready": 2, "desired": 2}}},
    )
    assert status == 200, body
    assert body["status"]["phase"] == "Running"

    status, table = envtest.request(
        "GET",
        items_path(k8s_namespace),
        headers={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"},
    )
    assert status == 200, table
    assert table["kind"] == "Table"
    names = [c["name"] for c in table["columnDefinitions"]]
    assert names == ["Name", *PRINTER_COLUMNS]
    row = dict(zip(names, table["rows"][0]["cells"], strict=True))
    assert row["Name"] == "columns"
    assert row["Phase"] == "Running"
    assert row["Workers"] == 2


@pytest.mark.parametrize(
    "example", [doc for _, doc in example_trainjobs()], ids=[i for i, _ in example_trainjobs()]
)
def test_examples_are_accepted_without_pruning(
    envtest: EnvTest, trainjob_crd: dict[str, Any], k8s_namespace: str, example: dict[str, Any]
) -> None:
    job = copy.deepcopy(example)
    job["metadata"].pop("namespace", None)
    status, created = envtest.request("POST", items_path(k8s_namespace), job)
    assert status == 201, created
    assert created["apiVersion"] == API_VERSION

    # Every field the example sets survives (a field unknown to the schema would be pruned
    # silently) with its value; the schema's defaults fill in the rest.
    lost = []
    for path, value in leaves(example["spec"]):
        try:
            stored = lookup(created["spec"], path)
        except (KeyError, IndexError, TypeError):
            lost.append(f"spec.{path} (pruned)")
            continue
        if stored != value:
            lost.append(f"spec.{path}: {value!r} stored as {stored!r}")
    assert not lost, f"the API server dropped or changed fields of the example: {lost}"

    _, read = envtest.request("GET", items_path(k8s_namespace, job["metadata"]["name"]))
    assert read["spec"] == created["spec"]


BASE: dict[str, Any] = {
    "apiVersion": API_VERSION,
    "kind": "TrainJob",
    "metadata": {"name": "invalid"},
    "spec": {"entrypoint": "pkg.train:main", "scaling": {"numWorkers": 2}},
}


def with_spec(**changes: Any) -> dict[str, Any]:
    """BASE with dotted spec paths set (``None`` deletes)."""
    job = copy.deepcopy(BASE)
    for dotted, value in changes.items():
        target = job["spec"]
        *parents, last = dotted.split("__")
        for key in parents:
            target = target.setdefault(key, {})
        if value is None:
            target.pop(last, None)
        else:
            target[last] = value
    return job


def test_the_base_trainjob_is_valid(
    envtest: EnvTest, trainjob_crd: dict[str, Any], k8s_namespace: str
) -> None:
    status, created = envtest.request("POST", items_path(k8s_namespace), BASE)
    assert status == 201, created
    assert created["spec"]["framework"] == "torch"  # schema default


@pytest.mark.parametrize(
    ("job", "field", "fragment"),
    [
        pytest.param(
            with_spec(scaling__numWorkers="two"), "spec.scaling.numWorkers", "integer", id="type"
        ),
        pytest.param(
            with_spec(scaling__numWorkers=-1),
            "spec.scaling.numWorkers",
            "greater than or equal to 0",
            id="negative-workers",
        ),
        pytest.param(
            with_spec(framework="tensorflow"), "spec.framework", "supported values", id="framework"
        ),
        pytest.param(
            with_spec(scaling__tpu={"acceleratorType": "v3", "topology": "2x2"}),
            "spec.scaling.tpu.acceleratorType",
            "supported values",
            id="tpu-type",
        ),
        pytest.param(
            with_spec(scaling__tpu={"acceleratorType": "v6e"}),
            "spec.scaling.tpu.topology",
            "required",
            id="tpu-topology-missing",
        ),
        pytest.param(
            with_spec(checkpoint__uploadMode="later"),
            "spec.checkpoint.uploadMode",
            "supported values",
            id="upload-mode",
        ),
        pytest.param(with_spec(entrypoint=None), "spec.entrypoint", "required", id="no-entrypoint"),
        pytest.param(
            with_spec(entrypoint="not a function"), "spec.entrypoint", "match", id="entrypoint"
        ),
    ],
)
def test_invalid_trainjobs_are_rejected_by_the_api_server(
    envtest: EnvTest,
    trainjob_crd: dict[str, Any],
    k8s_namespace: str,
    job: dict[str, Any],
    field: str,
    fragment: str,
) -> None:
    status, body = envtest.request("POST", items_path(k8s_namespace), job)
    assert status == 422, body
    assert body["reason"] == "Invalid"
    message = body["message"]
    assert field in message, message
    assert fragment in message.lower(), message
    assert any(c.get("field") == field for c in body["details"]["causes"]), body["details"]
