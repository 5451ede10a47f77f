"""Every rendered pod meets the Kubernetes Pod Security Standard "restricted" profile, and
``spec.podTemplate`` cannot take a pod out of it (volume types, root group, control plane).

:func:`restricted_violations` is written from the Pod Security Standards page
(kubernetes.io/docs/concepts/security/pod-security-standards, "Baseline" and "Restricted"
policies), control by control; it is independent of the renderer's own code.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.render.helpers import UID, example, make_job, tpu_job
from trainjob_operator.api import TrainJob
from trainjob_operator.render import RenderOptions, render_children, validate_pod_template
from trainjob_operator.render.options import render_options_from_env

# Baseline: "Host Namespaces", "Privileged Containers", "Capabilities", "HostPath Volumes",
# "Host Ports", "AppArmor", "SELinux", "/proc Mount Type", "Seccomp", "Sysctls".
_SAFE_SYSCTLS = {
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
}
_SELINUX_TYPES = {
    None,
    "",
    "container_t",
    "container_init_t",
    "container_kvm_t",
    "container_engine_t",
}
# Restricted: "Volume Types".
_RESTRICTED_VOLUME_TYPES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}


def _containers(spec: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for field in ("containers", "initContainers", "ephemeralContainers"):
        for index, c in enumerate(spec.get(field) or []):
            yield f"spec.{field}[{index}]", c


def restricted_violations(pod: dict[str, Any]) -> list[str]:
    """What in ``pod`` breaks the "restricted" Pod Security Standard (empty: it complies)."""
    spec = pod["spec"]
    psc = spec.get("securityContext") or {}
    out: list[str] = []
    # -- baseline
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(key):
            out.append(f"spec.{key}")
    if (psc.get("windowsOptions") or {}).get("hostProcess"):
        out.append("spec.securityContext.windowsOptions.hostProcess")
    selinux = psc.get("seLinuxOptions") or {}
    if selinux.get("type") not in _SELINUX_TYPES or selinux.get("user") or selinux.get("role"):
        out.append("spec.securityContext.seLinuxOptions")
    for sysctl in psc.get("sysctls") or []:
        if sysctl.get("name") not in _SAFE_SYSCTLS:
            out.append(f"spec.securityContext.sysctls {sysctl.get('name')}")
    for index, volume in enumerate(spec.get("volumes") or []):
        types = set(volume) - {"name"}
        if "hostPath" in types:
            out.append(f"spec.volumes[{index}].hostPath")
        # -- restricted: volume types
        if not types <= _RESTRICTED_VOLUME_TYPES:
            out.append(f"spec.volumes[{index}] type {sorted(types)}")
    pod_seccomp = (psc.get("seccompProfile") or {}).get("type")
    if psc.get("runAsUser") == 0:
        out.append("spec.securityContext.runAsUser=0")
    for where, c in _containers(spec):
        sc = c.get("securityContext") or {}
        if sc.get("privileged"):
            out.append(f"{where}.securityContext.privileged")
        if (sc.get("windowsOptions") or {}).get("hostProcess"):
            out.append(f"{where}.securityContext.windowsOptions.hostProcess")
        for port in c.get("ports") or []:
            if port.get("hostPort"):
                out.append(f"{where}.ports hostPort")
        if sc.get("procMount") not in (None, "Default"):
            out.append(f"{where}.securityContext.procMount")
        c_selinux = sc.get("seLinuxOptions") or {}
        if (
            c_selinux.get("type") not in _SELINUX_TYPES
            or c_selinux.get("user")
            or c_selinux.get("role")
        ):
            out.append(f"{where}.securityContext.seLinuxOptions")
        # -- restricted
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"{where}.securityContext.allowPrivilegeEscalation must be false")
        non_root = sc.get("runAsNonRoot", psc.get("runAsNonRoot"))
        if non_root is not True:
            out.append(f"{where}: runAsNonRoot must be true (pod or container)")
        if sc.get("runAsUser") == 0:
            out.append(f"{where}.securityContext.runAsUser=0")
        seccomp = (sc.get("seccompProfile") or {}).get("type", pod_seccomp)
        if seccomp not in ("RuntimeDefault", "Localhost"):
            out.append(f"{where}: seccompProfile must be RuntimeDefault or Localhost")
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            out.append(f"{where}.securityContext.capabilities.drop must hold ALL")
        if set(caps.get("add") or []) - {"NET_BIND_SERVICE"}:
            out.append(f"{where}.securityContext.capabilities.add")
    return out


CASES: dict[str, Callable[[], TrainJob]] = {
    "cpu-quickstart": lambda: example("quickstart.yaml"),
    "jax": lambda: example("jax.yaml"),
    "tpu-single-host": lambda: tpu_job("2x4"),
    "tpu-multislice": lambda: tpu_job("4x4", num_slices=2, queueName="q"),
    "gpu": lambda: make_job(
        name="gpu",
        scaling={"numWorkers": 2, "useGpu": True},
        validation={"entrypoint": "pkg.mod:validate", "pool": {"maxReplicas": 2}},
    ),
    "local-mode": lambda: make_job(name="local", scaling={"numWorkers": 0}),
    "with-pod-template": lambda: make_job(
        name="tmpl",
        podTemplate={
            "volumes": [
                {"name": "data", "persistentVolumeClaim": {"claimName": "data"}},
                {"name": "cfg", "configMap": {"name": "cfg"}},
            ],
            "volumeMounts": [{"name": "data", "mountPath": "/data"}],
            "securityContext": {"runAsUser": 2000, "runAsGroup": 2000, "fsGroup": 2000},
        },
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_every_rendered_pod_meets_the_restricted_profile(case: str) -> None:
    job = CASES[case]()
    replicas = job.spec.validation.pool.max_replicas if job.spec.validation else 0
    pods = [
        c for c in render_children(job, uid=UID, validation_replicas=replicas) if c["kind"] == "Pod"
    ]
    roles = {p["metadata"]["labels"]["trainjob.dev/role"] for p in pods}
    assert {"head", "driver"} <= roles
    for pod in pods:
        assert restricted_violations(pod) == [], pod["metadata"]["name"]
        for _, c in _containers(pod["spec"]):
            assert c["securityContext"]["readOnlyRootFilesystem"] is True
            # Ray's session folder is writable: /tmp is an emptyDir.
            assert {"name": "tmp", "mountPath": "/tmp"} in c["volumeMounts"]


def test_the_checker_catches_what_the_profile_forbids() -> None:
    [pod] = [c for c in render_children(make_job(), uid=UID) if c["metadata"]["name"] == "job-head"]
    assert restricted_violations(pod) == []
    bad = {
        "hostNetwork": True,
        "volumes": [{"name": "root", "hostPath": {"path": "/"}}],
        "containers": [
            {
                "name": "c",
                "ports": [{"containerPort": 1, "hostPort": 1}],
                "securityContext": {
                    "privileged": True,
                    "capabilities": {"add": ["SYS_ADMIN"]},
                    "seccompProfile": {"type": "Unconfined"},
                },
            }
        ],
    }
    found = restricted_violations({"spec": bad})
    for expected in ("hostNetwork", "hostPath", "privileged", "hostPort", "capabilities.add"):
        assert any(expected in v for v in found), (expected, found)
    assert any("runAsNonRoot" in v for v in found)
    assert any("seccompProfile" in v for v in found)
    assert any("allowPrivilegeEscalation" in v for v in found)


def test_read_only_root_filesystem_can_be_turned_off_by_the_admin() -> None:
    options = render_options_from_env({"TRAINJOB_READ_ONLY_ROOT_FILESYSTEM": "false"})
    for pod in render_children(make_job(), uid=UID, options=options):
        if pod["kind"] == "Pod":
            assert "readOnlyRootFilesystem" not in pod["spec"]["containers"][0]["securityContext"]
            assert restricted_violations(pod) == []
    with pytest.raises(ValueError, match="TRAINJOB_READ_ONLY_ROOT_FILESYSTEM: expected true"):
        render_options_from_env({"TRAINJOB_READ_ONLY_ROOT_FILESYSTEM": "yes"})


# --------------------------------------------------------------------------- podTemplate


@pytest.mark.parametrize(
    ("template", "message"),
    [
        (
            {"volumes": [{"name": "root", "hostPath": {"path": "/"}}]},
            r"spec.podTemplate.volumes\[0\].hostPath: this volume type is not allowed; allowed: "
            r"configMap, csi, downwardAPI, emptyDir, ephemeral, persistentVolumeClaim, "
            r"projected, secret \(hint: .*podSecurity.allowedVolumeTypes\)",
        ),
        (
            {
                "volumes": [
                    {"name": "sock", "hostPath": {"path": "/run/containerd/containerd.sock"}}
                ]
            },
            r"volumes\[0\].hostPath: this volume type is not allowed",
        ),
        ({"volumes": [{"name": "n", "nfs": {"server": "x", "path": "/"}}]}, r"\[0\].nfs"),
        (
            {"volumes": [{"name": "two", "emptyDir": {}, "secret": {"secretName": "s"}}]},
            r"volumes\[0\]: a volume has exactly one type besides its name, got emptyDir, secret",
        ),
        ({"volumes": [{"name": "x"}]}, r"exactly one type besides its name, got none"),
        ({"volumes": [{"name": "tmp", "emptyDir": {}}]}, r"'tmp' is the operator's /tmp volume"),
        (
            {
                "volumes": [{"name": "t", "emptyDir": {}}],
                "volumeMounts": [{"name": "t", "mountPath": "/tmp/"}],
            },
            r"volumeMounts\[0\].mountPath: /tmp/ is mounted by the operator",
        ),
        (
            {"securityContext": {"runAsGroup": 0}},
            r"securityContext.runAsGroup: pods must not use the root group \(gid 0\)",
        ),
        ({"securityContext": {"fsGroup": 0}}, r"securityContext.fsGroup: .*root group"),
        (
            {"securityContext": {"supplementalGroups": [1000, 0]}},
            r"securityContext.supplementalGroups: pods must not join the root group",
        ),
        (
            {"nodeSelector": {"node-role.kubernetes.io/control-plane": ""}},
            r"nodeSelector\['node-role.kubernetes.io/control-plane'\]: .*control-plane",
        ),
        (
            {"nodeSelector": {"node-role.kubernetes.io/master": ""}},
            r"nodeSelector\['node-role.kubernetes.io/master'\]",
        ),
        (
            {
                "tolerations": [
                    {"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}
                ]
            },
            r"tolerations\[0\].key: .*control-plane taint",
        ),
        (
            {"tolerations": [{"key": "node-role.kubernetes.io/master", "effect": "NoSchedule"}]},
            r"tolerations\[0\].key",
        ),
        (
            {"tolerations": [{"operator": "Exists"}]},
            r"tolerations\[0\]: a toleration without a key .* tolerates every taint",
        ),
        (
            {
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [
                                {
                                    "matchExpressions": [
                                        {
                                            "key": "node-role.kubernetes.io/control-plane",
                                            "operator": "Exists",
                                        }
                                    ]
                                }
                            ]
                        }
                    }
                }
            },
            r"affinity.nodeAffinity: an expression selects control-plane nodes",
        ),
        (
            {
                "affinity": {
                    "nodeAffinity": {
                        "preferredDuringSchedulingIgnoredDuringExecution": [
                            {
                                "weight": 1,
                                "preference": {
                                    "matchExpressions": [
                                        {
                                            "key": "node-role.kubernetes.io/master",
                                            "operator": "In",
                                            "values": [""],
                                        }
                                    ]
                                },
                            }
                        ]
                    }
                }
            },
            r"control-plane nodes \(node-role.kubernetes.io/master In\)",
        ),
        # Kept from before: root, privileged, host namespaces, another ServiceAccount.
        ({"securityContext": {"runAsUser": 0}}, r"runAsUser: pods must not run as root"),
        ({"securityContext": {"privileged": True}}, r"securityContext.privileged: not accepted"),
        ({"hostNetwork": True}, r"spec.podTemplate.hostNetwork: unknown key"),
        ({"serviceAccountName": "admin"}, r"serviceAccountName: unknown key"),
    ],
)
def test_pod_template_escalations_are_refused(template: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        validate_pod_template(template)
    with pytest.raises(ValueError, match=message):
        render_children(make_job(podTemplate=template), uid=UID)


def test_keeping_away_from_the_control_plane_is_accepted() -> None:
    validate_pod_template(
        {
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {
                                        "key": "node-role.kubernetes.io/control-plane",
                                        "operator": "DoesNotExist",
                                    }
                                ]
                            }
                        ]
                    }
                }
            },
        }
    )


def test_the_admin_widens_the_volume_allow_list() -> None:
    template = {"volumes": [{"name": "nfs", "nfs": {"server": "fs", "path": "/export"}}]}
    options = render_options_from_env({"TRAINJOB_ALLOWED_VOLUME_TYPES": '["nfs", "secret"]'})
    assert options.allowed_volume_types == frozenset({"nfs", "secret"})
    children = render_children(make_job(podTemplate=template), uid=UID, options=options)
    head = next(c for c in children if c["metadata"]["name"] == "job-head")
    assert template["volumes"][0] in head["spec"]["volumes"]
    # The narrowed list now refuses what the default allows.
    with pytest.raises(ValueError, match=r"configMap: this volume type is not allowed"):
        render_children(
            make_job(podTemplate={"volumes": [{"name": "c", "configMap": {"name": "c"}}]}),
            uid=UID,
            options=RenderOptions(allowed_volume_types=frozenset({"secret"})),
        )
    with pytest.raises(ValueError, match="TRAINJOB_ALLOWED_VOLUME_TYPES: expected a JSON list"):
        render_options_from_env({"TRAINJOB_ALLOWED_VOLUME_TYPES": '"nfs"'})
