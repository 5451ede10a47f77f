"""Test support for trainjob-operator: a real kube-apiserver + etcd, envtest style
(:mod:`tests.support.envtest`). Also a real single-node cluster
(:mod:`tests.support.node`) and GKE-like node pools for kube-scheduler
(:mod:`tests.support.scheduler`), imported from their modules.

Used by the cluster tests (``tests/k8s``, ``tests/chart``, ``tests/cluster``) and by
``benchmarks/bench_operator.py``; it is not part of the installed package or the images.
"""

from tests.support.envtest import (
    ADMIN_USER,
    DEFAULT_USERS,
    EnvTest,
    EnvTestError,
    User,
    default_cache_dir,
    ensure_assets,
    find_assets,
    raise_if_provisioning_failed,
)

__all__ = [
    "ADMIN_USER",
    "DEFAULT_USERS",
    "EnvTest",
    "EnvTestError",
    "User",
    "default_cache_dir",
    "ensure_assets",
    "find_assets",
    "raise_if_provisioning_failed",
]
