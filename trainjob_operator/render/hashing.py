"""A rendered child's identity and spec hash.

The reconciler diffs observed and desired children by :func:`child_key` and recreates one whose
:data:`SPEC_HASH_ANNOTATION` differs from the freshly rendered one (:func:`finalize` stamps it).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from trainjob_operator.constants import SPEC_HASH_ANNOTATION
from trainjob_operator.render.names import check_dns_label

__all__ = ["child_key", "finalize", "spec_hash"]


def spec_hash(obj: Mapping[str, Any]) -> str:
    """A stable hash of a rendered object, ignoring its own :data:`SPEC_HASH_ANNOTATION`.

    Compare the annotation of an observed child with the one of the freshly rendered child;
    never hash an object read back from the API server (server-side defaulting changes it).
    """
    # Copy only the path to the annotation (a deep copy of every pod dominated rendering).
    body = dict(obj)
    meta = body.get("metadata")
    if isinstance(meta, dict) and isinstance(meta.get("annotations"), dict):
        annotations = {k: v for k, v in meta["annotations"].items() if k != SPEC_HASH_ANNOTATION}
        body["metadata"] = {**meta, "annotations": annotations}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def child_key(obj: Mapping[str, Any]) -> tuple[str, str]:
    """``(kind, metadata.name)``: the identity the reconciler diffs observed and desired by."""
    return str(obj["kind"]), str(obj["metadata"]["name"])


def finalize(obj: dict[str, Any]) -> dict[str, Any]:
    """Check the names of a rendered object and stamp its spec hash; returns ``obj``."""
    meta = obj["metadata"]
    check_dns_label(meta["name"], f"{obj['kind']} name")
    for key, value in meta.get("labels", {}).items():
        if len(value) > 63:
            raise ValueError(f"label {key}={value!r} of {meta['name']} exceeds 63 characters")
    spec = obj.get("spec")
    if obj["kind"] == "Pod" and isinstance(spec, dict):
        check_dns_label(spec["hostname"], "pod hostname")
        check_dns_label(spec["subdomain"], "pod subdomain")
    meta.setdefault("annotations", {})[SPEC_HASH_ANNOTATION] = spec_hash(obj)
    return obj
