"""The TrainJob models: examples, defaults, TPU derivation, rejections and error paths."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from trainjob_operator.api import (
    DEFAULT_IMAGE,
    FieldError,
    ManifestError,
    Phase,
    ScalingConfig,
    TpuConfig,
    TrainJob,
    TrainJobSpec,
    TrainJobStatus,
    field_errors,
    load_documents,
    load_trainjobs,
    parse_trainjob,
    slice_shape,
    split_entrypoint,
)
from trainjob_operator.api.tpu import TPU_GENERATIONS, get_generation

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"


def manifest(**spec: Any) -> dict[str, Any]:
    """A minimal valid TrainJob document with ``spec`` fields merged in."""
    return {
        "apiVersion": "trainjob.dev/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "job"},
        "spec": {"entrypoint": "pkg.mod:train", **spec},
    }


def errors_of(doc: dict[str, Any]) -> list[FieldError]:
    with pytest.raises(ManifestError) as info:
        parse_trainjob(doc)
    return info.value.errors


def only_error(doc: dict[str, Any]) -> FieldError:
    errors = errors_of(doc)
    assert len(errors) == 1, errors
    return errors[0]


# --------------------------------------------------------------------------- examples


def test_quickstart_example() -> None:
    [job] = load_trainjobs(EXAMPLES / "quickstart.yaml")
    spec = job.spec
    assert job.metadata.name == "quickstart"
    assert spec.framework == "torch"
    assert spec.entrypoint == "examples.quickstart.train:train_func"
    assert spec.config == {"epochs": 3, "lr": 0.05, "batch_size": 64}
    assert spec.scaling.num_workers == 2
    assert spec.scaling.resources_per_worker == {"cpu": "1"}
    assert spec.scaling.tpu is None
    assert spec.validation is not None
    assert spec.validation.entrypoint == "examples.quickstart.train:validate_func"
    assert spec.checkpoint.upload_mode == "async"
    assert spec.checkpoint.num_to_keep == 2
    assert spec.checkpoint.score_attribute == "val_loss"
    assert spec.checkpoint.score_order == "min"
    assert spec.storage is not None and spec.storage.path.startswith("/")


def test_jax_example() -> None:
    [job] = load_trainjobs(EXAMPLES / "jax.yaml")
    assert job.spec.framework == "jax"
    assert job.spec.scaling.num_workers == 2
    assert job.spec.entrypoint == "examples.jax_quickstart.train:train_func"


def test_tpu_example() -> None:
    [job] = load_trainjobs(EXAMPLES / "tpu-v6e-4x4.yaml")
    scaling = job.spec.scaling
    assert scaling.tpu is not None
    shape = scaling.tpu.shape
    assert (shape.hosts, shape.chips_per_host, shape.chips) == (4, 4, 16)
    assert shape.gke_accelerator == "tpu-v6e-slice"
    assert scaling.num_workers == 4
    assert job.spec.storage is not None and job.spec.storage.path.startswith("gs://")
    assert job.spec.validation is not None and job.spec.validation.pool.spot is True


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_examples_round_trip(path: Path) -> None:
    for job in load_trainjobs(path):
        dumped = job.to_dict()
        assert TrainJob.model_validate(dumped) == job
        assert "numWorkers" in dumped["spec"]["scaling"]
        assert "num_workers" not in dumped["spec"]["scaling"]


def test_defaults() -> None:
    job = parse_trainjob(manifest())
    spec = job.spec
    assert spec.image == DEFAULT_IMAGE
    assert spec.framework == "torch"
    assert spec.scaling.num_workers == 1
    assert spec.scaling.use_gpu is False
    assert spec.checkpoint.upload_mode == "async"
    assert spec.checkpoint.score_order == "max"
    assert spec.checkpoint.num_to_keep is None
    assert spec.failure.max_failures == 0 and spec.failure.max_restarts == 0
    assert spec.ray.version == "2.60.0"
    assert spec.suspend is False
    assert spec.validation is None and spec.storage is None and job.status is None


def test_validation_pool_defaults() -> None:
    spec = parse_trainjob(manifest(validation={"entrypoint": "m:v"})).spec
    assert spec.validation is not None
    pool = spec.validation.pool
    assert (pool.min_replicas, pool.max_replicas, pool.spot, pool.idle_seconds) == (0, 1, True, 300)
    assert spec.validation.max_concurrent == 1
    assert spec.validation.config is None


def test_snake_case_manifest_fields_are_rejected_with_the_camel_case_spelling() -> None:
    # The API server's structural schema would prune snake_case keys (the job would silently
    # run with the defaults), so manifests are parsed by the camelCase names only.
    errors = errors_of(
        manifest(scaling={"num_workers": 3, "resources_per_worker": {"cpu": 2}}, upload_mode="x")
    )
    by_path = {e.path: e for e in errors}
    assert set(by_path) == {
        "spec.scaling.num_workers",
        "spec.scaling.resources_per_worker",
        "spec.upload_mode",
    }
    assert by_path["spec.scaling.num_workers"].message == "unknown field 'num_workers'"
    hint = by_path["spec.scaling.num_workers"].hint or ""
    assert hint.startswith("did you mean 'numWorkers'?") and "camelCase" in hint
    assert "'resourcesPerWorker'" in (by_path["spec.scaling.resources_per_worker"].hint or "")
    # Not a field of spec at all: the usual list of valid fields.
    assert "valid fields:" in (by_path["spec.upload_mode"].hint or "")


def test_python_code_may_still_construct_models_by_field_name() -> None:
    scaling = ScalingConfig(num_workers=3, resources_per_worker={"cpu": 2})
    assert scaling.num_workers == 3
    assert ScalingConfig.model_validate({"num_workers": 3}).num_workers == 3


def test_zero_workers_is_local_mode() -> None:
    assert parse_trainjob(manifest(scaling={"numWorkers": 0})).spec.scaling.num_workers == 0


# --------------------------------------------------------------------------- TPU table


@pytest.mark.parametrize(
    ("gen", "topology", "hosts", "chips_per_host", "pod_type", "label"),
    [
        ("v6e", "1x1", 1, 1, "v6e-1", "tpu-v6e-slice"),
        ("v6e", "2x4", 1, 8, "v6e-8", "tpu-v6e-slice"),
        ("v6e", "4x4", 4, 4, "v6e-16", "tpu-v6e-slice"),
        ("v6e", "16x16", 64, 4, "v6e-256", "tpu-v6e-slice"),
        ("v5e", "2x2", 1, 4, "v5litepod-4", "tpu-v5-lite-podslice"),
        ("v5e", "8x16", 32, 4, "v5litepod-128", "tpu-v5-lite-podslice"),
        ("v5p", "2x2x1", 1, 4, "v5p-8", "tpu-v5p-slice"),
        ("v5p", "4x4x8", 32, 4, "v5p-256", "tpu-v5p-slice"),
        ("v4", "2x2x2", 2, 4, "v4-16", "tpu-v4-podslice"),
        ("v4", "2x4x4", 8, 4, "v4-64", "tpu-v4-podslice"),
    ],
)
def test_slice_shape(
    gen: str, topology: str, hosts: int, chips_per_host: int, pod_type: str, label: str
) -> None:
    shape = slice_shape(gen, topology)
    assert shape.hosts == hosts
    assert shape.chips_per_host == chips_per_host
    assert shape.hosts * shape.chips_per_host == shape.chips
    assert shape.pod_type == pod_type
    assert shape.gke_accelerator == label
    assert shape.multi_host is (hosts > 1)
    assert shape.node_selector() == {
        "cloud.google.com/gke-tpu-accelerator": label,
        "cloud.google.com/gke-tpu-topology": topology,
    }


def test_design_doc_host_counts() -> None:
    """The host counts listed in DESIGN.md "GKE TPU facts"."""
    for gen in ("v5e", "v6e"):
        got = [slice_shape(gen, t).hosts for t in ("4x4", "4x8", "8x8", "8x16", "16x16")]
        assert got == [4, 8, 16, 32, 64]
        assert [slice_shape(gen, t).chips_per_host for t in ("1x1", "2x2", "2x4")] == [1, 4, 8]
    topologies = ("2x2x1", "2x2x2", "2x2x4", "2x4x4", "4x4x4", "4x4x8")
    for gen in ("v5p", "v4"):
        assert [slice_shape(gen, t).hosts for t in topologies] == [1, 2, 4, 8, 16, 32]


def test_slice_shape_aliases_and_normalization() -> None:
    assert slice_shape("v5litepod", "4x4").generation == "v5e"
    assert slice_shape("tpu-v6e-slice", "4X4").topology == "4x4"
    assert slice_shape("V6E", " 2 x 4 ").topology == "2x4"
    assert get_generation("v4").dimensions == 3 and get_generation("v6e").dimensions == 2


def test_slice_shape_bad_topology_lists_valid_ones() -> None:
    with pytest.raises(ValueError, match="valid v6e topologies") as info:
        slice_shape("v6e", "3x3")
    for topology in TPU_GENERATIONS["v6e"].topologies:
        assert topology in str(info.value)
    with pytest.raises(ValueError, match="2x2x1"):
        slice_shape("v4", "4x4")


def test_slice_shape_unknown_generation() -> None:
    with pytest.raises(ValueError, match="v6e, v5e, v5p, v4"):
        slice_shape("v3", "2x2")


# --------------------------------------------------------------------------- scaling rules


def tpu_scaling(**scaling: Any) -> dict[str, Any]:
    tpu = {"acceleratorType": "v6e", "topology": "4x4"}
    tpu.update(scaling.pop("tpu", {}))
    return manifest(scaling={"tpu": tpu, **scaling})


def test_num_workers_derived_from_tpu() -> None:
    assert parse_trainjob(tpu_scaling()).spec.scaling.num_workers == 4
    assert parse_trainjob(tpu_scaling(numWorkers=0)).spec.scaling.num_workers == 4
    assert parse_trainjob(tpu_scaling(numWorkers=4)).spec.scaling.num_workers == 4
    multislice = parse_trainjob(tpu_scaling(tpu={"numSlices": 2}))
    assert multislice.spec.scaling.num_workers == 8
    single_host = parse_trainjob(tpu_scaling(tpu={"topology": "2x4", "numSlices": 3}))
    assert single_host.spec.scaling.num_workers == 3


def test_num_workers_mismatch() -> None:
    err = only_error(tpu_scaling(numWorkers=3))
    assert err.path == "spec.scaling.numWorkers"
    assert "numWorkers is 3" in err.message and "= 4" in err.message
    assert err.hint is not None and "numWorkers: 4" in err.hint
    err = only_error(tpu_scaling(numWorkers=4, tpu={"numSlices": 2}))
    assert err.path == "spec.scaling.numWorkers" and "= 8" in err.message


def test_bad_topology_error() -> None:
    err = only_error(tpu_scaling(tpu={"topology": "3x3"}))
    assert err.path == "spec.scaling.tpu.topology"
    for topology in ("1x1", "2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16"):
        assert topology in err.message
    err = only_error(tpu_scaling(tpu={"topology": "4x2"}))
    assert err.hint is not None and "2x4" in err.hint
    err = only_error(tpu_scaling(tpu={"acceleratorType": "v5p", "topology": "4x4"}))
    assert err.path == "spec.scaling.tpu.topology"
    assert "2x2x1" in err.message and err.hint is not None and "3 dimensions" in err.hint


def test_bad_accelerator_type() -> None:
    err = only_error(tpu_scaling(tpu={"acceleratorType": "v5litepod"}))
    assert err.path == "spec.scaling.tpu.acceleratorType"
    assert "'v6e', 'v5e', 'v5p' or 'v4'" in err.message
    assert err.hint == "write 'v5e'"


def test_tpu_and_gpu_rejected() -> None:
    err = only_error(tpu_scaling(useGpu=True))
    assert err.path == "spec.scaling.useGpu"
    assert "mutually exclusive" in err.message


def test_tpu_resource_must_match_chips_per_host() -> None:
    ok = parse_trainjob(tpu_scaling(resourcesPerWorker={"google.com/tpu": 4}))
    assert ok.spec.scaling.resources_per_worker["google.com/tpu"] == 4
    err = only_error(tpu_scaling(resourcesPerWorker={"google.com/tpu": "8"}))
    assert err.path == 'spec.scaling.resourcesPerWorker["google.com/tpu"]'
    err = only_error(tpu_scaling(resourcesPerWorker={"google.com/tpu": "four"}))
    assert err.path == 'spec.scaling.resourcesPerWorker["google.com/tpu"]'
    assert "quantity" in err.message


def test_num_slices_minimum() -> None:
    err = only_error(tpu_scaling(tpu={"numSlices": 0}))
    assert err.path == "spec.scaling.tpu.numSlices"


def test_tpu_config_normalizes_topology() -> None:
    assert TpuConfig(accelerator_type="v6e", topology="4 X 4").topology == "4x4"


# --------------------------------------------------------------------------- field rules


@pytest.mark.parametrize(
    ("value", "hint_part"),
    [
        ("train.py", "module"),
        ("examples/quickstart/train.py:train_func", "'examples.quickstart.train:train_func'"),
        ("pkg.mod.train", "'pkg.mod:train'"),
        ("pkg.mod:", "package.module"),
        ("1pkg:f", "package.module"),
        ("pkg mod:f", "package.module"),
    ],
)
def test_bad_entrypoint(value: str, hint_part: str) -> None:
    err = only_error(manifest(entrypoint=value))
    assert err.path == "spec.entrypoint"
    assert "'package.module:function'" in err.message
    assert hint_part in f"{err.message} {err.hint}"


def test_validation_entrypoint_checked() -> None:
    err = only_error(manifest(validation={"entrypoint": "nope"}))
    assert err.path == "spec.validation.entrypoint"


def test_split_entrypoint() -> None:
    assert split_entrypoint("a.b.c:Klass.method") == ("a.b.c", "Klass.method")
    with pytest.raises(ValueError, match=r"package\.module:function"):
        split_entrypoint("a.b")


@pytest.mark.parametrize("quantity", ["500m", "2", 2, 0, "4Gi", "1.5", ".5", "1e3", "100M", "+1"])
def test_good_quantities(quantity: object) -> None:
    job = parse_trainjob(manifest(scaling={"resourcesPerWorker": {"memory": quantity}}))
    assert job.spec.scaling.resources_per_worker["memory"] == quantity


@pytest.mark.parametrize("quantity", [0, "0", "0.0001", "1n"])
def test_worker_cpu_below_one_milli_cpu_is_refused(quantity: object) -> None:
    """Ray cannot reserve less than 1m CPU: a zero CPU bundle is an empty one, which Ray refuses."""
    err = only_error(manifest(scaling={"resourcesPerWorker": {"cpu": quantity}}))
    assert err.path == 'spec.scaling.resourcesPerWorker["cpu"]'
    assert err.message.startswith("cpu must be at least 1m (0.001 CPU)")
    assert err.hint is not None and "omit cpu" in err.hint


@pytest.mark.parametrize(
    ("quantity", "hint_part"),
    [
        (0.5, "'500m'"),
        ("4GB", "'4Gi'"),
        ("-1", None),
        (-1, None),
        (True, "quantity"),
        ("abc", "quantity"),
        ("1 Gi", "quantity"),
        ("4gi", "quantity"),
        ([1], "quantity"),
    ],
)
def test_bad_quantities(quantity: object, hint_part: str | None) -> None:
    err = only_error(manifest(scaling={"resourcesPerWorker": {"memory": quantity}}))
    assert err.path == "spec.scaling.resourcesPerWorker.memory"
    if hint_part is None:
        assert "negative" in err.message
    else:
        assert err.hint is not None and hint_part in err.hint


def test_bad_resource_name() -> None:
    err = only_error(manifest(scaling={"resourcesPerWorker": {"bad name!": "1"}}))
    assert err.path.startswith("spec.scaling.resourcesPerWorker")
    assert "resource name" in err.message


def test_quantities_in_pool_and_head() -> None:
    err = only_error(manifest(ray={"head": {"resources": {"cpu": "lots"}}}))
    assert err.path == "spec.ray.head.resources.cpu"
    doc = manifest(validation={"entrypoint": "m:v", "pool": {"resources": {"memory": "1TB"}}})
    assert only_error(doc).path == "spec.validation.pool.resources.memory"


@pytest.mark.parametrize(
    "path",
    [
        "gs://my-bucket/runs/a",
        "gs://my-bucket",
        "s3://my.bucket-1/runs/a",
        "s3://my-bucket",
        "/tmp/trainjob-runs",
        "/mnt/ckpt/x",
    ],
)
def test_good_storage_paths(path: str) -> None:
    spec = parse_trainjob(manifest(storage={"path": path})).spec
    assert spec.storage is not None and spec.storage.path == path


@pytest.mark.parametrize(
    ("path", "message_part", "hint_part"),
    [
        ("hdfs://namenode/x", "'hdfs://' is not supported", "s3://bucket/prefix"),
        ("https://example.com/x", "'https://' is not supported", "gs://bucket/prefix"),
        ("file:///tmp/x", "'file://' is not supported", "'/tmp/x'"),
        ("runs/local", "absolute path", "/tmp/trainjob-runs"),
        ("~/runs", "absolute path", "absolute path"),
        ("gs://Bad_Bucket/x", "GCS bucket", "lowercase"),
        ("s3://under_score/x", "S3 bucket", "3-63 lowercase"),
        ("s3://bucket/a/../b", "'..' folder: S3", "write s3://bucket/a/b"),
    ],
)
def test_bad_storage_paths(path: str, message_part: str, hint_part: str) -> None:
    err = only_error(manifest(storage={"path": path}))
    assert err.path == "spec.storage.path"
    assert message_part in err.message
    assert err.hint is not None and hint_part in err.hint


def test_failure_limits() -> None:
    spec = parse_trainjob(manifest(failure={"maxFailures": -1})).spec
    assert spec.failure.max_failures == -1
    assert only_error(manifest(failure={"maxFailures": -2})).path == "spec.failure.maxFailures"
    assert only_error(manifest(failure={"maxRestarts": -1})).path == "spec.failure.maxRestarts"


def test_checkpoint_enums() -> None:
    err = only_error(manifest(checkpoint={"uploadMode": "lazy"}))
    assert err.path == "spec.checkpoint.uploadMode"
    assert "'async', 'sync' or 'none'" in err.message
    assert only_error(manifest(checkpoint={"numToKeep": 0})).path == "spec.checkpoint.numToKeep"
    assert (
        only_error(manifest(checkpoint={"scoreOrder": "up"})).path == "spec.checkpoint.scoreOrder"
    )


def test_framework_enum() -> None:
    err = only_error(manifest(framework="tensorflow"))
    assert err.path == "spec.framework" and "'torch' or 'jax'" in err.message


def test_pool_min_above_max() -> None:
    doc = manifest(validation={"entrypoint": "m:v", "pool": {"minReplicas": 2, "maxReplicas": 1}})
    err = only_error(doc)
    assert err.path == "spec.validation.pool.minReplicas"


def test_env_rules() -> None:
    env = [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]
    assert only_error(manifest(env=env)).path == "spec.env[1].name"
    err = only_error(manifest(env=[{"name": "X", "value": 1}]))
    assert err.path == "spec.env[0].value"
    assert err.hint == "quote the value in YAML: '1'"
    assert only_error(manifest(env=[{"name": "1X"}])).path == "spec.env[0].name"
    both = [{"name": "X", "value": "v", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]
    assert only_error(manifest(env=both)).path == "spec.env[0].valueFrom"
    ok = parse_trainjob(manifest(env=[{"name": "T", "valueFrom": {"fieldRef": {}}}]))
    assert ok.spec.env[0].value_from == {"fieldRef": {}}


def test_free_form_fields_keep_anything() -> None:
    pod = {"spec": {"tolerations": [{"key": "k", "operator": "Exists"}], "anything": {"x": 1}}}
    job = parse_trainjob(manifest(config={"nested": {"a": [1, None]}}, podTemplate=pod))
    assert job.spec.pod_template == pod
    assert job.spec.config == {"nested": {"a": [1, None]}}


@pytest.mark.parametrize("name", ["Job", "my_job", "-job", "job-", "1job", "a" * 41])
def test_bad_names(name: str) -> None:
    doc = manifest()
    doc["metadata"]["name"] = name
    assert only_error(doc).path == "metadata.name"


def test_metadata_keeps_server_fields() -> None:
    doc = manifest()
    doc["metadata"].update(
        {"namespace": "ns", "uid": "u", "generation": 3, "managedFields": [{"manager": "kubectl"}]}
    )
    job = parse_trainjob(doc)
    assert job.metadata.generation == 3
    assert job.to_dict()["metadata"]["managedFields"] == [{"manager": "kubectl"}]


# --------------------------------------------------------------------------- unknown fields, types


def test_unknown_field_top_level_spec() -> None:
    err = only_error(manifest(framwork="torch"))
    assert err.path == "spec.framwork"
    assert err.message == "unknown field 'framwork'"
    assert err.hint is not None and "did you mean 'framework'?" in err.hint
    assert "ttlSecondsAfterFinished" in err.hint


def test_unknown_field_nested_uses_camel_case() -> None:
    err = only_error(tpu_scaling(tpu={"chips": 4}))
    assert err.path == "spec.scaling.tpu.chips"
    assert err.hint is not None and "acceleratorType" in err.hint and "numSlices" in err.hint
    err = only_error(manifest(scaling={"numWorkers": 1, "resourcesPerWorker": {"cpu": "x"}}))
    assert err.path == "spec.scaling.resourcesPerWorker.cpu"
    # Models validated by Python name (code, not manifests) get camelCase paths too.
    with pytest.raises(ValidationError) as info:
        ScalingConfig.model_validate({"num_workers": 1, "resources_per_worker": {"cpu": "x"}})
    [err] = field_errors(info.value, ScalingConfig, prefix="spec.scaling")
    assert err.path == "spec.scaling.resourcesPerWorker.cpu"


def test_unknown_top_level_field() -> None:
    doc = manifest()
    doc["spce"] = {}
    err = only_error(doc)
    assert err.path == "spce" and "did you mean 'spec'?" in (err.hint or "")


def test_wrong_types() -> None:
    err = only_error(manifest(scaling=[1]))
    assert err.path == "spec.scaling" and err.message == "expected a mapping, got a list"
    err = only_error(manifest(scaling={"numWorkers": "two"}))
    assert err.path == "spec.scaling.numWorkers" and "integer" in err.message
    err = only_error(manifest(ray={"version": 2.6}))
    assert err.path == "spec.ray.version" and err.hint == "quote the value in YAML: '2.6'"
    err = only_error(manifest(env={"A": "1"}))
    assert err.path == "spec.env" and err.message == "expected a list, got a mapping"
    err = only_error(manifest(suspend="maybe"))
    assert err.path == "spec.suspend" and err.hint == "use true or false"


def test_missing_fields() -> None:
    doc = manifest()
    del doc["spec"]["entrypoint"]
    del doc["apiVersion"]
    paths = {e.path: e for e in errors_of(doc)}
    assert paths["spec.entrypoint"].message == "required field is missing"
    assert paths["apiVersion"].hint == "add apiVersion: trainjob.dev/v1alpha1"


def test_wrong_api_version_and_kind() -> None:
    doc = manifest()
    doc["apiVersion"] = "trainjob.dev/v1"
    doc["kind"] = "Job"
    paths = {e.path: e for e in errors_of(doc)}
    assert set(paths) == {"apiVersion", "kind"}
    assert paths["apiVersion"].hint == "use apiVersion: trainjob.dev/v1alpha1"


def test_field_errors_for_other_models() -> None:
    with pytest.raises(ValidationError) as info:
        TrainJobSpec.model_validate({"entrypoint": "a:b", "scaling": {"use_gpu": "x"}})
    [err] = field_errors(info.value, TrainJobSpec, prefix="spec")
    assert err.path == "spec.scaling.useGpu"
    assert err.format().startswith("spec.scaling.useGpu: ")


def test_field_error_format() -> None:
    assert FieldError("a.b", "bad", "fix").format() == "a.b: bad (hint: fix)"
    assert FieldError("a.b", "bad").format() == "a.b: bad"
    assert FieldError("", "bad").format() == "bad"


# --------------------------------------------------------------------------- status


def test_status_model() -> None:
    status = {
        "phase": "Running",
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "WorkersReady",
                "message": "4/4 workers ready",
                "lastTransitionTime": "2024-05-01T10:00:00Z",
                "observedGeneration": 2,
            }
        ],
        "observedGeneration": 2,
        "startTime": "2024-05-01T09:59:00Z",
        "restarts": 1,
        "workers": {"ready": 4, "desired": 4},
        "validationPool": {"replicas": 1},
        "progress": {"step": 10, "metrics": {"loss": 0.5}, "updatedAt": "2024-05-01T10:01:00Z"},
        "latestCheckpoint": {"path": "gs://b/ckpt-10", "step": 10, "metrics": {"loss": 0.5}},
        "bestCheckpoint": {"path": "gs://b/ckpt-8", "step": 8, "metrics": {}, "score": 0.4},
        "validations": {"pending": 1, "running": 0, "done": 3, "failed": 1},
        "message": "training",
    }
    doc = manifest()
    doc["status"] = status
    job = parse_trainjob(doc)
    assert job.status is not None
    assert job.status.phase is Phase.RUNNING and not job.status.phase.finished
    ready = job.status.condition("Ready")
    assert ready is not None and ready.observed_generation == 2
    assert job.status.condition("Missing") is None
    assert job.status.best_checkpoint is not None and job.status.best_checkpoint.score == 0.4
    dumped = job.status.to_dict()
    assert dumped["conditions"][0]["lastTransitionTime"] == "2024-05-01T10:00:00Z"
    assert dumped["bestCheckpoint"]["score"] == 0.4
    assert TrainJobStatus.model_validate(dumped) == job.status


def test_status_rejections() -> None:
    doc = manifest()
    doc["status"] = {"phase": "Done"}
    err = only_error(doc)
    assert err.path == "status.phase" and "'Succeeded'" in err.message
    doc["status"] = {
        "conditions": [
            {
                "type": "Ready",
                "status": "Yes",
                "reason": "R",
                "lastTransitionTime": "2024-01-01T00:00:00Z",
            }
        ]
    }
    assert only_error(doc).path == "status.conditions[0].status"
    assert [p.value for p in Phase] == [
        "Pending",
        "Starting",
        "Running",
        "Restarting",
        "Suspended",
        "Succeeded",
        "Failed",
    ]


# --------------------------------------------------------------------------- YAML loading


GOOD_DOC = """\
apiVersion: trainjob.dev/v1alpha1
kind: TrainJob
metadata:
  name: {name}
spec:
  entrypoint: pkg.mod:train
"""


def test_load_multi_document(tmp_path: Path) -> None:
    text = GOOD_DOC.format(name="a") + "---\n# only a comment\n---\n" + GOOD_DOC.format(name="b")
    path = tmp_path / "jobs.yaml"
    path.write_text(text)
    assert [j.name for j in load_trainjobs(path)] == ["a", "b"]
    assert [j.name for j in load_trainjobs(str(path))] == ["a", "b"]
    assert [j.name for j in load_trainjobs(text)] == ["a", "b"]
    docs = load_documents(text)
    assert [d.index for d in docs] == [0, 2]
    assert all(d.ok for d in docs) and docs[0].label == "TrainJob/a"


def test_load_reports_every_bad_document() -> None:
    bad = GOOD_DOC.format(name="b").replace("pkg.mod:train", "nope")
    docs = load_documents(GOOD_DOC.format(name="a") + "---\n" + bad + "---\n- 1\n")
    assert [d.ok for d in docs] == [True, False, False]
    assert docs[1].errors[0].path == "spec.entrypoint"
    assert docs[2].errors[0].message == "a TrainJob document must be a mapping, got a list"
    with pytest.raises(ManifestError) as info:
        load_trainjobs(GOOD_DOC.format(name="a") + "---\n" + bad)
    [err] = info.value.errors
    assert err.path == "#2 spec.entrypoint"
    assert "#2 spec.entrypoint" in str(info.value)


def test_yaml_syntax_error_has_line_and_column() -> None:
    text = "apiVersion: trainjob.dev/v1alpha1\nspec:\n  a: 1\n   b: 2\n"
    [doc] = load_documents(text)
    [err] = doc.errors
    assert err.path == "line 4, column 5"
    assert err.message.startswith("YAML syntax error: ")
    assert doc.trainjob is None and not doc.ok


def test_yaml_duplicate_key_rejected() -> None:
    text = GOOD_DOC.format(name="a") + "  entrypoint: other.mod:train\n"
    [doc] = load_documents(text)
    [err] = doc.errors
    assert err.path == "line 7, column 3"
    assert "duplicate key 'entrypoint'" in err.message


def test_yaml_tab_hint() -> None:
    [doc] = load_documents("spec:\n\tentrypoint: a:b\n")
    [err] = doc.errors
    assert err.path.startswith("line 2")
    assert err.hint is not None and "tabs" in err.hint


def test_empty_stream() -> None:
    assert load_documents("# nothing\n") == []
    with pytest.raises(ManifestError, match="no TrainJob document"):
        load_trainjobs("# nothing\n")


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        load_documents(tmp_path / "missing.yaml")
    with pytest.raises(FileNotFoundError):
        load_trainjobs(str(tmp_path / "missing.yaml"))


def test_parse_trainjob_accepts_read_only_mappings() -> None:
    from types import MappingProxyType

    doc = manifest(scaling={"numWorkers": 2})
    doc["spec"] = MappingProxyType({**doc["spec"], "scaling": MappingProxyType({"numWorkers": 2})})
    assert parse_trainjob(MappingProxyType(doc)).spec.scaling.num_workers == 2


def test_parse_trainjob_rejects_non_mapping() -> None:
    with pytest.raises(ManifestError, match="must be a mapping"):
        parse_trainjob([1])  # type: ignore[arg-type]


# --------------------------------------------------------------------------- spec.data


def test_data_defaults_to_one_pool_pod_and_splitting_every_dataset() -> None:
    job = parse_trainjob(manifest(data={"datasets": "pkg.data:datasets"}))
    assert job.spec.data is not None
    assert job.spec.data.datasets_to_split is None  # all
    assert job.spec.data.pool.replicas == 1 and job.spec.data.pool.cpus_per_pod() == 1
    assert parse_trainjob(manifest()).spec.data is None


@pytest.mark.parametrize(
    ("data", "path", "words"),
    [
        ({}, "spec.data.datasets", "required"),
        ({"datasets": "pkg.data"}, "spec.data.datasets", "module:function"),
        (
            {"datasets": "a:b", "datasetsToSplit": ["train", "train"]},
            "spec.data.datasetsToSplit[1]",
            "named twice",
        ),
        ({"datasets": "a:b", "datasetsToSplit": ["a b"]}, "spec.data.datasetsToSplit[0]", ""),
        ({"datasets": "a:b", "pool": {"replicas": 0}}, "spec.data.pool.replicas", ""),
    ],
)
def test_data_errors_name_the_field(data: dict[str, Any], path: str, words: str) -> None:
    err = only_error(manifest(data=data))
    assert err.path == path
    assert words in err.format()


# --------------------------------------------------------------------------- elastic


def test_elastic_min_workers_and_min_slices() -> None:
    scaling = parse_trainjob(manifest(scaling={"numWorkers": 4, "minWorkers": 2})).spec.scaling
    assert scaling.elastic_min_workers == 2 and scaling.num_workers == 4
    assert (
        parse_trainjob(manifest(scaling={"numWorkers": 4})).spec.scaling.elastic_min_workers is None
    )
    # TPUs grow and shrink by whole slices: 4x4 v6e is 4 hosts a slice.
    tpu = parse_trainjob(tpu_scaling(tpu={"numSlices": 3, "minSlices": 1})).spec.scaling
    assert tpu.num_workers == 12 and tpu.elastic_min_workers == 4


@pytest.mark.parametrize(
    ("doc", "path", "message_part", "hint_part"),
    [
        (
            manifest(scaling={"numWorkers": 2, "minWorkers": 3}),
            "spec.scaling.minWorkers",
            "minWorkers is 3 but numWorkers is 2",
            "at most 2",
        ),
        (
            manifest(scaling={"numWorkers": 0, "minWorkers": 1}),
            "spec.scaling.minWorkers",
            "local mode",
            "numWorkers",
        ),
        (
            manifest(scaling={"numWorkers": 2, "minWorkers": 0}),
            "spec.scaling.minWorkers",
            "greater than or equal to 1",
            None,
        ),
        (
            tpu_scaling(minWorkers=4),
            "spec.scaling.minWorkers",
            "whole slices",
            "tpu.minSlices",
        ),
        (
            tpu_scaling(tpu={"numSlices": 2, "minSlices": 3}),
            "spec.scaling.tpu.minSlices",
            "minSlices is 3 but numSlices is 2",
            "at most 2",
        ),
        (
            manifest(scaling={"numWorkers": 2, "elasticResizeIntervalSeconds": 5}),
            "spec.scaling.elasticResizeIntervalSeconds",
            "elastic jobs only",
            "minWorkers",
        ),
    ],
)
def test_elastic_settings_that_cannot_work_name_the_field(
    doc: dict[str, Any], path: str, message_part: str, hint_part: str | None
) -> None:
    err = only_error(doc)
    assert err.path == path
    assert message_part in err.message
    if hint_part is not None:
        assert err.hint is not None and hint_part in err.hint
