"""Which changes of a TrainJob its timer tick reacts to.

A timer tick reconciles a TrainJob when it changed since the operator last looked at it. The
``resourceVersion`` tells too much: every write changes it, the operator's own status write
and kopf's bookkeeping patch after each handler (its diff-base and progress annotations)
included, so each new TrainJob's first tick reconciled again for nothing. The fingerprint
covers what a reconcile reads of the TrainJob itself (its generation, labels, annotations
and status: the validation demand a driver publishes, an annotation someone set) and leaves
out kopf's annotations (under :data:`KOPF_ANNOTATION_PREFIX`, except the operator's own
:data:`~trainjob_operator.constants.LAST_DEMAND_ANNOTATION`, which planning reads) and the
status keys no plan reads (:data:`~trainjob_operator.reconcile.plan.UNPLANNED_STATUS_KEYS`:
the driver's progress and checkpoints, updated every few seconds while it trains).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Mapping
from typing import Any

from trainjob_operator.constants import GROUP, LAST_DEMAND_ANNOTATION
from trainjob_operator.reconcile.plan import UNPLANNED_STATUS_KEYS

__all__ = ["KOPF_ANNOTATION_PREFIX", "fingerprint_after_writes", "trainjob_fingerprint"]

#: kopf's progress and diff-base annotations on a TrainJob (``operator_main.configure``).
KOPF_ANNOTATION_PREFIX = f"{GROUP}/"
#: Annotations under that prefix that are the operator's and that planning reads.
_READ_ANNOTATIONS = frozenset({LAST_DEMAND_ANNOTATION})


def trainjob_fingerprint(
    body: Mapping[str, Any],
    leave_out_status: Collection[str] = (),
    leave_out_annotations: Collection[str] = (),
) -> str:
    """A digest of what a reconcile reads of TrainJob ``body`` (a watch event's or an API
    answer's object): equal digests, nothing for a reconcile to see. ``leave_out_status`` and
    ``leave_out_annotations``: status keys and annotations left out as well."""
    meta = body.get("metadata") or {}
    annotations = {
        key: value
        for key, value in (meta.get("annotations") or {}).items()
        if (not key.startswith(KOPF_ANNOTATION_PREFIX) or key in _READ_ANNOTATIONS)
        and key not in leave_out_annotations
    }
    status = {
        key: value
        for key, value in (body.get("status") or {}).items()
        if key not in leave_out_status and key not in UNPLANNED_STATUS_KEYS
    }
    content = [meta.get("generation"), meta.get("labels") or {}, annotations, status]
    text = json.dumps(content, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def fingerprint_after_writes(
    read: Mapping[str, Any],
    written: Mapping[str, Any],
    own_status_keys: Collection[str],
    own_annotations: Collection[str],
    status_defaults: Mapping[str, Any] | None = None,
) -> str:
    """The fingerprint a timer tick compares the TrainJob with after a reconcile that planned
    from ``read`` and whose last write answered ``written``.

    ``written``'s, when all it changed of ``read`` is the operator's own (its status keys,
    ``own_annotations``): its own writes are no reason for another reconcile. ``read``'s when
    something else changed in between (the driver's validation demand, a user's edit landed after
    the read and before the write, so this reconcile did not plan with it): the next tick then
    finds the TrainJob changed and reconciles, instead of waiting for the resync.

    ``status_defaults``: status keys that read the same absent and with this value. The API
    server adds the CRD's defaults (``workerFailures: 0``) to a TrainJob's first status
    write; without them every new TrainJob looked changed by someone else, and its first
    timer tick reconciled it again for nothing.
    """
    if written is read:
        return trainjob_fingerprint(read)
    defaults = status_defaults or {}
    before = trainjob_fingerprint(_with_defaults(read, defaults), own_status_keys, own_annotations)
    after = trainjob_fingerprint(
        _with_defaults(written, defaults), own_status_keys, own_annotations
    )
    return trainjob_fingerprint(written if before == after else read)


def _with_defaults(body: Mapping[str, Any], defaults: Mapping[str, Any]) -> Mapping[str, Any]:
    if not defaults:
        return body
    return {**body, "status": {**defaults, **(body.get("status") or {})}}
