"""Builders and accessors shared by the renderer tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainjob_operator.api import TrainJob, load_trainjobs, parse_trainjob

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
UID = "0f1e2d3c-aaaa-bbbb-cccc-123456789abc"


def make_job(name: str = "job", namespace: str | None = "ns", **spec: Any) -> TrainJob:
    """A valid TrainJob with ``spec`` fields (camelCase) merged into a minimal spec."""
    metadata: dict[str, Any] = {"name": name}
    if namespace is not None:
        metadata["namespace"] = namespace
    return parse_trainjob(
        {
            "apiVersion": "trainjob.dev/v1alpha1",
            "kind": "TrainJob",
            "metadata": metadata,
            "spec": {"entrypoint": "pkg.mod:train", **spec},
        }
    )


def example(name: str) -> TrainJob:
    """The single TrainJob of ``examples/<name>``."""
    [job] = load_trainjobs(EXAMPLES / name)
    return job


def tpu_job(topology: str, num_slices: int = 1, **spec: Any) -> TrainJob:
    """A v6e TrainJob with the given slice topology and slice count."""
    return make_job(
        name="tpu",
        framework="jax",
        scaling={
            "resourcesPerWorker": {"cpu": "8", "memory": "32Gi"},
            "tpu": {"acceleratorType": "v6e", "topology": topology, "numSlices": num_slices},
        },
        **spec,
    )


def container(pod: dict[str, Any]) -> dict[str, Any]:
    """The single container of a pod."""
    [main] = pod["spec"]["containers"]
    return main


def ray_auth_env(job: str) -> dict[str, Any]:
    """The Ray token authentication env of every container of ``job`` (as :func:`env` shows it)."""
    return {
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": {"secretKeyRef": {"name": f"{job}-ray-auth", "key": "token"}},
    }


def env(pod: dict[str, Any]) -> dict[str, Any]:
    """Env of the pod's container as ``{name: value or valueFrom}`` (names are unique)."""
    items = container(pod)["env"]
    names = [e["name"] for e in items]
    assert len(names) == len(set(names)), f"duplicate env names: {names}"
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in items}


def script(pod: dict[str, Any]) -> str:
    """The ``sh -c`` script of a pod's container."""
    command = container(pod)["command"]
    assert command[:2] == ["/bin/sh", "-c"]
    return str(command[2])


def ray_start_args(pod: dict[str, Any]) -> list[str]:
    """What a Ray node pod (worker, validation pool) passes to ``ray start``, behind the node
    process ``python -m trainjob_operator.launcher.ray_node ... -- ray start ...``."""
    command = container(pod)["command"]
    assert command[:3] == ["python", "-m", "trainjob_operator.launcher.ray_node"], command
    ray_argv = command[command.index("--") + 1 :]
    assert ray_argv[:2] == ["ray", "start"], command
    return list(ray_argv[2:])


def labels(obj: dict[str, Any]) -> dict[str, str]:
    """``metadata.labels``."""
    return dict(obj["metadata"]["labels"])
