"""Test helpers for trainjob-operator: a real kube-apiserver + etcd, envtest style.

See :mod:`trainjob_operator.testing.envtest`.
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

__all__ = [
    "ADMIN_USER",
    "DEFAULT_USERS",
    "EnvTest",
    "EnvTestError",
    "User",
    "default_cache_dir",
    "ensure_assets",
    "find_assets",
]
