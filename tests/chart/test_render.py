"""The Helm chart, offline: ``helm lint`` and ``helm template`` through the Helm v4 SDK
(``helm_python``), the objects it renders, and what values.schema.json rejects."""

from __future__ import annotations

import json
from typing import Any

import helm_python as helm
import pytest
import yaml

from tests.chart.helpers import (
    CHART_DIR,
    CRD_OBSERVER_RULE,
    NAMESPACE_OBSERVER_RULE,
    OPERATOR_RULES,
    all_of,
    chart,
    container,
    kinds,
    notes,
    one,
    render,
)
from trainjob_operator.api.crd import CRD_FILENAME, render_crd_yaml
from trainjob_operator.cli import build_parser

#: Non-default values: two watched namespaces, a ServiceMonitor, a custom image, debug logs.
CUSTOM: dict[str, Any] = {
    "watchNamespaces": ["team-a", "team-b"],
    "serviceMonitor": {"enabled": True, "interval": "15s", "labels": {"release": "prom"}},
    "image": {"repository": "registry.example.com/ml/trainjob-operator", "tag": "1.2.3"},
    "logLevel": "debug",
    "imagePullSecrets": [{"name": "regcred"}],
    "nodeSelector": {"kubernetes.io/os": "linux"},
    "tolerations": [{"key": "ops", "operator": "Exists", "effect": "NoSchedule"}],
    "resources": {"requests": {"cpu": "200m", "memory": "300Mi"}, "limits": {"memory": "1Gi"}},
    "defaults": {
        "tpu": {"nodeSelector": {"cloud.google.com/gke-nodepool": "tpu-v6e"}, "tolerations": []},
        "validationPool": {
            "nodeSelector": {"pool": "validation"},
            "tolerations": [{"key": "validation", "operator": "Exists"}],
        },
        "driver": {"resources": {"cpu": "250m", "memory": "1Gi"}},
    },
}


# --------------------------------------------------------------------------- chart and lint


def test_chart_metadata() -> None:
    meta = chart().metadata
    assert meta["apiVersion"] == "v2"
    assert meta["name"] == "trainjob-operator"
    assert meta["appVersion"] == "0.1.0"
    assert chart().schema is not None


@pytest.mark.parametrize("values", [None, CUSTOM], ids=["defaults", "custom"])
def test_lint_passes(values: dict[str, Any] | None) -> None:
    report = helm.lint(CHART_DIR, values, strict=True, namespace="ops", kube_version="v1.20.2")
    assert report["errors"] == []
    problems = [m for m in report["messages"] if m["severity"] >= 2]  # warnings and errors
    assert problems == []


def test_lint_reports_values_the_schema_rejects() -> None:
    report = helm.lint(CHART_DIR, {"replicaCount": -1}, strict=True)
    assert any("/replicaCount" in e for e in report["errors"])


def test_chart_crd_is_the_generated_crd() -> None:
    """The chart ships exactly the CRD the models generate (``crds/`` drift is tested in
    tests/api/test_crd.py, which covers the chart copy whenever the chart folder exists)."""
    [crd] = chart().crds
    assert crd["filename"].endswith(f"crds/{CRD_FILENAME}")
    assert crd["data"] == render_crd_yaml()
    assert (CHART_DIR / "crds" / CRD_FILENAME).read_text(encoding="utf-8") == render_crd_yaml()


# --------------------------------------------------------------------------- default values


def test_default_objects() -> None:
    objects = render()
    assert kinds(objects) == [
        ("ClusterRole", "tjo-trainjob-operator", None),
        ("ClusterRole", "tjo-trainjob-operator-edit", None),
        ("ClusterRole", "tjo-trainjob-operator-view", None),
        ("ClusterRoleBinding", "tjo-trainjob-operator", None),
        ("ConfigMap", "tjo-trainjob-operator-defaults", "ops"),
        ("Deployment", "tjo-trainjob-operator", "ops"),
        ("PodDisruptionBudget", "tjo-trainjob-operator", "ops"),
        ("Role", "tjo-trainjob-operator-leader-election", "ops"),
        ("RoleBinding", "tjo-trainjob-operator-leader-election", "ops"),
        ("Secret", "tjo-trainjob-operator-webhook-tls", "ops"),
        ("Service", "tjo-trainjob-operator-metrics", "ops"),
        ("Service", "tjo-trainjob-operator-webhook", "ops"),
        ("ServiceAccount", "tjo-trainjob-operator", "ops"),
        ("ValidatingWebhookConfiguration", "tjo-trainjob-operator", None),
    ]
    for obj in objects:
        labels = obj["metadata"]["labels"]
        assert labels["app.kubernetes.io/name"] == "trainjob-operator"
        assert labels["app.kubernetes.io/instance"] == "tjo"
        assert labels["app.kubernetes.io/managed-by"] == "Helm"
        assert labels["helm.sh/chart"] == "trainjob-operator-0.1.0"
        assert labels["app.kubernetes.io/version"] == "0.1.0"


def test_release_name_containing_the_chart_name_is_the_full_name() -> None:
    objects = render(name="trainjob-operator")
    assert one(objects, "Deployment")["metadata"]["name"] == "trainjob-operator"
    objects = render({"fullnameOverride": "tj"})
    assert one(objects, "Deployment")["metadata"]["name"] == "tj"


def test_deployment() -> None:
    objects = render()
    deployment = one(objects, "Deployment")
    spec = deployment["spec"]
    assert spec["replicas"] == 2  # leader election: one leads, one on standby
    assert spec["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 1},
    }
    selector = spec["selector"]["matchLabels"]
    assert selector == {
        "app.kubernetes.io/name": "trainjob-operator",
        "app.kubernetes.io/instance": "tjo",
    }
    pod = spec["template"]
    assert selector.items() <= pod["metadata"]["labels"].items()
    assert pod["spec"]["serviceAccountName"] == "tjo-trainjob-operator"
    assert pod["spec"]["automountServiceAccountToken"] is True
    assert pod["spec"]["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 1000,
        "runAsGroup": 1000,
        "fsGroup": 1000,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    main = container(objects)
    assert main["image"] == "trainjob-operator:0.1.0"
    assert main["imagePullPolicy"] == "IfNotPresent"
    assert main["command"] == ["trainjob", "operator"]
    assert main["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 1000,
        "runAsGroup": 1000,
        "readOnlyRootFilesystem": True,
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert main["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert main["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}
    assert main["args"][:4] == [
        "--leader-elect",
        "--lease-name=trainjob-operator",
        "--health-port=8080",
        "--metrics-port=9090",
    ]
    ports = {p["name"]: p["containerPort"] for p in main["ports"]}
    assert ports == {"health": 8080, "metrics": 9090, "webhook": 9443}
    assert main["resources"] == {
        "requests": {"cpu": "100m", "memory": "256Mi"},
        "limits": {"memory": "512Mi"},
    }
    # The only writable path: an emptyDir on /tmp (HOME and TMPDIR point there); the webhook's
    # certificate is mounted read-only (tests/chart/test_webhook.py).
    assert main["volumeMounts"] == [
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "webhook-cert", "mountPath": "/etc/trainjob-operator/webhook", "readOnly": True},
    ]
    volume, cert = pod["spec"]["volumes"]
    assert volume["name"] == "tmp" and "emptyDir" in volume
    assert cert["name"] == "webhook-cert" and "secret" in cert
    env = {e["name"]: e.get("value") for e in main["env"]}
    assert env["HOME"] == "/tmp" and env["TMPDIR"] == "/tmp"
    assert main["envFrom"] == [{"configMapRef": {"name": "tjo-trainjob-operator-defaults"}}]
    for key in ("nodeSelector", "tolerations", "affinity", "imagePullSecrets"):
        assert key not in pod["spec"]


def _parsed_args(objects: list[dict[str, Any]]) -> Any:
    """The container's command line, parsed by the real ``trainjob`` CLI parser."""
    main = container(objects)
    return build_parser().parse_args([*main["command"][1:], *main["args"]])


def test_command_line_is_what_the_cli_accepts() -> None:
    args = _parsed_args(render())
    assert args.command == "operator"
    assert args.namespace is None  # all namespaces
    assert args.liveness == "http://0.0.0.0:8080/healthz"
    assert args.metrics_port == 9090
    assert args.verbose is False


def test_cluster_wide_rbac() -> None:
    objects = render()
    role = one(objects, "ClusterRole", "tjo-trainjob-operator")
    assert role["rules"] == [*OPERATOR_RULES, CRD_OBSERVER_RULE]
    binding = one(objects, "ClusterRoleBinding")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": "tjo-trainjob-operator",
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "tjo-trainjob-operator", "namespace": "ops"}
    ]
    # The only Role: the leader-election Lease's, in the release namespace.
    assert [r["metadata"]["name"] for r in all_of(objects, "Role")] == [LEADER_ELECTION]
    assert [b["metadata"]["name"] for b in all_of(objects, "RoleBinding")] == [LEADER_ELECTION]


def test_no_rule_grants_wildcards_secret_reads_or_escalation() -> None:
    for values in (None, CUSTOM, {**CUSTOM, "rbac": {"clusterScanning": False}}):
        for obj in render(values):
            for rule in obj.get("rules", []):
                assert "*" not in [*rule["verbs"], *rule["resources"], *rule["apiGroups"]]
                # Secrets: create only (each job's Ray token); never read.
                if "secrets" in rule["resources"]:
                    assert rule["resources"] == ["secrets"] and rule["verbs"] == ["create"]
                assert not ({"pods"} & set(rule["resources"]) and "patch" in rule["verbs"])
                assert not {"escalate", "bind", "impersonate"} & set(rule["verbs"])
                if rule["resources"] == ["leases"] and "update" in rule["verbs"]:
                    assert rule["resourceNames"] == ["trainjob-operator"]  # its own Lease only
                elif not obj["metadata"]["name"].endswith("-edit"):  # the users' role
                    assert "update" not in rule["verbs"]


def test_metrics_service() -> None:
    objects = render()
    service = one(objects, "Service", "tjo-trainjob-operator-metrics")
    assert service["spec"]["type"] == "ClusterIP"
    assert (
        service["spec"]["selector"] == one(objects, "Deployment")["spec"]["selector"]["matchLabels"]
    )
    assert service["spec"]["ports"] == [
        {"name": "metrics", "port": 9090, "targetPort": "metrics", "protocol": "TCP"}
    ]
    assert all_of(objects, "ServiceMonitor") == []


def test_aggregated_user_roles() -> None:
    objects = render()
    edit = one(objects, "ClusterRole", "tjo-trainjob-operator-edit")
    assert edit["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-edit"] == "true"
    assert edit["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-admin"] == "true"
    assert edit["rules"] == [
        {
            "apiGroups": ["trainjob.dev"],
            "resources": ["trainjobs"],
            "verbs": [
                *("get", "list", "watch", "create", "update", "patch", "delete"),
                "deletecollection",
            ],
        }
    ]
    view = one(objects, "ClusterRole", "tjo-trainjob-operator-view")
    assert view["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
    assert view["rules"] == [
        {
            "apiGroups": ["trainjob.dev"],
            "resources": ["trainjobs", "trainjobs/status"],
            "verbs": ["get", "list", "watch"],
        }
    ]
    off = render({"rbac": {"aggregateToDefaultRoles": False}})
    assert [o["metadata"]["name"] for o in all_of(off, "ClusterRole")] == ["tjo-trainjob-operator"]


def test_defaults_configmap_is_passed_as_env() -> None:
    configmap = one(render(), "ConfigMap")
    assert configmap["data"] == {
        "TRAINJOB_DEFAULT_TPU_NODE_SELECTOR": "{}",
        "TRAINJOB_DEFAULT_TPU_TOLERATIONS": "[]",
        "TRAINJOB_DEFAULT_VALIDATION_NODE_SELECTOR": "{}",
        "TRAINJOB_DEFAULT_VALIDATION_TOLERATIONS": "[]",
        "TRAINJOB_DEFAULT_HEAD_RESOURCES": "{}",
        "TRAINJOB_DEFAULT_DRIVER_RESOURCES": "{}",
        "TRAINJOB_ALLOWED_VOLUME_TYPES": json.dumps(
            [
                *("configMap", "secret", "emptyDir", "persistentVolumeClaim"),
                *("projected", "downwardAPI", "csi", "ephemeral"),
            ],
            separators=(",", ":"),
        ),
        "TRAINJOB_READ_ONLY_ROOT_FILESYSTEM": "true",
        "TRAINJOB_MAX_PODS_PER_JOB": "2000",
    }
    custom = render(CUSTOM)
    data = one(custom, "ConfigMap")["data"]
    assert json.loads(data["TRAINJOB_DEFAULT_TPU_NODE_SELECTOR"]) == {
        "cloud.google.com/gke-nodepool": "tpu-v6e"
    }
    assert json.loads(data["TRAINJOB_DEFAULT_VALIDATION_TOLERATIONS"]) == [
        {"key": "validation", "operator": "Exists"}
    ]

    def checksum(objects: list[dict[str, Any]]) -> str:
        annotations = one(objects, "Deployment")["spec"]["template"]["metadata"]["annotations"]
        return str(annotations["checksum/defaults"])

    assert checksum(custom) != checksum(render())  # a change of defaults restarts the operator


def test_the_operator_applies_the_charts_pod_defaults() -> None:
    # The defaults ConfigMap, as the operator's env (envFrom), into the pods it renders.
    from tests.render.helpers import UID, make_job, tpu_job
    from trainjob_operator.render import (
        RenderOptions,
        render_driver_pod,
        render_options_from_env,
        render_validation_pods,
        render_worker_pods,
    )

    assert render_options_from_env(one(render(), "ConfigMap")["data"]) == RenderOptions()
    options = render_options_from_env(one(render(CUSTOM), "ConfigMap")["data"])
    [worker, *_] = render_worker_pods(tpu_job("4x4"), uid=UID, options=options)
    assert worker["spec"]["nodeSelector"]["cloud.google.com/gke-nodepool"] == "tpu-v6e"
    job = make_job(validation={"entrypoint": "pkg.mod:validate"})
    [pod] = render_validation_pods(job, uid=UID, validation_replicas=1, options=options)
    assert pod["spec"]["nodeSelector"]["pool"] == "validation"
    assert {"key": "validation", "operator": "Exists"} in pod["spec"]["tolerations"]
    [driver] = render_driver_pod(make_job(), uid=UID, options=options)["spec"]["containers"]
    assert driver["resources"]["requests"] == {"cpu": "250m", "memory": "1Gi"}
    assert options.head_resources == RenderOptions().head_resources  # {}: the built-in one


def test_notes() -> None:
    text = notes()
    assert "all namespaces" in text
    assert "does not read them yet" not in text and "Pod defaults" not in text  # none set
    assert "kubectl apply --server-side -f crds/trainjob.dev_trainjobs.yaml" in text
    custom = notes(CUSTOM)
    assert "team-a, team-b" in custom and "ServiceMonitor tjo-trainjob-operator" in custom
    assert "Pod defaults (ConfigMap tjo-trainjob-operator-defaults" in custom
    assert "paused" in notes({"replicaCount": 0})


# --------------------------------------------------------------------------- non-default values


LEADER_ELECTION = "tjo-trainjob-operator-leader-election"


def _watched(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The Roles or RoleBindings of the watched namespaces (not the Lease's)."""
    return [o for o in objects if o["metadata"]["name"] != LEADER_ELECTION]


def test_namespaced_mode() -> None:
    objects = render(CUSTOM)
    roles = _watched(all_of(objects, "Role"))
    assert [(r["metadata"]["namespace"], r["metadata"]["name"]) for r in roles] == [
        ("team-a", "tjo-trainjob-operator"),
        ("team-b", "tjo-trainjob-operator"),
    ]
    for role in roles:
        assert role["rules"] == OPERATOR_RULES
    bindings = _watched(all_of(objects, "RoleBinding"))
    assert [b["metadata"]["namespace"] for b in bindings] == ["team-a", "team-b"]
    for binding in bindings:
        assert binding["roleRef"]["kind"] == "Role"
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "tjo-trainjob-operator", "namespace": "ops"}
        ]
    # Cluster-wide, the operator may only read namespaces and CRDs (kopf's observers); the
    # other ClusterRoles are the users' aggregated ones.
    assert sorted(o["metadata"]["name"] for o in all_of(objects, "ClusterRole")) == [
        "tjo-trainjob-operator-edit",
        "tjo-trainjob-operator-scanning",
        "tjo-trainjob-operator-view",
    ]
    scanning = one(objects, "ClusterRole", "tjo-trainjob-operator-scanning")
    assert scanning["rules"] == [NAMESPACE_OBSERVER_RULE, CRD_OBSERVER_RULE]
    [binding] = all_of(objects, "ClusterRoleBinding")
    assert binding["metadata"]["name"] == "tjo-trainjob-operator-scanning"
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": "tjo-trainjob-operator-scanning",
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "tjo-trainjob-operator", "namespace": "ops"}
    ]
    args = _parsed_args(objects)
    assert args.namespace == ["team-a", "team-b"]
    assert args.verbose is True


def test_namespaced_mode_without_cluster_scanning() -> None:
    objects = render({**CUSTOM, "rbac": {"clusterScanning": False}})
    # No cluster-scoped rights for the operator at all (only the users' aggregated roles).
    assert [o["metadata"]["name"] for o in all_of(objects, "ClusterRole")] == [
        "tjo-trainjob-operator-edit",
        "tjo-trainjob-operator-view",
    ]
    assert all_of(objects, "ClusterRoleBinding") == []
    assert len(_watched(all_of(objects, "Role"))) == 2
    # Cluster-wide mode never renders the scanning role (kopf needs no namespace access there).
    cluster = render({"rbac": {"clusterScanning": True}})
    assert all(o["metadata"]["name"] != "tjo-trainjob-operator-scanning" for o in cluster)


def test_custom_image_and_pod_settings() -> None:
    objects = render(CUSTOM)
    main = container(objects)
    assert main["image"] == "registry.example.com/ml/trainjob-operator:1.2.3"
    assert main["resources"] == CUSTOM["resources"]
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert pod["tolerations"] == CUSTOM["tolerations"]
    assert one(objects, "Deployment")["spec"]["strategy"]["type"] == "RollingUpdate"


def test_service_monitor() -> None:
    objects = render(CUSTOM)
    monitor = one(objects, "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "prom"
    service = one(objects, "Service", "tjo-trainjob-operator-metrics")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= (
        service["metadata"]["labels"].items()
    )
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["ops"]}
    assert monitor["spec"]["endpoints"] == [
        {"port": "metrics", "path": "/metrics", "interval": "15s", "scrapeTimeout": "10s"}
    ]


def test_without_rbac_and_with_an_existing_service_account() -> None:
    objects = render({"rbac": {"create": False}, "serviceAccount": {"create": False, "name": "x"}})
    assert kinds(objects) == [
        ("ConfigMap", "tjo-trainjob-operator-defaults", "ops"),
        ("Deployment", "tjo-trainjob-operator", "ops"),
        ("PodDisruptionBudget", "tjo-trainjob-operator", "ops"),
        ("Secret", "tjo-trainjob-operator-webhook-tls", "ops"),
        ("Service", "tjo-trainjob-operator-metrics", "ops"),
        ("Service", "tjo-trainjob-operator-webhook", "ops"),
        ("ValidatingWebhookConfiguration", "tjo-trainjob-operator", None),
    ]
    assert one(objects, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == "x"


def test_replicas_zero_pauses() -> None:
    assert one(render({"replicaCount": 0}), "Deployment")["spec"]["replicas"] == 0


def test_leader_election_rbac_and_disruption_budget() -> None:
    objects = render({"replicaCount": 3})
    role = one(objects, "Role")
    assert role["metadata"]["namespace"] == "ops"
    assert role["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": ["trainjob-operator"],
            "verbs": ["get", "update"],
        },
    ]
    binding = one(objects, "RoleBinding")
    assert binding["subjects"][0]["name"] == "tjo-trainjob-operator"
    pdb = one(objects, "PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"] == {
        "app.kubernetes.io/name": "trainjob-operator",
        "app.kubernetes.io/instance": "tjo",
    }
    assert one(objects, "Deployment")["spec"]["replicas"] == 3
    # A single replica gets no budget (it would block every drain).
    assert not [o for o in render({"replicaCount": 1}) if o["kind"] == "PodDisruptionBudget"]


def test_without_leader_election_one_replica_recreated() -> None:
    objects = render({"replicaCount": 1, "leaderElection": {"enabled": False}})
    deployment = one(objects, "Deployment")
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    main = container(objects)
    assert main["args"][0] == "--liveness=http://0.0.0.0:8080/healthz"
    assert "readinessProbe" not in main
    assert not [o for o in objects if o["kind"] in ("PodDisruptionBudget", "Role")]
    with pytest.raises(Exception, match=r"needs leaderElection\.enabled"):
        render({"replicaCount": 2, "leaderElection": {"enabled": False}})


def test_extra_env_and_pod_metadata() -> None:
    objects = render(
        {
            "extraEnv": [{"name": "HTTPS_PROXY", "value": "http://proxy:3128"}],
            "podAnnotations": {"a": "b"},
            "podLabels": {"team": "ml"},
            "priorityClassName": "system-cluster-critical",
            "affinity": {"nodeAffinity": {}},
        }
    )
    template = one(objects, "Deployment")["spec"]["template"]
    assert {"name": "HTTPS_PROXY", "value": "http://proxy:3128"} in container(objects)["env"]
    assert template["metadata"]["annotations"]["a"] == "b"
    assert template["metadata"]["labels"]["team"] == "ml"
    assert template["spec"]["priorityClassName"] == "system-cluster-critical"
    assert template["spec"]["affinity"] == {"nodeAffinity": {}}


def test_values_yaml_is_the_chart_default() -> None:
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    assert chart().values == values
    chart().validate_schema(values)


# --------------------------------------------------------------------------- values.schema.json

BAD_VALUES: list[tuple[dict[str, Any], str]] = [
    ({"replicaCount": -1}, "/replicaCount"),
    ({"leaderElection": {"enabled": "yes"}}, "/leaderElection/enabled"),
    ({"podDisruptionBudget": {"minAvailable": -1}}, "/podDisruptionBudget/minAvailable"),
    ({"replicaCount": "1"}, "/replicaCount"),
    ({"watchNamespaces": "team-a"}, "/watchNamespaces"),
    ({"watchNamespaces": ["Team_A"]}, "/watchNamespaces/0"),
    ({"watchNamespaces": ["a", "a"]}, "/watchNamespaces"),
    ({"logLevel": "trace"}, "/logLevel"),
    ({"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
    ({"image": {"tag": 5}}, "/image/tag"),
    ({"image": {"registry": "x"}}, "/image"),
    ({"bogus": True}, "'bogus'"),
    ({"metrics": {"port": 0}}, "/metrics/port"),
    ({"liveness": {"port": "8080"}}, "/liveness/port"),
    ({"serviceMonitor": {"enabled": "yes"}}, "/serviceMonitor/enabled"),
    ({"serviceMonitor": {"interval": "often"}}, "/serviceMonitor/interval"),
    ({"resources": {"requests": {"cpu": "lots"}}}, "/resources/requests/cpu"),
    ({"resources": {"claims": []}}, "/resources"),
    ({"tolerations": [{"operator": "Sometimes"}]}, "/tolerations/0/operator"),
    ({"nodeSelector": {"a": 1}}, "/nodeSelector/a"),
    ({"defaults": {"tpu": {"nodeSelector": []}}}, "/defaults/tpu/nodeSelector"),
    ({"serviceAccount": {"create": False}}, "/serviceAccount/name"),
    ({"rbac": {"create": "true"}}, "/rbac/create"),
    ({"extraEnv": [{"value": "x"}]}, "/extraEnv/0"),
    ({"podSecurity": {"allowedVolumeTypes": "hostPath"}}, "/podSecurity/allowedVolumeTypes"),
    ({"podSecurity": {"readOnlyRootFilesystem": "no"}}, "/podSecurity/readOnlyRootFilesystem"),
    ({"limits": {"maxPodsPerTrainJob": 0}}, "/limits/maxPodsPerTrainJob"),
]


@pytest.mark.parametrize(
    ("values", "where"), BAD_VALUES, ids=[json.dumps(v) for v, _ in BAD_VALUES]
)
def test_schema_rejects(values: dict[str, Any], where: str) -> None:
    with pytest.raises(helm.HelmValuesError) as raised:
        render(values)
    assert where in str(raised.value)


@pytest.mark.parametrize(
    "values",
    [
        {"replicaCount": 0},
        {"watchNamespaces": ["a", "b-2"]},
        {"resources": {"requests": {"cpu": 0.5, "memory": "1Gi"}}},
        {"serviceAccount": {"create": False, "name": "existing"}},
        {"serviceAccount": {"create": True, "name": "custom"}},
        {"image": {"repository": "localhost:5000/tjo", "tag": "dev"}},
        {"serviceMonitor": {"interval": "1m30s"}},
        {"podSecurity": {"allowedVolumeTypes": ["secret", "nfs"], "readOnlyRootFilesystem": False}},
        {"limits": {"maxPodsPerTrainJob": 10000}},
    ],
    ids=json.dumps,
)
def test_schema_accepts(values: dict[str, Any]) -> None:
    assert render(values)
