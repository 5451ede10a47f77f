"""Level-based reconciliation of a TrainJob: a pure state machine that plans (``plan``) and a
thin layer that executes the plan (``apply``)."""
