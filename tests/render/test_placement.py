"""Placement: a role's scheduling constraints merged with ``spec.podTemplate``."""

from __future__ import annotations

import pytest

from tests.render.helpers import UID, make_job
from trainjob_operator.render import build_context
from trainjob_operator.render.placement import Placement
from trainjob_operator.render.pod_template import PodTemplateOverrides

TEAM = {"key": "team", "operator": "Exists", "effect": "NoSchedule"}
SPOT = {"key": "spot", "operator": "Exists", "effect": "NoSchedule"}


def test_node_selector_precedence_and_the_operators_keys() -> None:
    placement = Placement(
        node_selector={"accel": "tpu"},
        user_node_selector={"zone": "b"},
        default_node_selector={"zone": "a", "pool": "default", "accel": "ignored"},
    )
    template = PodTemplateOverrides(node_selector={"pool": "mine", "zone": "c"})
    assert placement.node_selector_for(template) == {"zone": "b", "pool": "mine", "accel": "tpu"}
    with pytest.raises(ValueError, match=r"spec.podTemplate.nodeSelector\['accel'\]"):
        placement.node_selector_for(PodTemplateOverrides(node_selector={"accel": "gpu"}))


def test_tolerations_the_trainjobs_win_over_defaults_with_the_same_key_and_effect() -> None:
    placement = Placement(tolerations=(SPOT,), default_tolerations=({**TEAM, "value": "x"}, SPOT))
    template = PodTemplateOverrides(tolerations=[TEAM])
    assert placement.tolerations_for(template) == [SPOT, TEAM]
    assert placement.tolerations_for(PodTemplateOverrides()) == [SPOT, {**TEAM, "value": "x"}]


def test_affinity_terms_of_the_pod_template_are_appended() -> None:
    term = {"topologyKey": "pool"}
    placement = Placement(affinity={"podAffinity": {"required": [term]}})
    template = PodTemplateOverrides(
        affinity={"podAffinity": {"required": [{"topologyKey": "zone"}]}, "nodeAffinity": {}}
    )
    assert placement.affinity_for(template) == {
        "podAffinity": {"required": [term, {"topologyKey": "zone"}]},
        "nodeAffinity": {},
    }
    assert placement.affinity is not None and placement.affinity["podAffinity"]["required"] == [
        term
    ]  # not changed


def test_the_context_computes_each_roles_placement_once() -> None:
    job = make_job(scaling={"numWorkers": 2, "useGpu": True, "resourcesPerWorker": {"cpu": "2"}})
    ctx = build_context(job, uid=UID)
    assert ctx.worker_placement is ctx.worker_placement
    assert ctx.worker_placement.resources == {"cpu": "2", "nvidia.com/gpu": 1}
    assert ctx.driver_placement.resources == {"cpu": "1", "memory": "2Gi"}
    with pytest.raises(ValueError, match=r"spec\.validation is not set"):
        _ = ctx.validation_placement
