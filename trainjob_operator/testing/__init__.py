"""Test helpers for trainjob-operator: a real kube-apiserver + etcd, envtest style
(:mod:`trainjob_operator.testing.envtest`), and a test kubelet that runs the Pods of a namespace
as local processes (:mod:`trainjob_operator.testing.pod_runner`).
"""

from trainjob_operator.testing.envtest import (
    ADMIN_USER,
    DEFAULT_USERS,
    EnvTest,
    EnvTestError,
    User,
    default_cache_dir,
    ensure_assets,
    find_assets,
)
from trainjob_operator.testing.pod_runner import PodRunner, namespaces_available

__all__ = [
    "ADMIN_USER",
    "DEFAULT_USERS",
    "EnvTest",
    "EnvTestError",
    "PodRunner",
    "User",
    "default_cache_dir",
    "ensure_assets",
    "find_assets",
    "namespaces_available",
]
