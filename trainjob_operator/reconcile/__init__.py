"""Level-based reconciliation of a TrainJob: a pure state machine that plans, and a thin layer
that executes the plan.

One module per concern, in import order (``tests/test_import_graph.py`` checks it):

- ``transitions``: :data:`~.transitions.PHASE_TRANSITIONS`, every phase move allowed;
- ``plan``: the :class:`~.plan.Plan` and :class:`~.plan.Event` types (what one reconcile
  decided) and the status keys the operator owns;
- ``pods``: facts read off one pod (phase, readiness, labels, terminations, disruption);
- ``failure_rules``: ``spec.failure.rules`` turning a failed pod into a decision;
- ``validation_pool``: the validation pool's size from the driver's demand;
- ``state_machine``: one reconcile: the phase handlers and their steps
  (:func:`~.state_machine.plan_trainjob`);
- ``fingerprint``: what a TrainJob looks like to the operator's timer;
- ``apply``: read, plan, execute (:func:`~.apply.reconcile_trainjob`), returning an outcome.
"""
